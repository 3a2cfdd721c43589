"""The autograd operator cases: each names the op, a function of Tensors, its numpy reference and the input
shapes (or generators). Shared by tests/unit/test_autograd_ops.py (CPU, against numpy and finite
differences) and tests/gpu/test_gpu_autograd.py (GPU against CPU)."""
import numpy as np

from singa_lite import autograd, tensor


def param(a):
    return tensor.Tensor(data=np.asarray(a, np.float64), requires_grad=True, stores_grad=True)


def away(lo, hi, kinks=(0.0,), gap=0.05):
    """Uniform values in [lo, hi) kept at least `gap` from the kinks (where the derivative jumps)."""
    def gen(rng, shape):
        a = rng.uniform(lo, hi, shape)
        for k in kinks:
            near = np.abs(a - k) < gap
            a = np.where(near, k + np.where(a >= k, gap, -gap) * 2, a)
        return a
    return gen


def normal(rng, shape):
    return rng.standard_normal(shape)


def positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def _erf(a):
    from math import erf
    return np.vectorize(erf)(a)


def np_softmax(a, axis):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(a, axis):
    s = a - a.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


ONEHOT = np.eye(4)[[1, 3, 0]]  # (3, 4)
TARGET = np.linspace(-1.0, 1.0, 12).reshape(3, 4)  # regression targets (they get no gradient)


def np_layer_norm(x, g, b, n, eps=1e-5):
    axes = tuple(range(x.ndim - n, x.ndim))
    xhat = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return xhat * g + b


def np_attention(q, k, v, heads, bias=0.0):
    """Multi-head attention of (B, L, E) q, k, v (E split into heads), bias added to the (B, H, Lq, Lk) scores."""
    def split(t):
        b, n, e = t.shape
        return t.reshape(b, n, heads, e // heads).transpose(0, 2, 1, 3)
    qh, kh, vh = split(q), split(k), split(v)
    w = np_softmax(qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(qh.shape[-1]) + bias, -1)
    o = w @ vh
    return o.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)


PADDING = np.array([[0, 0, 0, 1], [0, 0, 0, 0]], np.int32)  # the first sequence's last key is padding
BLOCKED = np.triu(np.ones((4, 4), bool), 1) | PADDING.astype(bool)[:, None, None, :]  # causal, and the padding


def loss(value):
    """A loss as SINGA returns it: shape (1,)."""
    return np.reshape(value, (1,))

