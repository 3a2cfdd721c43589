"""comm/averaging.py, the one place of the "divide before summing" rule of op="avg" (issue 30): which dtypes it
divides first, and that its one implementation gives the same bits as each of the three it replaced (mpi's
_prescale_avg, tcp's _prescale, hierarchical's div_scalar) for every world size up to 256."""
import numpy as np
import pytest

from singa_lite import _core, tensor
from singa_lite.comm import averaging
from singa_lite.comm._arrays import array, bf16_to_f32, f32_to_bf16

WORLD_SIZES = list(range(1, 17)) + [24, 31, 64, 100, 127, 255, 256]


def values(dtype, n=4099, seed=0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal(n) * 1000, [65504, -65504, 40000, 1e-7, 6e-8, 0.0, -0.0, np.inf,
                                                         -np.inf, np.nan]]).astype(np.float32)
    t = tensor.from_numpy(x).as_type(dtype)
    return t.data


def bits(t) -> bytes:
    return array(t).tobytes()


def test_the_rule():
    assert averaging.DIVIDED_BEFORE_SUMMING == (tensor.float16, tensor.bfloat16)
    for dtype in (tensor.float16, tensor.bfloat16):
        assert averaging.divides_before_summing(dtype)
    for dtype in (tensor.float32, tensor.float64, tensor.int32, tensor.int64):
        assert not averaging.divides_before_summing(dtype)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_float16_before_sum_is_the_old_three(n):
    t = values(tensor.float16)
    want_numpy = (np.asarray(t).astype(np.float32) / n).astype(np.float16)  # mpi's and tcp's former code
    want_core = _core.div_scalar(t, float(n))  # hierarchical's former code
    got = t.clone()
    averaging.before_sum(got, n)
    assert bits(got) == want_numpy.tobytes() == bits(want_core)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_bfloat16_before_sum_is_the_old_three(n):
    t = values(tensor.bfloat16)
    want_numpy = f32_to_bf16(bf16_to_f32(array(t)) / n)  # tcp's former code
    want_core = _core.div_scalar(t, float(n))  # mpi's and hierarchical's former code
    got = t.clone()
    averaging.before_sum(got, n)
    assert bits(got) == want_numpy.tobytes() == bits(want_core)


@pytest.mark.parametrize("dtype", [tensor.float32, tensor.float64])
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_after_sum_of_the_other_floats_is_the_old_three(dtype, n):
    t = values(dtype)
    want_numpy = np.asarray(t).copy()
    want_numpy /= n  # mpi's and tcp's former code
    want_core = _core.div_scalar(t, float(n))  # hierarchical's former code
    got = t.clone()
    averaging.before_sum(got, n)  # nothing for these dtypes
    assert bits(got) == bits(t)
    averaging.after_sum(got, n)
    assert bits(got) == want_numpy.tobytes() == bits(want_core)


def test_each_step_leaves_the_other_dtypes_alone():
    half = values(tensor.float16)
    before = bits(half)
    averaging.after_sum(half, 3)
    assert bits(half) == before
    ints = tensor.from_numpy(np.arange(10, dtype=np.int64)).data
    averaging.before_sum(ints, 3)
    averaging.after_sum(ints, 3)
    assert np.asarray(ints).tolist() == list(range(10))


def test_numpy_views_need_their_dtype_and_the_mean_does_not_overflow():
    a = np.full(5, 40000, np.float16)  # the sum of two ranks' values overflows float16, the mean does not
    with pytest.raises(TypeError, match="dtype="):
        averaging.before_sum(a, 2)
    averaging.before_sum(a, 2, tensor.float16)
    assert (a + a == 40000).all()
