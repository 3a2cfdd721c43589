"""Parameter initialisers with SINGA's names (``singa.initializer``); each fills a tensor in place.

    w = tensor.Tensor((256, 128))
    initializer.he_uniform(w)          # U(-limit, limit), limit = sqrt(6 / fan_in)

Fans follow the usual convention (Keras', which SINGA adopted): a 2-D weight is (fan_in, fan_out); a 3-D to
5-D convolution kernel is (out_channels, in_channels, *kernel) with ``channels_first`` (fan_in = in_channels *
kernel size, fan_out = out_channels * kernel size); any other shape uses sqrt(size) for both.

The variance-scaling family draws from N(0, scale / n) or U(-sqrt(3 scale / n), sqrt(3 scale / n)), where
n is fan_in, fan_out or their mean:

=================  =====  ========  ============
function           scale  n         distribution
=================  =====  ========  ============
``he_normal``      2      fan_in    normal
``he_uniform``     2      fan_in    uniform
``lecun_normal``   1      fan_in    normal
``lecun_uniform``  1      fan_in    uniform
``glorot_normal``  1      fan_avg   normal
``glorot_uniform`` 1      fan_avg   uniform
=================  =====  ========  ============

Difference from SINGA, on purpose: ``eye`` and ``orthogonal`` accept 2-D tensors and refuse others (SINGA's
check is inverted, so they refuse the matrices they are meant for). ``gaussian``, ``xavier``, ``glorot`` and
``msra`` are SINGA's deprecated forms and warn with ``DeprecationWarning`` as SINGA's do.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from .tensor import Tensor

__all__ = ["eye", "orthogonal", "he_normal", "he_uniform", "lecun_normal", "lecun_uniform", "glorot_normal",
           "glorot_uniform", "gaussian", "xavier", "glorot", "msra"]


def _check(t, what: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"initializer.{what}: expected a singa_lite Tensor to fill, got {type(t).__name__}")
    if not t.dtype.is_floating:
        raise TypeError(f"initializer.{what}: the tensor is {t.dtype.name}; random values need a floating "
                        f"dtype (create it with dtype=tensor.float32 or convert it with to_type)")


def _compute_fans(shape, data_format: str = "channels_first") -> tuple:
    """(fan_in, fan_out) of a weight of `shape` (see the module doc)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) in (3, 4, 5):
        if data_format == "channels_first":  # (out, in, *kernel)
            field = int(np.prod(shape[2:]))
            return shape[1] * field, shape[0] * field
        if data_format == "channels_last":  # (*kernel, in, out)
            field = int(np.prod(shape[:-2]))
            return shape[-2] * field, shape[-1] * field
        raise ValueError(f"data_format must be 'channels_first' or 'channels_last', got {data_format!r}")
    side = math.sqrt(float(np.prod(shape))) if shape else 1.0
    return side, side


def _random_fill(t: Tensor, scale: float, mode: str, distribution: str, what: str) -> Tensor:
    """Fills t from N(0, scale / n) or the uniform law of the same variance (n chosen by `mode`)."""
    _check(t, what)
    if scale <= 0:
        raise ValueError(f"initializer.{what}: scale must be > 0, got {scale}")
    fan_in, fan_out = _compute_fans(t.shape)
    n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
    variance = scale / max(1.0, float(n))  # a weight with no inputs keeps the unscaled variance
    if distribution == "normal":
        t.gaussian(0.0, math.sqrt(variance))
    else:
        limit = math.sqrt(3.0 * variance)  # U(-a, a) has variance a^2 / 3
        t.uniform(-limit, limit)
    return t


def he_normal(t: Tensor) -> Tensor:
    """N(0, 2 / fan_in) (He et al. 2015, for ReLU networks)."""
    return _random_fill(t, 2.0, "fan_in", "normal", "he_normal")


def he_uniform(t: Tensor) -> Tensor:
    """U(-sqrt(6 / fan_in), sqrt(6 / fan_in)) (He et al. 2015)."""
    return _random_fill(t, 2.0, "fan_in", "uniform", "he_uniform")