# (id, autograd function of Tensors, numpy reference, input shapes or (shape, generator) pairs)
CASES = [
    ("add", autograd.add, np.add, [(3, 4), (3, 4)]),
    ("add_broadcast", autograd.add, np.add, [(3, 1, 4), (5, 4)]),
    ("add_scalar_tensor", autograd.add, np.add, [(2, 3), ()]),
    ("sub_broadcast", autograd.sub, np.subtract, [(5, 4), (3, 1, 4)]),
    ("mul_broadcast", autograd.mul, np.multiply, [(3, 1, 4), (5, 1)]),
    ("div_broadcast", autograd.div, np.divide, [(2, 3, 4), ((3, 1), positive)]),
    ("pow", autograd.pow, np.power, [((3, 4), positive), (3, 4)]),
    ("pow_broadcast", autograd.pow, np.power, [((2, 1, 3), positive), (4, 1)]),
    ("pow_scalar", lambda a: autograd.pow(a, 3.0), lambda a: a ** 3.0, [(3, 4)]),
    ("pow_scalar_frac", lambda a: autograd.pow(a, 0.5), np.sqrt, [((5,), positive)]),
    ("add_number", lambda a: autograd.mul(autograd.add(a, 2.0), 3.0), lambda a: (a + 2) * 3, [(4,)]),
    ("matmul", autograd.matmul, np.matmul, [(3, 4), (4, 5)]),
    ("matmul_batched", autograd.matmul, np.matmul, [(2, 3, 4), (2, 4, 5)]),
    ("matmul_batch_2d", autograd.matmul, np.matmul, [(2, 3, 4), (4, 5)]),
    ("matmul_2d_batch", autograd.matmul, np.matmul, [(3, 4), (2, 4, 5)]),
    ("matmul_broadcast", autograd.matmul, np.matmul, [(2, 1, 3, 4), (3, 4, 2)]),
    ("matmul_vec_mat", autograd.matmul, np.matmul, [(4,), (4, 3)]),
    ("matmul_mat_vec", autograd.matmul, np.matmul, [(3, 4), (4,)]),
    ("matmul_vec_vec", autograd.matmul, np.matmul, [(4,), (4,)]),
    ("add_bias_rows", autograd.add_bias, lambda x, b: x + b[None, :], [(3, 4), (4,)]),
    ("add_bias_cols", lambda x, b: autograd.add_bias(x, b, axis=1), lambda x, b: x + b[:, None], [(3, 4), (3,)]),
    ("reshape", lambda x: autograd.reshape(x, [0, -1]), lambda x: x.reshape(x.shape[0], -1), [(2, 3, 4)]),
    ("flatten", autograd.flatten, lambda x: x.reshape(2, -1), [(2, 3, 4)]),
    ("flatten_axis2", lambda x: autograd.flatten(x, 2), lambda x: x.reshape(6, -1), [(2, 3, 4)]),
    ("transpose", lambda x: autograd.transpose(x, (1, 2, 0)), lambda x: x.transpose(1, 2, 0), [(2, 3, 4)]),
    ("transpose_default", autograd.transpose, np.transpose, [(2, 3, 4)]),
    ("cat", lambda a, b: autograd.cat([a, b], 1), lambda a, b: np.concatenate([a, b], 1), [(2, 3), (2, 4)]),
    ("concat_neg_axis", lambda a, b, c: autograd.concat([a, b, c], -1),
     lambda a, b, c: np.concatenate([a, b, c], -1), [(2, 1), (2, 2), (2, 3)]),
    ("split_used", lambda x: autograd.mul(*autograd.split(x, 1, [2, 2])),
     lambda x: x[:, :2] * x[:, 2:], [(3, 4)]),
    ("split_one_unused", lambda x: autograd.split(x, 0, None, 3)[1], lambda x: x[2:4], [(6, 2)]),
    ("slice", lambda x: autograd.slice(x, [1, 0], [3, 100], [0, -1], [1, 2]), lambda x: x[1:3, 0::2], [(4, 5)]),
    ("slice_neg_step", lambda x: autograd.slice(x, [-1], [-100], [1], [-2]), lambda x: x[:, ::-2], [(2, 5)]),
    ("sum_nary", lambda a, b, c: autograd.sum(a, b, c), lambda a, b, c: a + b + c, [(2, 3), (2, 3), (3,)]),
    ("mean_nary", lambda a, b: autograd.mean(a, b), lambda a, b: (a + b) / 2, [(2, 3), (2, 3)]),
    ("reduce_sum_all", autograd.reduce_sum, lambda x: x.sum(keepdims=True), [(2, 3, 4)]),
    ("reduce_sum_axes", lambda x: autograd.reduce_sum(x, [0, -1], 0), lambda x: x.sum((0, 2)), [(2, 3, 4)]),
    ("reduce_mean_axis", lambda x: autograd.reduce_mean(x, [1]), lambda x: x.mean(1, keepdims=True), [(2, 3, 4)]),
    ("reduce_mean_all", lambda x: autograd.reduce_mean(x, None, 0), lambda x: loss(x.mean()), [(3, 4)]),
    ("relu", autograd.relu, lambda x: np.maximum(x, 0), [((3, 4), away(-2, 2))]),
    ("leakyrelu", autograd.leakyrelu, lambda x: np.where(x >= 0, x, 0.01 * x), [((3, 4), away(-2, 2))]),
    ("leakyrelu_a", lambda x: autograd.leakyrelu(x, 0.2), lambda x: np.where(x >= 0, x, 0.2 * x),
     [((3, 4), away(-2, 2))]),
    ("sigmoid", autograd.sigmoid, lambda x: 1 / (1 + np.exp(-x)), [(3, 4)]),
    ("tanh", autograd.tanh, np.tanh, [(3, 4)]),
    ("softplus", autograd.softplus, lambda x: np.log1p(np.exp(x)), [(3, 4)]),
    ("elu", autograd.elu, lambda x: np.where(x > 0, x, np.expm1(x)), [((3, 4), away(-2, 2))]),
    ("elu_alpha", lambda x: autograd.elu(x, 0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)),
     [((3, 4), away(-2, 2))]),
    ("gelu", autograd.gelu, lambda x: x * 0.5 * (1 + _erf(x / np.sqrt(2))), [((3, 4), away(-3, 3))]),
    ("exp", autograd.exp, np.exp, [(3, 4)]),
    ("log", autograd.log, np.log, [((3, 4), positive)]),
    ("sqrt", autograd.sqrt, np.sqrt, [((3, 4), positive)]),
    ("abs", autograd.abs, np.abs, [((3, 4), away(-2, 2))]),
    ("negative", autograd.negative, np.negative, [(3, 4)]),
    ("identity", autograd.identity, lambda x: x, [(3, 4)]),
    ("clip", lambda x: autograd.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5),
     [((4, 5), away(-2, 2, kinks=(-0.5, 0.5)))]),
    ("clip_min_only", lambda x: autograd.clip(x, 0.0), lambda x: np.maximum(x, 0.0), [((4, 5), away(-2, 2))]),
    ("softmax", autograd.softmax, lambda x: np_softmax(x, 1), [(3, 5)]),
    ("softmax_axis0", lambda x: autograd.softmax(x, 0), lambda x: np_softmax(x, 0), [(3, 5)]),
    ("softmax_3d", lambda x: autograd.softmax(x, -1), lambda x: np_softmax(x, -1), [(2, 3, 4)]),
    ("log_softmax", autograd.log_softmax, lambda x: np_log_softmax(x, 1), [(3, 5)]),
    ("cross_entropy", lambda y: autograd.cross_entropy(y, tensor.from_numpy(ONEHOT)),
     lambda y: loss(-(ONEHOT * np.log(y)).sum() / 3), [((3, 4), positive)]),
    ("softmax_cross_entropy_onehot", lambda x: autograd.softmax_cross_entropy(x, tensor.from_numpy(ONEHOT)),
     lambda x: loss(-(ONEHOT * np_log_softmax(x, 1)).sum() / 3), [(3, 4)]),
    ("softmax_cross_entropy_labels",
     lambda x: autograd.softmax_cross_entropy(x, tensor.from_numpy(np.array([1, 3, 0], np.int32))),
     lambda x: loss(-(ONEHOT * np_log_softmax(x, 1)).sum() / 3), [(3, 4)]),
    ("softmax_cross_entropy_soft",
     lambda x: autograd.softmax_cross_entropy(x, tensor.Tensor(data=np.full((3, 4), 0.4))),
     lambda x: loss(-(0.4 * np_log_softmax(x, 1)).sum() / 3), [(3, 4)]),
    ("mse_loss", lambda x: autograd.mse_loss(x, tensor.Tensor(data=TARGET)),
     lambda x: loss(((x - TARGET) ** 2).mean()), [(3, 4)]),
    ("mse_loss_broadcast", lambda x: autograd.mse_loss(x, tensor.Tensor(data=TARGET[0])),
     lambda x: loss(((x - TARGET[0]) ** 2).mean()), [(3, 4)]),
    ("cast_same_dtype", lambda x: autograd.cast(x, "float64"), lambda x: x, [(3,)]),
    ("layer_norm", lambda x, g, b: autograd.layer_norm(x, 5, g, b), lambda x, g, b: np_layer_norm(x, g, b, 1),
     [(2, 3, 5), (5,), (5,)]),
    ("layer_norm_two_axes", lambda x, g, b: autograd.layer_norm(x, (3, 4), g, b),
     lambda x, g, b: np_layer_norm(x, g, b, 2), [(2, 3, 4), (3, 4), (3, 4)]),
    ("layer_norm_plain", lambda x: autograd.layer_norm(x, 6), lambda x: np_layer_norm(x, 1.0, 0.0, 1), [(4, 6)]),
    ("attention", lambda q, k, v: autograd.scaled_dot_product_attention(q, k, v, num_heads=2),
     lambda q, k, v: np_attention(q, k, v, 2), [(2, 3, 8), (2, 5, 8), (2, 5, 8)]),
    ("attention_packed", lambda qkv: autograd.scaled_dot_product_attention(qkv, num_heads=2),
     lambda qkv: np_attention(qkv[..., :6], qkv[..., 6:12], qkv[..., 12:], 2), [(2, 4, 18)]),
    ("attention_causal_padding",
     lambda q, k, v: autograd.scaled_dot_product_attention(q, k, v, num_heads=2, is_causal=True,
                                                           key_padding_mask=PADDING),
     lambda q, k, v: np_attention(q, k, v, 2, np.where(BLOCKED, -np.inf, 0.0)),
     [(2, 4, 6), (2, 4, 6), (2, 4, 6)]),
    ("chain", lambda x, w, b: autograd.tanh(autograd.add_bias(autograd.matmul(autograd.sigmoid(x), w), b)),
     lambda x, w, b: np.tanh(1 / (1 + np.exp(-x)) @ w + b), [(3, 4), (4, 2), (2,)]),
]


def make_inputs(rng, specs):
    out = []
    for s in specs:
        shape, gen = (s, normal) if not (len(s) == 2 and callable(s[1])) else s
        out.append(np.asarray(gen(rng, shape), np.float64))
    return out
