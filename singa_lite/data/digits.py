"""The offline default dataset: scikit-learn's bundled handwritten digits (1797 real 8x8 scans, shipped
inside the scikit-learn package, so nothing is downloaded), made MNIST-shaped.

    (train_x, train_y), (test_x, test_y) = load_digits(seed=0)
    # train_x: float32 (1437, 1, 28, 28) in [0, 1]; train_y: int32 (1437,); test: 360 samples
"""
from __future__ import annotations

import numpy as np


def resize_bilinear(images: np.ndarray, size: int) -> np.ndarray:
    """(N, h, w) -> (N, size, size), bilinear with aligned corners."""
    n, h, w = images.shape
    ys, xs = np.linspace(0, h - 1, size), np.linspace(0, w - 1, size)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (ys - y0)[None, :, None], (xs - x0)[None, None, :]
    top = images[:, y0][:, :, x0] * (1 - wx) + images[:, y0][:, :, x1] * wx
    bottom = images[:, y1][:, :, x0] * (1 - wx) + images[:, y1][:, :, x1] * wx
    return top * (1 - wy) + bottom * wy


def load_digits(seed: int = 0):
    """``((train_x, train_y), (test_x, test_y))``: each 8x8 scan (values 0..16) scaled to [0, 1], resized
    to a 20x20 digit centred in a 28x28 frame (as MNIST digits are), float32 NCHW ``(N, 1, 28, 28)``;
    labels int32 0..9. A permutation drawn from ``numpy.random.default_rng(seed)`` splits the 1797 samples
    80/20 into 1437 train and 360 test. Raises ImportError when scikit-learn is not installed."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError as e:
        raise ImportError("the offline default dataset (scikit-learn's bundled digits) needs scikit-learn: "
                          "pip install scikit-learn") from e
    d = sk_digits()
    # 8x8 scans -> 20x20 digit centred in a 28x28 frame, as MNIST digits are.
    x = np.pad(resize_bilinear(d.images / 16.0, 20), ((0, 0), (4, 4), (4, 4))).astype(np.float32)[:, None]
    y = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])
