"""im2col / col2im and 2-D pooling against direct numpy loops (and torch when it is installed)."""
import numpy as np
import pytest

from singa_lite import _core
from core_testutil import np_pool, out_size

T = _core.Tensor.from_buffer

CONV_CASES = [  # N, C, H, W, kernel, stride, padding, dilation
    (2, 3, 7, 9, (3, 2), (2, 1), (1, 0), (1, 2)),
    (3, 4, 12, 12, (5, 5), (1, 1), (0, 0), (1, 1)),
    (1, 2, 5, 5, (3, 3), (3, 3), (1, 1), (1, 1)),
    (2, 1, 4, 6, (1, 1), (1, 2), (0, 2), (1, 1)),
    # Rows of 32 bytes and more with no column in the padding take im2col's whole-row copies (the last move
    # overlapping when the row is not a multiple of 32 bytes), with padded rows above and below.
    (2, 3, 10, 12, (3, 3), (1, 1), (1, 0), (1, 1)),
    (2, 2, 11, 12, (3, 3), (2, 1), (2, 0), (2, 1)),
    (1, 2, 6, 21, (2, 5), (3, 1), (1, 0), (1, 1)),
]
ISA_LEVELS = ["baseline", "avx2", "avx512"]
ISA_SUPPORTED = ISA_LEVELS[: ISA_LEVELS.index(_core.build_info()["cpu_isa"]["best"]) + 1]


@pytest.fixture(params=ISA_SUPPORTED)
def isa_level(request):
    """Runs the test on each instruction-set level this CPU supports (the SIMD kernels are compiled per level)."""
    before = _core.build_info()["cpu_isa"]["active"]
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa(before)


POOL_CASES = [  # N, C, H, W, kernel, stride, padding
    (2, 3, 8, 8, (2, 2), (2, 2), (0, 0)),
    (2, 3, 7, 9, (3, 3), (2, 1), (1, 1)),
    (1, 1, 5, 5, (3, 2), (1, 2), (1, 1)),
]


