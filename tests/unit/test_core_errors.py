"""Bad inputs to the C++ core raise the documented Python exception, with a message that names the op:
dtype mismatch -> TypeError, shapes that do not broadcast -> ValueError, bad axis -> IndexError, index out
of range -> IndexError, wrong out= shape -> ValueError, wrong out= dtype -> TypeError, a non-integer scalar
with an integer tensor -> TypeError, float-only ops on integers -> TypeError, unsupported buffers ->
TypeError, an unavailable CUDA device -> ValueError."""
from __future__ import annotations

import numpy as np
import pytest

from singa_lite import _core
from core_testutil import CPU, DT, tensor, to_np

ARITH = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
BINARY = ARITH + COMPARE
FLOAT_UNARY = ["exp", "log", "sqrt", "tanh", "sigmoid", "reciprocal", "sin", "cos", "floor", "ceil", "round", "log1p",
               "expm1", "erf", "softplus"]
ANY_UNARY = ["neg", "abs", "sign", "square", "relu"]


def f32(*shape):
    return tensor(np.zeros(shape, np.float32))


def i32(*shape):
    return tensor(np.zeros(shape, np.int32))


# ---------------------------------------------------------------- dtype mismatch

@pytest.mark.parametrize("name", BINARY)
def test_binary_dtype_mismatch(name):
    for other in (tensor(np.zeros(3, np.float64)), i32(3), tensor(np.zeros(3, np.float16)),
                  tensor(np.zeros(3, np.bool_))):
        with pytest.raises(TypeError, match=f"^{name}: dtypes differ \\(float32 and "):
            getattr(_core, name)(f32(3), other)


def test_other_dtype_mismatches():
    with pytest.raises(TypeError, match="^matmul: dtypes differ"):
        _core.matmul(f32(2, 2), tensor(np.zeros((2, 2), np.float64)))
    with pytest.raises(TypeError, match="^concat: dtypes differ"):
        _core.concat([f32(2), i32(2)], 0)
    with pytest.raises(TypeError, match="^concat: dtypes differ"):
        _core.stack([f32(2), i32(2)], 0)
    with pytest.raises(TypeError, match="^axpy: dtypes differ"):
        _core.axpy_(1.0, i32(2), f32(2))


@pytest.mark.parametrize("name", ARITH)
def test_arithmetic_on_bool(name):
    b = tensor(np.array([True, False]))
    with pytest.raises(TypeError, match=f"^{name}: not defined for bool tensors"):
        getattr(_core, name)(b, b)
    with pytest.raises(TypeError, match=f"^{name}: not defined for bool tensors"):
        getattr(_core, name + "_scalar")(b, 1.0)


# ---------------------------------------------------------------- shapes

@pytest.mark.parametrize("name", BINARY)
def test_binary_not_broadcastable(name):
    for sa, sb in [((3,), (4,)), ((2, 3), (3, 2)), ((2, 1, 3), (4, 2)), ((0,), (2,))]:
        with pytest.raises(ValueError, match=f"^{name}: shapes .* do not broadcast"):
            getattr(_core, name)(f32(*sa), f32(*sb))


@pytest.mark.parametrize("name", BINARY)
def test_binary_wrong_out(name):
    out_dtype = np.bool_ if name in COMPARE else np.float32
    wrong_dtype = np.float32 if name in COMPARE else np.float64
    with pytest.raises(ValueError, match=f"^{name}: out has shape \\(3,\\), expected \\(2, 3\\)"):
        getattr(_core, name)(f32(2, 3), f32(3), out=tensor(np.zeros(3, out_dtype)))
    with pytest.raises(TypeError, match=f"^{name}: out has dtype {np.dtype(wrong_dtype).name}, expected "):
        getattr(_core, name)(f32(2, 3), f32(3), out=tensor(np.zeros((2, 3), wrong_dtype)))
    with pytest.raises(ValueError, match=f"^{name}: out has shape"):
        getattr(_core, name + "_scalar")(f32(2, 3), 1.0, out=tensor(np.zeros((3, 2), out_dtype)))
    with pytest.raises(TypeError, match=f"^{name}: out has dtype"):
        getattr(_core, name + "_scalar")(f32(2, 3), 1.0, out=tensor(np.zeros((2, 3), wrong_dtype)))


@pytest.mark.parametrize("name", ANY_UNARY + FLOAT_UNARY)
def test_unary_wrong_out(name):
    with pytest.raises(ValueError, match=f"^{name}: out has shape \\(2,\\), expected \\(2, 1\\)"):
        getattr(_core, name)(f32(2, 1), out=f32(2))
    with pytest.raises(TypeError, match=f"^{name}: out has dtype float16, expected float32"):
        getattr(_core, name)(f32(2), out=tensor(np.zeros(2, np.float16)))


