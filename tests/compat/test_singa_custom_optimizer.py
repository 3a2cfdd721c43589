"""An optimizer written the way SINGA's examples/cnn_ms writes its own (a subclass of opt.Optimizer that
keeps its hyper-parameters as the one-element tensors its schedules' values turn into with ``as_type``,
does tensor arithmetic with them and updates through ``singa_wrap.Axpy``) runs here and matches the
float path of our own opt.SGD. Written for these tests, in that style; not copied from SINGA."""
import pickle

import numpy as np
import pytest

from singa_lite import autograd, opt, tensor
from singa_lite import singa_wrap as singa
from singa_lite.optim.schedules import HyperValue


class TensorValueSGD(opt.Optimizer):
    """SGD with momentum and weight decay, SINGA's way: values are tensors, state is self.moments."""

    def __init__(self, lr=0.1, momentum=0.0, weight_decay=0.0, nesterov=False, dtype=tensor.float32):
        super().__init__(lr, dtype)
        self.momentum = momentum if isinstance(momentum, opt.DecayScheduler) else opt.Constant(momentum)
        self.weight_decay = (weight_decay if isinstance(weight_decay, opt.DecayScheduler)
                             else opt.Constant(weight_decay))
        self.mom_value = self.momentum(self.step_counter).as_type(self.dtype)
        self.decay_value = self.weight_decay(self.step_counter).as_type(self.dtype)
        self.nesterov = nesterov
        self.moments = {}

    def apply(self, param_name, param_value, param_grad):
        self.device_check(param_value, self.step_counter, self.lr_value, self.mom_value, self.decay_value)
        if self.weight_decay.init_value != 0:
            singa.Axpy(self.decay_value.data, param_value.data, param_grad.data)
        if self.momentum.init_value != 0:
            if param_name not in self.moments:
                self.moments[param_name] = tensor.zeros_like(param_value)
            buf = self.moments[param_name]
            buf *= self.mom_value
            one_minus_damp = 1.0 - tensor.zeros_like(self.mom_value)  # tensor arithmetic with a value tensor
            singa.Axpy(one_minus_damp.data, param_grad.data, buf.data)
            if self.nesterov:
                singa.Axpy(self.mom_value.data, buf.data, param_grad.data)
            else:
                param_grad = buf
        minus_lr = 0.0 - self.lr_value
        singa.Axpy(minus_lr.data, param_grad.data, param_value.data)

    def step(self):
        super().step()
        self.mom_value.copy_from(self.momentum(self.step_counter).as_type(self.dtype))
        self.decay_value.copy_from(self.weight_decay(self.step_counter).as_type(self.dtype))

    def get_states(self):
        states = super().get_states()
        if self.mom_value > 0:
            states["moments"] = {k: tensor.to_numpy(v) for k, v in self.moments.items()}
        return states

    def set_states(self, states):
        super().set_states(states)
        if "moments" in states:
            self.moments = {k: tensor.from_numpy(v) for k, v in states["moments"].items()}
        self.mom_value = self.momentum(self.step_counter).as_type(self.dtype)
        self.decay_value = self.weight_decay(self.step_counter).as_type(self.dtype)


def _grads(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": rng.standard_normal((3, 4)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)} for _ in range(steps)]


def _run(o, params, grads):
    ps = {n: tensor.from_numpy(v.copy()) for n, v in params.items()}
    for g in grads:
        for n in sorted(ps):
            o.apply(n, ps[n], tensor.from_numpy(g[n].copy()))
        o.step()
    return {n: tensor.to_numpy(p) for n, p in ps.items()}


@pytest.mark.parametrize("kw", [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9, weight_decay=1e-2),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=opt.ExponentialDecay(0.1, 2, 0.5), momentum=opt.LinearDecay(0.5, 0.9, 3), weight_decay=1e-3),
])
def test_singa_style_optimizer_matches_our_sgd(kw):
    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
    grads = _grads(6)
    mine = _run(TensorValueSGD(**kw), params, grads)
    ours = _run(opt.SGD(**kw), params, grads)
    for n in params:
        np.testing.assert_allclose(mine[n], ours[n], rtol=1e-5, atol=1e-6, err_msg=n)
        assert not np.allclose(mine[n], params[n])  # both moved


def test_schedule_values_work_as_singa_value_tensors():
    v = opt.ExponentialDecay(0.8, 1, 0.5)(1)
    assert isinstance(v, float) and isinstance(v, HyperValue) and v == 0.4
    t = v.as_type(tensor.float16)
    assert isinstance(t, tensor.Tensor) and t.shape == (1,) and t.dtype == tensor.float16
    assert tensor.to_numpy(t)[0] == np.float16(0.4)
    assert v.data.shape == (1,) and tensor.to_numpy(tensor.Tensor(data=v.data))[0] == np.float32(0.4)
    assert isinstance(0.0 - v, HyperValue) and float(0.0 - v) == -0.4 and float(-v) == -0.4
    assert isinstance(2 * v + 1, HyperValue) and float(2 * v + 1) == pytest.approx(1.8)
    x = tensor.from_numpy(np.array([1.0, 2.0], np.float32))
    for r in (v * x, x * v, 1.0 - v * x, v - x):
        assert isinstance(r, tensor.Tensor)
    np.testing.assert_allclose(tensor.to_numpy(v - x), [-0.6, -1.6], rtol=1e-6)
    # a pickled value (a checkpoint's configuration, a message between ranks) is the plain float
    back = pickle.loads(pickle.dumps(v))
    assert type(back) is float and back == 0.4
    # our optimizers hold them and hand them to kernels as floats
    o = opt.SGD(lr=0.1, momentum=0.9)
    assert isinstance(o.lr_value, HyperValue) and isinstance(o.mom_value, HyperValue)
    assert o.mom_value.as_type(tensor.float32).shape == (1,)