def lecun_normal(t: Tensor) -> Tensor:
    """N(0, 1 / fan_in) (LeCun et al. 1998)."""
    return _random_fill(t, 1.0, "fan_in", "normal", "lecun_normal")


def lecun_uniform(t: Tensor) -> Tensor:
    """U(-sqrt(3 / fan_in), sqrt(3 / fan_in)) (LeCun et al. 1998)."""
    return _random_fill(t, 1.0, "fan_in", "uniform", "lecun_uniform")


def glorot_normal(t: Tensor) -> Tensor:
    """N(0, 2 / (fan_in + fan_out)) (Glorot and Bengio 2010, "Xavier")."""
    return _random_fill(t, 1.0, "fan_avg", "normal", "glorot_normal")


def glorot_uniform(t: Tensor) -> Tensor:
    """U(-sqrt(6 / (fan_in + fan_out)), +sqrt(...)) (Glorot and Bengio 2010, "Xavier")."""
    return _random_fill(t, 1.0, "fan_avg", "uniform", "glorot_uniform")


def _matrix(t, what: str, at_least: bool = False) -> None:
    _check(t, what)
    if t.ndim() < 2 if at_least else t.ndim() != 2:
        raise ValueError(f"initializer.{what}: expected a {'2-D or higher' if at_least else '2-D'} tensor, "
                         f"got shape {t.shape}")


def eye(t: Tensor) -> Tensor:
    """Ones on the diagonal, zeros elsewhere (any 2-D shape)."""
    _matrix(t, "eye")
    t.copy_from_numpy(np.eye(t.shape[0], t.shape[1]))
    return t


def orthogonal(t: Tensor, gain: float = 1.0) -> Tensor:
    """A random matrix with orthonormal rows or columns (whichever the shape allows), times `gain`
    (Saxe et al. 2014). Computed with numpy's SVD of a Gaussian matrix, on the host."""
    _matrix(t, "orthogonal")
    a = np.random.standard_normal(t.shape)
    u, _, vt = np.linalg.svd(a, full_matrices=False)
    q = u if u.shape == t.shape else vt  # u is (rows, k), vt is (k, cols), k = min(rows, cols)
    t.copy_from_numpy(gain * q)
    return t


# ----- SINGA's deprecated initialisers
def _deprecated(name: str, instead: str) -> None:
    warnings.warn(f"initializer.{name} is deprecated (as in SINGA); use initializer.{instead}",
                  DeprecationWarning, stacklevel=3)


def gaussian(t: Tensor, fan_in: int = 0, fan_out: int = 0) -> Tensor:
    """N(0, std) with std = sqrt(2 * k / (fan_in + fan_out)), k = 2 when both fans are given, else 1."""
    _deprecated("gaussian", "he_normal or glorot_normal")
    _check(t, "gaussian")
    if fan_in <= 0 and fan_out <= 0:
        raise ValueError("initializer.gaussian: give fan_in or fan_out (> 0)")
    k = 2 if fan_in * fan_out != 0 else 1
    t.gaussian(0.0, math.sqrt(2.0 * k / (fan_in + fan_out)))
    return t


def xavier(t: Tensor) -> Tensor:
    """U(-a, a), a = sqrt(6 / (shape[0] + shape[1]))."""
    _deprecated("xavier", "glorot_uniform")
    _matrix(t, "xavier", at_least=True)
    a = math.sqrt(6.0 / (t.shape[0] + t.shape[1]))
    t.uniform(-a, a)
    return t


def glorot(t: Tensor) -> Tensor:
    """N(0, std), std = sqrt(2 / (shape[0] + shape[1]))."""
    _deprecated("glorot", "glorot_normal")
    _matrix(t, "glorot", at_least=True)
    t.gaussian(0.0, math.sqrt(2.0 / (t.shape[0] + t.shape[1])))
    return t


def msra(t: Tensor) -> Tensor:
    """N(0, std), std = sqrt(2 / shape[0])."""
    _deprecated("msra", "he_normal")
    _check(t, "msra")
    if t.ndim() == 0:
        raise ValueError("initializer.msra: expected a tensor with at least one dimension, got a 0-d one")
    t.gaussian(0.0, math.sqrt(2.0 / t.shape[0]))
    return t