def ref_im2col(x, k, s, p, d):
    N, C, H, W = x.shape
    oh, ow = out_size(H, k[0], s[0], p[0], d[0]), out_size(W, k[1], s[1], p[1], d[1])
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    cols = np.zeros((N, C, k[0], k[1], oh, ow), x.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            hi, wj = i * d[0], j * d[1]
            cols[:, :, i, j] = xp[:, :, hi:hi + s[0] * oh:s[0], wj:wj + s[1] * ow:s[1]]
    return cols.reshape(N, C * k[0] * k[1], oh * ow)


def ref_col2im(cols, shape, k, s, p, d):
    N, C, H, W = shape
    oh, ow = out_size(H, k[0], s[0], p[0], d[0]), out_size(W, k[1], s[1], p[1], d[1])
    xp = np.zeros((N, C, H + 2 * p[0], W + 2 * p[1]), cols.dtype)
    c6 = cols.reshape(N, C, k[0], k[1], oh, ow)
    for i in range(k[0]):
        for j in range(k[1]):
            hi, wj = i * d[0], j * d[1]
            xp[:, :, hi:hi + s[0] * oh:s[0], wj:wj + s[1] * ow:s[1]] += c6[:, :, i, j]
    return xp[:, :, p[0]:p[0] + H, p[1]:p[1] + W]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_im2col_and_col2im_match_numpy(case, dtype):
    N, C, H, W, k, s, p, d = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    cols = _core.im2col(T(x), k, s, p, d)
    ref = ref_im2col(x, k, s, p, d)  # (N, K, L); singa_lite lays the images side by side: (K, N*L)
    np.testing.assert_array_equal(np.asarray(cols), ref.transpose(1, 0, 2).reshape(ref.shape[1], -1))
    g = rng.standard_normal(ref.shape).astype(dtype)
    g_knl = np.ascontiguousarray(g.transpose(1, 0, 2).reshape(ref.shape[1], -1))
    # float16 sums in float32 and rounds once: against the exact sum, within float16's rounding.
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(np.asarray(_core.col2im(T(g_knl), [N, C, H, W], k, s, p, d)).astype(np.float64),
                               ref_col2im(g.astype(np.float64), (N, C, H, W), k, s, p, d), rtol=tol, atol=tol)


def test_col2im_is_the_adjoint_of_im2col():
    # <im2col(x), c> == <x, col2im(c)> for any x, c: what makes conv2d's backward correct.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 6, 7))
    k, s, p, d = (3, 3), (2, 1), (1, 1), (1, 1)
    c = rng.standard_normal(_core.im2col(T(x), k, s, p, d).shape)
    lhs = (np.asarray(_core.im2col(T(x), k, s, p, d)) * c).sum()
    rhs = (x * np.asarray(_core.col2im(T(c), list(x.shape), k, s, p, d))).sum()
    assert abs(lhs - rhs) < 1e-9 * max(1.0, abs(lhs))


# float32 2x2 / stride 2 / no padding has a kernel of its own (two passes over each plane): rows that pair up
# exactly (W even) and rows with a column left over (W odd), a row left over (H odd).
POOL_2X2_CASES = [(2, 3, 8, 8, (2, 2), (2, 2), (0, 0)), (1, 2, 7, 13, (2, 2), (2, 2), (0, 0)),
                  (3, 5, 24, 24, (2, 2), (2, 2), (0, 0))]


@pytest.mark.parametrize("case", POOL_CASES + POOL_2X2_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_forward_backward(case, dtype):
    N, C, H, W, k, s, p = case
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    y, argmax = _core.max_pool2d(T(x), k, s, p)
    np.testing.assert_array_equal(np.asarray(y), np_pool(x, k, s, p, "max"))
    flat = x.reshape(N, C, H * W)
    np.testing.assert_array_equal(np.take_along_axis(flat, np.asarray(argmax).reshape(N, C, -1), 2),
                                  np.asarray(y).reshape(N, C, -1))
    gy = rng.standard_normal(y.shape)
    dx = np.asarray(_core.max_pool2d_backward(T(gy), argmax, [N, C, H, W]))
    expected = np.zeros((N, C, H * W))
    for n in range(N):
        for c in range(C):
            np.add.at(expected[n, c], np.asarray(argmax)[n, c].ravel(), gy[n, c].ravel())
    np.testing.assert_allclose(dx, expected.reshape(x.shape), rtol=1e-12)


def np_max_pool_argmax(x, k, s, p):
    """Per window (row-major over the clipped window): the first maximum, or the first nan if any."""
    N, C, H, W = x.shape
    oh, ow = out_size(H, k[0], s[0], p[0]), out_size(W, k[1], s[1], p[1])
    idx = np.zeros((N, C, oh, ow), np.int64)
    for a in range(oh):
        for b in range(ow):
            h0, w0 = a * s[0] - p[0], b * s[1] - p[1]
            hs, ws = max(h0, 0), max(w0, 0)
            win = x[:, :, hs:min(h0 + k[0], H), ws:min(w0 + k[1], W)]
            ww = win.shape[3]
            flat = win.reshape(N, C, -1)
            first = np.argmax(flat, axis=2)  # numpy: first maximum, and a nan counts as the maximum
            idx[:, :, a, b] = (hs + first // ww) * W + ws + first % ww
    return idx


# Wide rows and many window positions so every dtype's fast path (SIMD rows for float32) and the
# padded borders are both exercised; small integers make ties common.
TIE_POOL_CASES = POOL_CASES + POOL_2X2_CASES[1:] + [(2, 2, 9, 150, (2, 2), (2, 2), (0, 0)),
                                                   (1, 2, 6, 131, (3, 3), (2, 3), (1, 1)),
                                                   (1, 1, 4, 70, (2, 3), (1, 1), (1, 1))]


@pytest.mark.parametrize("case", TIE_POOL_CASES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_max_pool_ties_and_nan_pick_the_first(case, dtype, isa_level):
    N, C, H, W, k, s, p = case
    rng = np.random.default_rng(5)
    x = rng.integers(-2, 3, (N, C, H, W)).astype(dtype)
    x.reshape(-1)[rng.choice(x.size, max(1, x.size // 40), replace=False)] = np.nan
    y, argmax = _core.max_pool2d(T(x), k, s, p)
    expected = np_max_pool_argmax(x, k, s, p)
    np.testing.assert_array_equal(np.asarray(argmax), expected)
    flat = x.reshape(N, C, H * W)
    np.testing.assert_array_equal(np.asarray(y),
                                  np.take_along_axis(flat, expected.reshape(N, C, -1), 2).reshape(y.shape))


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool_forward_backward(case, count_include_pad):
    N, C, H, W, k, s, p = case
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, C, H, W))
    y = _core.avg_pool2d(T(x), k, s, p, count_include_pad)
    np.testing.assert_allclose(np.asarray(y), np_pool(x, k, s, p, "avg", count_include_pad), rtol=1e-12)
    # The backward is the adjoint of the forward: <avg(x), g> == <x, avg_backward(g)>.
    g = rng.standard_normal(y.shape)
    dx = np.asarray(_core.avg_pool2d_backward(T(g), [N, C, H, W], k, s, p, count_include_pad))
    assert abs((np.asarray(y) * g).sum() - (x * dx).sum()) < 1e-9


def test_against_torch_when_available():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 9, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    cols = np.asarray(_core.im2col(T(x), (3, 3), (2, 1), (1, 1), (1, 1)))  # (K, N*L)
    y = (w.reshape(4, -1) @ cols).reshape(4, 2, -1).transpose(1, 0, 2)
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), stride=(2, 1), padding=1).numpy()
    np.testing.assert_allclose(y.reshape(ref.shape), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("call,match", [
    (lambda: _core.im2col(T(np.zeros((2, 3, 4), np.float32)), (2, 2), (1, 1), (0, 0)), "4-D NCHW"),
    (lambda: _core.im2col(T(np.zeros((1, 1, 2, 2), np.float32)), (3, 3), (1, 1), (0, 0)), "smaller than the kernel"),
    (lambda: _core.im2col(T(np.zeros((1, 1, 4, 4), np.float32)), (2, 2), (0, 1), (0, 0)), "stride must be >= 1"),
    (lambda: _core.max_pool2d(T(np.zeros((1, 1, 4, 4), np.float32)), (2, 2), (1, 1), (2, 2)), "at most half"),
    (lambda: _core.avg_pool2d(T(np.zeros((1, 1, 4, 4), np.int32)), (2, 2), (1, 1), (0, 0)), "floating"),
    (lambda: _core.col2im(T(np.zeros((5, 9), np.float32)), [1, 1, 4, 4], (2, 2), (1, 1), (0, 0)), "col2im: cols"),
])
def test_bad_geometry_raises(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# Found by UBSan (tools/sanitize.sh): huge kernels, paddings and dilations wrapped around in the geometry, and a
# wrapped size would have sized a buffer the kernel then overran. Now each is a ValueError.
@pytest.mark.parametrize("call", [
    lambda: _core.im2col(T(np.zeros((1, 1, 4, 4), np.float32)), (2 ** 62, 2), (1, 1), (0, 0), (2 ** 31, 1)),
    lambda: _core.im2col(T(np.zeros((1, 1, 4, 4), np.float32)), (2, 2), (1, 1), (2 ** 62, 0)),
    lambda: _core.im2col(T(np.zeros((1, 2 ** 40, 0, 4), np.float32)), (2 ** 31, 2 ** 31), (1, 1), (2 ** 32, 2 ** 32)),
    lambda: _core.col2im(T(np.zeros((4, 9), np.float32)), [1, 1, 4, 4], (2, 2), (1, 1), (2 ** 62, 0)),
    lambda: _core.max_pool2d(T(np.zeros((1, 1, 4, 4), np.float32)), (2 ** 63 - 2, 2), (1, 1), (2 ** 62 - 1, 0)),
])
def test_huge_geometry_raises_instead_of_overflowing(call):
    with pytest.raises(ValueError, match="sizes too large|smaller than the kernel"):
        call()


def test_max_pool_backward_refuses_an_argmax_outside_the_image():
    # The kernel adds dy at dx[argmax]: an index beyond the image wrote past the end of dx's buffer.
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    y, argmax = _core.max_pool2d(T(x), (2, 2), (2, 2), (0, 0))
    bad = np.asarray(argmax).copy()
    bad[0, 1, 1, 1] = 16
    with pytest.raises(IndexError, match=r"argmax must hold positions in \[-1, 16\)"):
        _core.max_pool2d_backward(y, T(bad), [1, 2, 4, 4])
    bad[0, 1, 1, 1] = -2
    with pytest.raises(IndexError, match="argmax must hold positions"):
        _core.max_pool2d_backward(y, T(bad), [1, 2, 4, 4])
    dx = np.asarray(_core.max_pool2d_backward(y, argmax, [1, 2, 4, 4]))
    assert dx.shape == (1, 2, 4, 4) and (dx != 0).sum() == 8
