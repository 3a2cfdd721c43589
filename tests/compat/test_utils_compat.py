"""SINGA's ``singa.utils`` (singa_lite/utils.py) and the graph readers ``Dummy`` / ``infer_dependency``
(singa_lite/autograd_graph.py): padding arithmetic checked against a numpy convolution with ONNX's SAME
padding, odd padding round trips, handle renewal, and walks over recorded graphs of known shape."""
import io

import numpy as np
import pytest

from singa_lite import autograd, singa_wrap, tensor, utils
from singa_lite.singa_wrap.handles import ConvHandle, CudnnConvHandle, PoolingHandle
from singa_lite.autograd_graph import Dummy, infer_dependency, post_order


def raw(a):
    return tensor.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).data


def npy(t):
    return tensor.to_numpy(tensor.Tensor(data=t, requires_grad=False))


# ---------------------------------------------------------------- progress bar
def test_update_progress_draws_bar_and_states():
    out = io.StringIO()
    utils.update_progress(0.25, "epoch 1", stream=out)
    text = out.getvalue()
    bar = text.rstrip("\b")
    assert bar == "[.....               ] 25.0% epoch 1"
    assert len(text) - len(bar) == len(bar)  # the cursor goes back to the start: the next call overwrites
    for value, word in ((1.5, "Done. "), (-1, "Halt. "), ("x", "error: progress var must be float. ")):
        out = io.StringIO()
        utils.update_progress(value, "i", stream=out)
        assert out.getvalue().rstrip("\b").endswith(word + "i")
    out = io.StringIO()
    utils.update_progress(1, "", stream=out)  # an int is a fraction too
    assert "[" + "." * 20 + "] 100.0% Done." in out.getvalue()


def test_update_progress_defaults_to_stdout(capsys):
    utils.update_progress(0.5, "half")
    assert "50.0% half" in capsys.readouterr().out


# ---------------------------------------------------------------- padding arithmetic
@pytest.mark.parametrize("mode,expect", [("SAME_UPPER", [3, 4]), ("SAME_LOWER", [3, 4]), ("VALID", [2, 3])])
def test_get_output_shape(mode, expect):
    assert utils.get_output_shape(mode, [5, 7], [3, 2], [2, 2]) == expect


def test_get_padding_shape_splits_odd_totals():
    # height: out 3, total (3-1)*2+3-5 = 2 -> 1 each side; width: out 4, total 3*2+2-7 = 1 -> all odd
    assert utils.get_padding_shape("SAME_UPPER", [5, 7], [3, 2], [2, 2]) == ([1, 1, 0, 0], [0, 0, 0, 1])
    assert utils.get_padding_shape("SAME_LOWER", [5, 7], [3, 2], [2, 2]) == ([1, 1, 0, 0], [0, 0, 1, 0])
    assert utils.get_padding_shape("VALID", [5, 7], [3, 2], [2, 2]) == ([0, 0, 0, 0], [0, 0, 0, 0])


def test_padding_bad_input_is_clear():
    with pytest.raises(ValueError, match="auto_pad must be"):
        utils.get_output_shape("NOTSET", [5], [3], [1])
    with pytest.raises(ValueError, match="one per spatial axis"):
        utils.get_output_shape("VALID", [5, 5], [3], [1, 1])
    with pytest.raises(ValueError, match="strides_spatial must be >= 1"):
        utils.get_output_shape("SAME_UPPER", [5], [3], [0])
    with pytest.raises(TypeError, match="sequence of ints"):
        utils.get_padding_shape("VALID", 5, [3], [1])