def test_other_wrong_out():
    with pytest.raises(ValueError, match="^clip: out has shape"):
        _core.clip(f32(2), 0.0, 1.0, out=f32(3))
    with pytest.raises(TypeError, match="^clip: out has dtype int32, expected float32"):
        _core.clip(f32(2), 0.0, 1.0, out=i32(2))
    with pytest.raises(ValueError, match="^matmul: out has shape"):
        _core.matmul(f32(2, 3), f32(3, 4), out=f32(4, 2))
    with pytest.raises(TypeError, match="^matmul: out has dtype int32, expected float32"):
        _core.matmul(f32(2, 3), f32(3, 4), out=i32(2, 4))


def test_other_shape_errors():
    with pytest.raises(ValueError, match="^matmul: inner dimensions differ"):
        _core.matmul(f32(2, 3), f32(2, 3))
    with pytest.raises(ValueError, match="^axpy: "):
        _core.axpy_(1.0, f32(2, 3), f32(3))
    with pytest.raises(ValueError, match="^copy: "):
        _core.copy_(f32(3), f32(2, 3))
    with pytest.raises(ValueError, match="^concat: input 1 has shape"):
        _core.concat([f32(2, 3), f32(3, 3)], 1)
    with pytest.raises(ValueError, match="^split: sizes"):
        _core.split(f32(4), [1, 2], 0)
    with pytest.raises(ValueError, match="^reshape: cannot reshape"):
        f32(2, 3).reshape([4])
    with pytest.raises(ValueError, match="^broadcast_to: cannot broadcast"):
        f32(2, 3).broadcast_to((3, 3))
    with pytest.raises(ValueError, match="^Tensor: negative dimension"):
        _core.Tensor((2, -1), DT.float32, CPU)
    with pytest.raises(ValueError, match="^Tensor: at most 16 dimensions"):
        _core.Tensor((1,) * 17, DT.float32, CPU)


# ---------------------------------------------------------------- axes and indices

AXIS_CALLS = {
    "sum": lambda t, a: _core.sum(t, [a]),
    "mean": lambda t, a: _core.mean(t, [a]),
    "max": lambda t, a: _core.max(t, [a]),
    "min": lambda t, a: _core.min(t, [a]),
    "argmax": lambda t, a: _core.argmax(t, a),
    "argmin": lambda t, a: _core.argmin(t, a),
    "concat": lambda t, a: _core.concat([t, t], a),
    "split": lambda t, a: _core.split(t, [1], a),
    "slice": lambda t, a: t.slice(a, 0, 1, 1),
    "select": lambda t, a: t.select(a, 0),
    "squeeze": lambda t, a: t.squeeze([a]),
}


@pytest.mark.parametrize("name", list(AXIS_CALLS))
def test_bad_axis(name):
    t = f32(1, 1)
    for axis in (2, -3, 100):
        with pytest.raises(IndexError, match=f"^{name}: axis {axis} is out of range for a tensor with 2 dimensions"):
            AXIS_CALLS[name](t, axis)


def test_bad_axis_for_ops_adding_an_axis():
    t = f32(2, 2)
    with pytest.raises(IndexError, match="^stack: axis 3 is out of range for a tensor with 3 dimensions"):
        _core.stack([t, t], 3)
    with pytest.raises(IndexError, match="^unsqueeze: axis -4 is out of range"):
        t.unsqueeze(-4)
    with pytest.raises(IndexError, match="^transpose: axis 2 is out of range"):
        t.transpose([0, 2])
    with pytest.raises(IndexError, match="^split: axis 1 is out of range"):
        _core.split_sections(f32(4), 2, 1)


def test_index_out_of_range():
    t = f32(3, 2)
    with pytest.raises(IndexError, match="^select: index 3 is out of bounds for axis 0 with size 3"):
        t.select(0, 3)
    with pytest.raises(IndexError, match="^select: index -3 is out of bounds for axis 1 with size 2"):
        t.select(1, -3)
    with pytest.raises(IndexError, match=r"^one_hot: indices must lie in \[0, 4\), got values in \[0, 4\]"):
        _core.one_hot(tensor(np.array([[0, 4]], np.int32)), 4)
    with pytest.raises(IndexError, match=r"^one_hot: indices must lie in \[0, 4\), got values in \[-2, 1\]"):
        _core.one_hot(tensor(np.array([1, -2], np.int64)), 4)


# ---------------------------------------------------------------- scalars with integer tensors

@pytest.mark.parametrize("name", BINARY)
def test_non_integer_scalar_with_int_tensor(name):
    for dtype in (np.int32, np.int64):
        t = tensor(np.zeros(3, dtype))
        for s in (0.5, -1.25, float("nan"), float("inf")):
            with pytest.raises(TypeError, match=f"^{name}: the scalar"):
                getattr(_core, name + "_scalar")(t, s)
            with pytest.raises(TypeError, match=f"^{name}: the scalar"):
                getattr(_core, name + "_scalar")(t, s, True)