def test_singa_style_optimizer_checkpoint_round_trip():
    rng = np.random.default_rng(2)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
    grads = _grads(6, seed=3)
    whole = _run(TensorValueSGD(lr=0.05, momentum=0.9), params, grads)

    first = TensorValueSGD(lr=0.05, momentum=0.9)
    half = _run(first, params, grads[:3])
    states = first.get_states()
    assert states["step_counter"] == 3 and set(states["moments"]) == {"w", "b"}
    second = TensorValueSGD(lr=0.05, momentum=0.9)
    second.set_states(states)  # its own 'moments' entry is left to its set_states
    assert second.step_counter == 3
    rest = _run(second, half, grads[3:])
    for n in params:
        np.testing.assert_allclose(rest[n], whole[n], rtol=1e-6, atol=1e-7)
    # an optimizer that does not restore extra entries still refuses them
    with pytest.raises(ValueError, match="unknown entries"):
        opt.Adam(lr=0.05).set_states(states)


def test_singa_style_optimizer_trains_through_opt_loss():
    rng = np.random.default_rng(4)
    x = tensor.from_numpy(rng.standard_normal((8, 3)).astype(np.float32))
    y = tensor.from_numpy(rng.standard_normal((8, 2)).astype(np.float32))
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    finals = []
    for o in (TensorValueSGD(lr=0.1, momentum=0.9), opt.SGD(lr=0.1, momentum=0.9)):
        w = tensor.from_numpy(w0.copy())
        w.requires_grad = w.stores_grad = True
        w.name = "w"
        losses = []
        autograd.training = True
        try:
            for _ in range(5):
                loss = autograd.mse_loss(autograd.matmul(x, w), y)
                losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
                o(loss)
        finally:
            autograd.training = False
        assert losses[-1] < losses[0]
        finals.append(tensor.to_numpy(w))
    np.testing.assert_allclose(finals[0], finals[1], rtol=1e-5, atol=1e-6)


def test_device_check_passes_over_host_scalars_and_refuses_other_things():
    o = opt.SGD(lr=0.1)
    a = tensor.from_numpy(np.ones(2, np.float32))
    o.device_check(a, o.step_counter, o.lr_value, 0.5)
    with pytest.raises(TypeError, match="device_check: expected Tensors"):
        o.device_check(o.lr_value, a)
    with pytest.raises(TypeError, match="device_check: expected Tensors"):
        o.device_check(a, "x")


class KeptValueSGD(TensorValueSGD):
    """The same SGD written as SINGA's examples/model_selection writes its MSSGD: it keeps what the schedules
    return (no as_type) and copies each step's new value into it, as SINGA's own Optimizer.step does."""

    def __init__(self, lr=0.1, momentum=0.0, weight_decay=0.0, nesterov=False, dtype=tensor.float32):
        super().__init__(lr, momentum, weight_decay, nesterov, dtype)
        self.dampening = opt.Constant(0.0)
        self.mom_value = self.momentum(self.step_counter)
        self.dam_value = self.dampening(self.step_counter)
        self.decay_value = self.weight_decay(self.step_counter)

    def apply(self, param_name, param_value, param_grad):
        self.device_check(param_value, self.step_counter, self.lr_value, self.mom_value, self.dam_value,
                          self.decay_value)
        if self.weight_decay.init_value != 0:
            singa.Axpy(self.decay_value.data, param_value.data, param_grad.data)
        if self.momentum.init_value != 0:
            if param_name not in self.moments:
                self.moments[param_name] = tensor.zeros_like(param_value)
            buf = self.moments[param_name]
            buf *= self.mom_value
            alpha = 1.0 - self.dam_value
            singa.Axpy(alpha.data, param_grad.data, buf.data)
            param_grad = buf
        minus_lr = 0.0 - self.lr_value
        singa.Axpy(minus_lr.data, param_grad.data, param_value.data)

    def step(self):
        opt.Optimizer.step(self)
        self.mom_value.copy_from(self.momentum(self.step_counter))
        self.dam_value.copy_from(self.dampening(self.step_counter))
        self.decay_value.copy_from(self.weight_decay(self.step_counter))


def test_an_optimizer_that_copies_into_its_constant_schedule_values_matches_our_sgd():
    rng = np.random.default_rng(6)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
    grads = _grads(5, seed=7)
    kw = dict(lr=opt.ExponentialDecay(0.1, 2, 0.5), momentum=0.9, weight_decay=1e-2)
    mine = _run(KeptValueSGD(**kw), params, grads)
    ours = _run(opt.SGD(**kw), params, grads)
    for n in params:
        np.testing.assert_allclose(mine[n], ours[n], rtol=1e-5, atol=1e-6, err_msg=n)


def test_hyper_value_copy_from():
    v = opt.Constant(0.9)(0)
    for same in (0.9, opt.Constant(0.9)(3), v.as_type(tensor.float32), np.float32(0.9)):
        v.copy_from(same)  # the value it already holds (to float32, the precision of SINGA's value tensors)
        assert v == 0.9
    with pytest.raises(ValueError, match=r"immutable float \(0.9\) and cannot take 0.5.*as_type"):
        v.copy_from(0.5)
    with pytest.raises(ValueError, match="one-element tensor"):
        v.copy_from(tensor.from_numpy(np.full(2, 0.9, np.float32)))
    with pytest.raises(TypeError, match="must be a number"):
        v.copy_from("0.9")
    # a changing schedule copied into a kept value: a clear error, never a silently stale value
    o = KeptValueSGD(lr=0.1, momentum=opt.LinearDecay(0.5, 0.9, 3))
    with pytest.raises(ValueError, match="cannot take"):
        o.step()
