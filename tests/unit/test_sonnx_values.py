"""singa_lite.sonnx import of what goes beyond float / int tensors and of the operator forms SINGA's backend test
found missing: the narrow element types (float8, float4, int4 ...), strings, sequences, ScatterElements'
reductions, Resize's keep_aspect_ratio_policy, pooling pads above half the kernel, training-mode
BatchNormalization, OneHot's out-of-range indices, Reshape's allowzero. Each is checked against onnxruntime,
or onnx's reference evaluator where onnxruntime has no kernel. Needs the onnx extra."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed: pip install 'singa_lite[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: pip install 'singa_lite[onnx]'")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from singa_lite import autograd, layer, ops as F, sonnx, tensor  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes", reason="onnx reads the narrow types as ml_dtypes arrays")

# the narrow types' Casts are opset 19 to 23 operators; sonnx warns that it checked the forms up to opset 21
pytestmark = pytest.mark.filterwarnings("ignore:sonnx. opset 2[2-9] is newer")


@pytest.fixture(autouse=True)
def _evaluation_mode():
    was = autograd.training
    autograd.training = False
    yield
    autograd.training = was


def _model(nodes, inputs, outputs, opset=18, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    """shape: a list, or a rank (that many dimensions of unknown size)."""
    return helper.make_tensor_value_info(name, elem, [f"{name}{i}" for i in range(shape)]
                                         if isinstance(shape, int) else shape)


def _ours(model, *xs):
    return sonnx.prepare(model).run(list(xs))


def _ort(model, *xs):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(model.graph.input, xs)})


def _reference(model, *xs):
    return ReferenceEvaluator(model).run(None, {i.name: x for i, x in zip(model.graph.input, xs)})


def _same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


# values around every rounding question: ties, subnormals, overflow, infinities, NaN, negatives
_FLOATS = np.array([0.0, -0.0, 0.3, -1.7, 2.5, 3.5, 7.75, 1e-3, 1e-6, -1e-8, 300.0, 500.0, 6e4, 1e6, -1e6,
                    np.inf, -np.inf, np.nan], np.float32)
_NARROW = [t for t in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT4E2M1", "INT4",
                       "UINT4", "INT2", "UINT2", "FLOAT8E8M0") if hasattr(TensorProto, t)]


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("name", _NARROW)
def test_a_cast_to_a_narrow_type_rounds_as_onnx_and_comes_back_in_that_type(name, saturate):
    to = getattr(TensorProto, name)
    x = _FLOATS if "INT" not in name else np.array([0, 1.4, -2.6, 3, 7.5, -8, 9, 100, -100], np.float32)
    if name == "FLOAT8E8M0":
        x = np.abs(x[np.isfinite(x) & (x != 0)])
    node = helper.make_node("Cast", ["x"], ["y"], to=to, saturate=saturate)
    back = helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)
    model = _model([node, back], [_vi("x", TensorProto.FLOAT, [x.size])],
                   [_vi("y", to, [x.size]), _vi("z", TensorProto.FLOAT, [x.size])], opset=23)
    with np.errstate(all="ignore"):
        want_y, want_z = _reference(model, x)
    got_y, got_z = _ours(model, x)
    _same(got_y, want_y)  # the declared type, bit for bit through float64
    _same(got_z, want_z)


def test_narrow_types_agree_with_onnxruntime_where_it_has_the_cast():
    x = _FLOATS[np.isfinite(_FLOATS)]
    for name in ("FLOAT8E4M3FN", "FLOAT8E5M2"):
        to = getattr(TensorProto, name)
        model = _model([helper.make_node("Cast", ["x"], ["y"], to=to),
                        helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)],
                       [_vi("x", TensorProto.FLOAT, [x.size])], [_vi("z", TensorProto.FLOAT, [x.size])], opset=19)
        _same(_ours(model, x)[0], _ort(model, x)[0])


def test_castlike_reads_the_type_a_narrow_value_is_not_the_float32_holding_it():
    # t is float8 held in float32: CastLike(y, t) must round y to float8, not keep float32
    x = np.array([0.3, 1.7, 100.0], np.float32)
    y = np.array([0.1, 2.2, 1000.0], np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["t"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("CastLike", ["y", "t"], ["z"]),
             helper.make_node("Cast", ["z"], ["w"], to=TensorProto.FLOAT)]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [3]), _vi("y", TensorProto.FLOAT, [3])],
                   [_vi("w", TensorProto.FLOAT, [3])], opset=19)
    got = _ours(model, x, y)[0]
    _same(got, _ort(model, x, y)[0])
    assert got[2] == 448.0  # float8e4m3fn's largest value (saturated), which float32 would not have given


def test_the_gradient_passes_through_a_narrow_cast():
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN),
                    helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)],
                   [_vi("x", TensorProto.FLOAT, [4])], [_vi("z", TensorProto.FLOAT, [4])], opset=19)
    autograd.training = True
    x = tensor.Tensor(data=np.array([0.3, 1.7, -2.2, 9.1], np.float32), requires_grad=True, stores_grad=True)
    rep = sonnx.prepare(model)
    rep.is_graph = True
    z = rep.run([x])[0]
    grads = autograd.gradients(autograd.reduce_sum(F.mul(z, z), None, 0))
    np.testing.assert_allclose(tensor.to_numpy(grads[x]), 2 * tensor.to_numpy(z))  # Cast's gradient: dy


def test_strings_compare_on_the_host():
    model = _model([helper.make_node("Equal", ["a", "b"], ["c"])],
                   [_vi("a", TensorProto.STRING, [3]), _vi("b", TensorProto.STRING, [1])],
                   [_vi("c", TensorProto.BOOL, [3])], opset=19)
    a, b = np.array(["x", "yy", "x"], object), np.array(["x"], object)
    _same(_ours(model, a, b)[0], _ort(model, a, b)[0])
    sigmoid = _model([helper.make_node("Sigmoid", ["a"], ["c"])], [_vi("a", TensorProto.STRING, [3])],
                     [_vi("c", TensorProto.FLOAT, [3])])
    with pytest.raises(sonnx.SonnxError, match="numpy dtype object has no singa_lite tensor type"):
        sonnx.SingaRep(sigmoid).run([a])  # not through prepare: onnx's checker refuses the model already


def test_sequences_split_index_and_concatenate_as_onnxruntime():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    nodes = [helper.make_node("SplitToSequence", ["x", "s"], ["seq"], axis=1),
             helper.make_node("SequenceLength", ["seq"], ["n"]),
             helper.make_node("SequenceAt", ["seq", "i"], ["last"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["stacked"], axis=0, new_axis=1),
             helper.make_node("SplitToSequence", ["x"], ["cols"], axis=1, keepdims=0),
             helper.make_node("SequenceConstruct", ["x", "x"], ["pair"]),
             helper.make_node("ConcatFromSequence", ["pair"], ["both"], axis=-1)]
    inits = [onnx.numpy_helper.from_array(np.array(2, np.int64), "s"),
             onnx.numpy_helper.from_array(np.array(-1, np.int64), "i")]
    outs = [_vi("n", TensorProto.INT64, []), _vi("last", TensorProto.FLOAT, 2), _vi("stacked", TensorProto.FLOAT, 3),
            helper.make_value_info("cols", helper.make_sequence_type_proto(
                helper.make_tensor_type_proto(TensorProto.FLOAT, [4]))),
            _vi("both", TensorProto.FLOAT, 2)]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [4, 6])], outs, inits=inits)
    got, want = _ours(model, x), _ort(model, x)
    for g, w in zip(got, want):
        if isinstance(w, list):
            assert isinstance(g, list) and len(g) == len(w) == 6
            for a, b in zip(g, w):
                _same(a, b)
        else:
            _same(g, w)


def test_a_sequence_read_as_a_tensor_is_refused_by_name():
    model = _model([helper.make_node("SplitToSequence", ["x"], ["seq"]), helper.make_node("Relu", ["seq"], ["y"])],
                   [_vi("x", TensorProto.FLOAT, [2, 2])], [_vi("y", TensorProto.FLOAT, 2)])
    with pytest.raises(sonnx.SonnxError, match="'seq' is a sequence, not a tensor"):
        sonnx.SingaRep(model).run([np.ones((2, 2), np.float32)])


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_reductions_agree_with_onnxruntime(reduction):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[1, 1, 0, 3], [2, 1, 1, 0]], np.int64)  # repeated positions: each update counts
    upd = rng.standard_normal((2, 4)).astype(np.float32)
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)
    model = _model([node], [_vi("x", TensorProto.FLOAT, [3, 4])], [_vi("y", TensorProto.FLOAT, [3, 4])],
                   inits=[onnx.numpy_helper.from_array(idx, "i"), onnx.numpy_helper.from_array(upd, "u")])
    np.testing.assert_allclose(_ours(model, x)[0], _ort(model, x)[0], rtol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_gradient_matches_finite_differences(reduction):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4))
    idx = np.array([[1, 1, 0], [2, 0, 0]], np.int64)
    upd = rng.standard_normal((2, 3))
    autograd.training = True
    tx = tensor.Tensor(data=x, requires_grad=True, stores_grad=True)
    w = rng.standard_normal((3, 4))
    y = F.scatter_elements(tx, idx, upd, 1, reduction)
    grad = tensor.to_numpy(autograd.gradients(autograd.reduce_sum(F.mul(y, tensor.from_numpy(w)), None, 0))[tx])

    def f(v):
        return float((tensor.to_numpy(F.scatter_elements(tensor.from_numpy(v), idx, upd, 1, reduction)) * w).sum())

    numeric = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[k] = 1e-6
        numeric[k] = (f(x + e) - f(x - e)) / 2e-6
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="reduction must be"):
        F.scatter_elements(tx, idx, upd, 1, "sum")


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("attrs,sizes", [(dict(mode="nearest"), [7, 8]),
                                         (dict(mode="linear"), [5, 11]),  # 5/3 * 4 = 6.67: rounds up to 7
                                         (dict(mode="cubic", coordinate_transformation_mode="align_corners"), [4, 9]),
                                         (dict(mode="linear", coordinate_transformation_mode="asymmetric"), [2, 3])])
def test_resize_keep_aspect_ratio_policy_agrees_with_onnx(policy, attrs, sizes):
    x = np.random.default_rng(5).standard_normal((1, 2, 3, 4)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], axes=[2, 3], keep_aspect_ratio_policy=policy,
                            **attrs)
    model = _model([node], [_vi("x", TensorProto.FLOAT, [1, 2, 3, 4])], [_vi("y", TensorProto.FLOAT, 4)],
                   inits=[onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")])
    got = _ours(model, x)[0]
    np.testing.assert_allclose(got, _reference(model, x)[0], rtol=1e-5, atol=1e-5)
    if attrs.get("coordinate_transformation_mode") != "align_corners":
        # onnxruntime 1.32 maps align_corners with a kept aspect ratio otherwise than onnx's reference, whose
        # x_original = x_resized * (length_original - 1) / (length_resized - 1) is the operator's definition
        want = _ort(model, x)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,include", [("MaxPool", 0), ("AveragePool", 0), ("AveragePool", 1)])
def test_pooling_pads_above_half_the_kernel_agree_with_onnxruntime(op, include):
    x = np.random.default_rng(6).standard_normal((2, 3, 5, 6)).astype(np.float32)
    extra = {"count_include_pad": include} if op == "AveragePool" else {}
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 4], pads=[2, 3, 1, 2], strides=[2, 1], **extra)
    model = _model([node], [_vi("x", TensorProto.FLOAT, [2, 3, 5, 6])], [_vi("y", TensorProto.FLOAT, 4)])
    np.testing.assert_allclose(_ours(model, x)[0], _ort(model, x)[0], rtol=1e-5, atol=1e-6)


def test_singas_avgpool_with_padding_two_exports_and_trains():
    # SINGA's test_onnx.py: AvgPool2d(3, 1, 2) on a 3x3 input (padding above half the kernel)
    rng = np.random.default_rng(7)
    autograd.training = True
    x = tensor.Tensor(data=rng.standard_normal((2, 3, 3, 3)).astype(np.float32), requires_grad=True,
                      stores_grad=True)
    y = layer.AvgPool2d(3, 1, 2)(x)
    padded = np.pad(tensor.to_numpy(x), ((0, 0), (0, 0), (2, 2), (2, 2)))
    want = np.array([[[[padded[n, c, i:i + 3, j:j + 3].mean() for j in range(5)] for i in range(5)]
                      for c in range(3)] for n in range(2)])
    np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-5, atol=1e-6)
    model = sonnx.to_onnx([x], [y])
    np.testing.assert_allclose(_ort(model, tensor.to_numpy(x))[0], want, rtol=1e-5, atol=1e-6)
    g = tensor.to_numpy(autograd.gradients(autograd.reduce_sum(y, None, 0))[x])
    # d sum(y) / dx[i, j]: 1/9 for every window (start -2 .. 2 on each axis) that holds (i, j)
    reach = np.array([sum(s <= i <= s + 2 for s in range(-2, 3)) for i in range(3)])
    np.testing.assert_allclose(g, np.broadcast_to(np.outer(reach, reach) / 9, g.shape), rtol=1e-5)
    with pytest.raises(ValueError, match="smaller than the kernel"):
        F.max_pool2d(x, 3, 1, 3)


def test_training_mode_batchnorm_gives_onnxs_running_statistics():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    s, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1,
                            momentum=0.8)
    model = _model([node], [_vi(n, TensorProto.FLOAT, [2, 3, 4, 5] if n == "x" else [3]) for n in "xsbmv"],
                   [_vi("y", TensorProto.FLOAT, [2, 3, 4, 5]), _vi("rm", TensorProto.FLOAT, [3]),
                    _vi("rv", TensorProto.FLOAT, [3])], opset=15)
    want = _reference(model, x, s, b, mean, var)
    for got in (_ours(model, x, s, b, mean, var), _training(model, x, s, b, mean, var)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _training(model, *xs):
    autograd.training = True
    try:
        return _ours(model, *xs)
    finally:
        autograd.training = False


def test_onehot_out_of_range_indices_give_all_off_rows_and_reshape_allowzero_keeps_literal_zeros():
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=0)
    model = _model([node], [_vi("i", TensorProto.INT64, [2, 2])], [_vi("y", TensorProto.FLOAT, 3)],
                   inits=[onnx.numpy_helper.from_array(np.array(4.0, np.float32), "d"),
                          onnx.numpy_helper.from_array(np.array([-1, 2], np.float32), "v")])
    i = np.array([[5, -5], [-4, 3]], np.int64)
    np.testing.assert_array_equal(_ours(model, i)[0], _ort(model, i)[0])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)
    model = _model([node], [_vi("x", TensorProto.FLOAT, [0, 3, 4])], [_vi("y", TensorProto.FLOAT, 3)],
                   inits=[onnx.numpy_helper.from_array(np.array([0, 4, 3], np.int64), "shape")])
    x = np.zeros((0, 3, 4), np.float32)
    assert _ours(model, x)[0].shape == _ort(model, x)[0].shape == (0, 4, 3)