def test_non_integer_values_with_int_tensors_elsewhere():
    with pytest.raises(TypeError, match="^fill: the value 0.5 is not an integer but the tensor is int32"):
        _core.fill_(i32(2), 0.5)
    with pytest.raises(TypeError, match="^axpy: alpha 0.5 is not an integer but the tensor is int32"):
        _core.axpy_(0.5, i32(2), i32(2))
    with pytest.raises(TypeError, match="^clip: the bound 0.5 is not an integer but the tensor is int32"):
        _core.clip(i32(2), 0.5, 2.0)
    with pytest.raises(TypeError, match="^add: the scalar 3e\\+09 is out of range for int32"):
        _core.add_scalar(i32(2), 3e9)


# ---------------------------------------------------------------- floating-only ops

@pytest.mark.parametrize("name", FLOAT_UNARY)
def test_float_only_unary_on_ints(name):
    for t in (i32(2), tensor(np.zeros(2, np.int64))):
        with pytest.raises(TypeError, match=f"^{name}: expected a floating dtype"):
            getattr(_core, name)(t)


def test_float_only_random_on_ints():
    with pytest.raises(TypeError, match="^uniform: expected a floating dtype"):
        _core.uniform_(i32(2))
    with pytest.raises(TypeError, match="^gaussian: expected a floating dtype"):
        _core.gaussian_(tensor(np.zeros(2, np.bool_)))


@pytest.mark.parametrize("name", ANY_UNARY + FLOAT_UNARY)
def test_unary_on_bool(name):
    with pytest.raises(TypeError, match=f"^{name}: not defined for bool"):
        getattr(_core, name)(tensor(np.zeros(2, np.bool_)))


def test_other_bool_rejections():
    b = tensor(np.zeros((2, 2), np.bool_))
    for call, name in [(lambda: _core.clip(b, 0.0, 1.0), "clip"), (lambda: _core.axpy_(1.0, b, b), "axpy"),
                       (lambda: _core.matmul(b, b), "matmul"), (lambda: _core.argmax(b), "argmax"),
                       (lambda: _core.argmin(b), "argmin"), (lambda: _core.arange(0, 2, 1, DT.bool, CPU), "arange"),
                       (lambda: _core.one_hot(b, 2), "one_hot")]:
        with pytest.raises(TypeError, match=f"^{name}: "):
            call()


# ---------------------------------------------------------------- buffers and devices

def test_from_buffer_unsupported():
    with pytest.raises(TypeError, match="unsupported element type 'B'"):
        _core.Tensor.from_buffer(np.zeros(3, np.uint8))
    with pytest.raises(TypeError, match="unsupported element type"):
        _core.Tensor.from_buffer(np.zeros(3, np.uint32))
    with pytest.raises(TypeError, match="unsupported"):
        _core.Tensor.from_dlpack(np.zeros(3, np.uint8))


@pytest.mark.skipif(_core.cuda_device_count() != 0, reason="a CUDA GPU is present")
def test_cuda_unavailable():
    with pytest.raises(ValueError, match="cuda:0"):
        _core.Tensor((2,), DT.float32, _core.Device("cuda:0"))
    with pytest.raises(ValueError, match="cuda:3"):
        _core.Tensor((2,), DT.float32, _core.Device("cuda:3"))
    with pytest.raises(ValueError, match="^arange: |cuda:0"):
        _core.arange(0, 3, 1, DT.float32, _core.Device("cuda:0"))
    with pytest.raises(ValueError, match="cuda:0"):
        f32(2).to(_core.Device("cuda:0"))


def test_bad_devices():
    with pytest.raises(ValueError, match="^Device: "):
        _core.Device("cpu:1")
    with pytest.raises(ValueError, match="^Device: "):
        _core.Device("cuda:-1")
    with pytest.raises(ValueError, match="^Device: "):
        _core.Device("")


def test_sizes_beyond_any_machine_raise_memory_error():
    # 2**61 - 1 float64 elements are 2**64 - 8 bytes: that fits in size_t, but rounding it up to the
    # allocator's size class wrapped to 0, so the tensor got a tiny block and the first fill overran the heap
    # (a segfault). Now any request above 2**62 bytes is refused before anything is allocated.
    for shape, dt in (([2 ** 61 - 1], DT.float64), ([2 ** 62 + 1], DT.bool), ([2 ** 31, 2 ** 31], DT.float32)):
        with pytest.raises(MemoryError, match=r"^cannot allocate .*(more than any machine has|overflows)"):
            _core.Tensor(shape, dt, CPU)
    big = _core.Tensor([2 ** 26], DT.int32, CPU)  # 256 MiB: still allowed, and a tensor that works
    _core.fill_(big, 3)
    assert int(to_np(big.slice(0, 2 ** 26 - 1, 2 ** 26))[0]) == 3