def numpy_conv(x, w, stride):
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    y = np.zeros((n, f, oh, ow), np.float32)
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            y[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return y


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_same_convolution_through_odd_padding_matches_numpy(mode):
    """ONNX's SAME convolution with an even kernel: symmetric pads in the handle, the odd row/column added by
    handle_odd_pad_fwd on the side the mode says; the result equals numpy on the explicitly padded input."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    w = rng.standard_normal((4, 3, 4, 2)).astype(np.float32)
    pads, odd = utils.get_padding_shape(mode, [6, 7], [4, 2], [1, 1])
    xp = utils.handle_odd_pad_fwd(raw(x), odd)
    handle = ConvHandle(xp, [4, 2], [1, 1], [pads[0], pads[2]], 3, 4, False)
    assert utils.same_pad_shape_check(handle, mode, raw(x)) == (pads, odd)
    y = npy(singa_wrap.CpuConvForward(xp, raw(w), raw(np.zeros(4)), handle))
    full = [(pads[0] + odd[0], pads[1] + odd[1]), (pads[2] + odd[2], pads[3] + odd[3])]
    ref = numpy_conv(np.pad(x, [(0, 0), (0, 0)] + full), w, 1)
    assert y.shape == (2, 4, 6, 7)  # SAME: the spatial shape is kept
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_same_pad_shape_check_names_the_right_padding():
    handle = ConvHandle(raw(np.zeros((1, 1, 6, 6))), 3, 1, 0, 1, 1, False)
    with pytest.raises(ValueError, match=r"must be \[1, 1\], it is \[0, 0\]"):
        utils.same_pad_shape_check(handle, "SAME_UPPER", raw(np.zeros((1, 1, 6, 6))))


# ---------------------------------------------------------------- odd padding
def test_odd_pad_fwd_conv_adds_zeros_and_bwd_cuts_them():
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    y = npy(utils.handle_odd_pad_fwd(raw(x), [1, 2, 0, 1]))
    assert y.shape == (1, 2, 6, 5)
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (0, 0), (1, 2), (0, 1)]))
    back = npy(utils.handle_odd_pad_bwd(raw(y), [1, 2, 0, 1]))
    np.testing.assert_array_equal(back, x)


def test_odd_pad_fwd_pool_copies_edges():
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    y = npy(utils.handle_odd_pad_fwd(raw(x), [1, 0, 0, 1], is_pool=True))
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (0, 0), (1, 0), (0, 1)], mode="edge"))


def test_odd_pad_keeps_tensor_kind_and_checks_input():
    t = tensor.from_numpy(np.ones((1, 1, 2, 2), np.float32))
    out = utils.handle_odd_pad_fwd(t, [0, 0, 1, 0])
    assert isinstance(out, tensor.Tensor) and out.shape == (1, 1, 2, 3)
    with pytest.raises(ValueError, match="N, C, H, W"):
        utils.handle_odd_pad_fwd(raw(np.ones((2, 2))), [0, 0, 0, 1])
    with pytest.raises(ValueError, match="4 entries"):
        utils.handle_odd_pad_fwd(t.data, [1, 1])
    with pytest.raises(ValueError, match=">= 0"):
        utils.handle_odd_pad_bwd(t.data, [0, -1, 0, 0])
    with pytest.raises(TypeError, match="must be a tensor"):
        utils.handle_odd_pad_bwd(np.ones((1, 1, 2, 2)), [0, 0, 0, 0])


# ---------------------------------------------------------------- handles
def test_re_new_handle_conv_keeps_geometry_for_new_batch():
    old = CudnnConvHandle(raw(np.zeros((2, 3, 8, 8))), [3, 3], [2, 2], [1, 1], 3, 5, True, 1,
                          workspace_byte_limit=123, prefer="limited_workspace")
    new = utils.re_new_handle(old, raw(np.zeros((7, 3, 10, 10))))
    assert type(new) is CudnnConvHandle
    assert (new.batchsize, new.height, new.conv_height) == (7, 10, 5)
    assert (new.kernel_h, new.stride_w, new.pad_h, new.num_filters, new.bias_term) == (3, 2, 1, 5, True)
    assert (new.workspace_byte_limit, new.prefer) == (123, "limited_workspace")


def test_re_new_handle_pool_and_mismatch():
    old = PoolingHandle(raw(np.zeros((1, 2, 4, 4))), 2, 2, 0, False)
    new = utils.re_new_handle(old, raw(np.zeros((3, 2, 6, 6))), is_pool=True)
    assert type(new) is PoolingHandle and not new.is_max_pooling
    assert (new.batchsize, new.pooled_height) == (3, 3)
    with pytest.raises(TypeError, match="is_pool=False needs a ConvHandle"):
        utils.re_new_handle(old, raw(np.zeros((3, 2, 6, 6))))
    with pytest.raises(ValueError, match="channels"):  # the new input is checked like any handle's
        utils.re_new_handle(ConvHandle(raw(np.zeros((1, 2, 4, 4))), 3, 1, 1, 2, 2, False), raw(np.zeros((1, 3, 4, 4))))


def test_force_unicode():
    assert utils.force_unicode(b"caf\xc3\xa9") == "café"
    assert utils.force_unicode("plain") == "plain"
    assert utils.force_unicode(None) is None


# ---------------------------------------------------------------- graph walks
def diamond():
    """loss = sum(relu(x @ w) + x @ w) + b: the matmul output feeds two ops; x is data (not recorded)."""
    w = tensor.Tensor((4, 3), requires_grad=True, stores_grad=True, name="w")
    b = tensor.Tensor((3,), requires_grad=True, stores_grad=True, name="b")
    w.gaussian(0, 1)
    x = tensor.from_numpy(np.ones((2, 4), np.float32))
    h = autograd.matmul(x, w)
    r = autograd.relu(h)
    s = autograd.add(r, h)
    loss = autograd.add(s, b)
    return w, b, h, r, s, loss


def test_infer_dependency_counts_readers(training):
    w, b, h, r, s, loss = diamond()
    ops, tensors = infer_dependency(loss.creator)
    assert ops[h.creator] == 2 and ops[r.creator] == 1 and ops[s.creator] == 1
    assert ops[Dummy(w)] == 1 and ops[Dummy(b)] == 1  # a fresh Dummy of the same tensor is the same key
    assert loss.creator not in ops and len(ops) == 5
    assert tensors[id(h)] == 2 and tensors[id(w)] == 1 and tensors[id(s)] == 1


def test_post_order_recursive_lists_nodes_after_inputs(training):
    w, b, h, r, s, loss = diamond()
    nodes, weights, inputs = utils.post_order_recursive(loss.creator, loss)
    assert list(nodes.values()) == [h.creator, r.creator, s.creator, loss.creator]
    assert list(weights.items()) == [("w", w), ("b", b)]
    assert list(inputs) == [f"{h.creator.name}:in0"] and inputs[f"{h.creator.name}:in0"] is None
    assert post_order(loss.creator)[-1] is loss.creator


def test_post_order_handles_deep_graphs(training):
    x = tensor.Tensor((2,), requires_grad=True, stores_grad=True, name="x")
    y = x
    for _ in range(3000):  # deeper than Python's recursion limit
        y = autograd.relu(y)
    nodes, weights, _ = utils.post_order_recursive(y.creator, y)
    assert len(nodes) == 3000 and list(weights) == ["x"]


def test_graph_walks_refuse_unrecorded_or_freed_graphs(training):
    w, b, h, r, s, loss = diamond()
    list(autograd.backward(loss))
    assert infer_dependency(loss.creator)  # the graph outlives its backward, as SINGA's
    autograd.mul(w, w)  # until a new forward pass records
    with pytest.raises(ValueError, match="freed"):
        infer_dependency(loss.creator)
    autograd.training = False
    y = autograd.relu(tensor.from_numpy(np.ones(2, np.float32)))
    with pytest.raises(TypeError, match="autograd operator"):
        infer_dependency(y.creator)  # None: nothing was recorded
    with pytest.raises(TypeError, match="autograd operator"):
        post_order("loss")


def test_dummy_is_a_placeholder():
    t = tensor.Tensor((2, 3), name="data")
    d = Dummy(t)
    assert d.name == "data" and d.output_name(0) == "data" and d.grad_name(0) == "data_g"
    assert d.src == [] and d.y_id2idx == {id(t): 0} and d.shape == (2, 3)  # shape read from the tensor
    assert Dummy(t) == d and Dummy(tensor.Tensor((2, 3))) != d
    with pytest.raises(TypeError, match="placeholder"):
        d(t)
    with pytest.raises(TypeError, match="tensor.Tensor"):
        Dummy(np.ones(2))
