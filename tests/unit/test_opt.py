"""singa_lite.opt: schedules, SGD / RMSProp / AdaGrad / Adam step by step against numpy references written
here (and against torch.optim when torch is installed), checkpoints, in-place updates and error paths.

``opt(loss)`` through autograd is tested with autograd itself; here gradients are given to ``apply``.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from singa_lite import _core, opt, tensor

STEPS = 6
SHAPES = {"w": (4, 3), "b": (3,)}
FLOAT_TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-11, atol=1e-12)}


# ---------------------------------------------------------------- numpy references (float64)
def ref_sgd(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **_):
    def update(p, g, st):
        g = g + weight_decay * p
        if momentum != 0:
            st["buf"] = g.copy() if "buf" not in st else momentum * st["buf"] + (1 - dampening) * g
            g = g + momentum * st["buf"] if nesterov else st["buf"]
        return p - lr * g
    return update


def ref_rmsprop(lr=0.1, rho=0.9, epsilon=1e-8, weight_decay=0.0, **_):
    def update(p, g, st):
        g = g + weight_decay * p
        st["avg"] = rho * st.get("avg", 0.0) + (1 - rho) * g * g
        return p - lr * g / np.sqrt(st["avg"] + epsilon)
    return update


def ref_adagrad(lr=0.1, epsilon=1e-8, weight_decay=0.0, **_):
    def update(p, g, st):
        g = g + weight_decay * p
        st["h"] = st.get("h", 0.0) + g * g
        return p - lr * g / np.sqrt(st["h"] + epsilon)
    return update


def ref_adam(lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.0, **_):
    def update(p, g, st):
        g = g + weight_decay * p
        st["t"] = t = st.get("t", 0) + 1
        st["m"] = beta_1 * st.get("m", 0.0) + (1 - beta_1) * g
        st["v"] = beta_2 * st.get("v", 0.0) + (1 - beta_2) * g * g
        m_hat = st["m"] / (1 - beta_1 ** t)
        v_hat = st["v"] / (1 - beta_2 ** t)
        return p - lr * m_hat / (np.sqrt(v_hat) + epsilon)
    return update


CASES = [
    (opt.SGD, ref_sgd, dict(lr=0.1)),
    (opt.SGD, ref_sgd, dict(lr=0.05, weight_decay=0.01)),
    (opt.SGD, ref_sgd, dict(lr=0.1, momentum=0.9)),
    (opt.SGD, ref_sgd, dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.02)),
    (opt.SGD, ref_sgd, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (opt.SGD, ref_sgd, dict(lr=0.02, momentum=0.5, weight_decay=0.1, nesterov=True)),
    (opt.RMSProp, ref_rmsprop, dict()),
    (opt.RMSProp, ref_rmsprop, dict(lr=0.01, rho=0.5, epsilon=1e-4, weight_decay=0.05)),
    (opt.AdaGrad, ref_adagrad, dict()),
    (opt.AdaGrad, ref_adagrad, dict(lr=0.3, epsilon=1e-3, weight_decay=0.1)),
    (opt.Adam, ref_adam, dict()),
    (opt.Adam, ref_adam, dict(lr=0.05, beta_1=0.5, beta_2=0.9, epsilon=1e-6, weight_decay=0.1)),
    (opt.Adam, ref_adam, dict(lr=0.01, beta_1=0.0, weight_decay=0.01)),
]


def case_id(case):
    cls, _, kw = case
    return cls.__name__ + "(" + ",".join(f"{k}={v}" for k, v in kw.items()) + ")"


def make_data(seed, dtype, steps=STEPS, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    params = {n: rng.normal(size=s).astype(dtype) for n, s in shapes.items()}
    grads = [{n: rng.normal(size=s).astype(dtype) for n, s in shapes.items()} for _ in range(steps)]
    return params, grads


def to_tensors(params):
    out = {}
    for n, a in params.items():
        t = tensor.from_numpy(a)
        t.name = n
        out[n] = t
    return out


def run_steps(o, ptensors, grads):
    """One apply per parameter then one step() per iteration; returns the values after every step."""
    history = []
    for gs in grads:
        for n, p in ptensors.items():
            o.apply(n, p, tensor.from_numpy(gs[n]))
        o.step()
        history.append({n: tensor.to_numpy(p) for n, p in ptensors.items()})
    return history


# ---------------------------------------------------------------- step by step against numpy
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_numpy_reference(case, dtype):
    cls, ref, kw = case
    params, grads = make_data(1, dtype)
    o = cls(**kw)
    pt = to_tensors(params)
    got = run_steps(o, pt, grads)
    for n in params:
        update, st, p = ref(**kw), {}, params[n].astype(np.float64)
        for step, gs in enumerate(grads):
            p = update(p, gs[n].astype(np.float64), st)
            g = got[step][n]
            assert g.dtype == dtype
            np.testing.assert_allclose(g, p, **FLOAT_TOL[dtype], err_msg=f"{n} after step {step + 1}")


def test_defaults_follow_singa():
    sgd = opt.SGD()
    assert (sgd.lr_value, sgd.mom_value, sgd.dam_value, sgd.decay_value, sgd.nesterov) == (0.1, 0, 0, 0, False)
    r = opt.RMSProp()
    assert (r.lr_value, r.rho_value, r.epsilon_value, r.decay_value) == (0.1, 0.9, 1e-8, 0)
    a = opt.AdaGrad()
    assert (a.lr_value, a.epsilon_value, a.decay_value) == (0.1, 1e-8, 0)
    adam = opt.Adam()
    assert (adam.lr_value, adam.beta_1_value, adam.beta_2_value, adam.epsilon_value, adam.decay_value) == \
        (0.001, 0.9, 0.999, 1e-8, 0)
    assert opt.SGD(lr=1, momentum=0.9, dtype=tensor.float16).dtype == tensor.float16  # SINGA's dtype= is accepted


def test_float16_sgd():
    params, grads = make_data(2, np.float16, steps=5)
    kw = dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    got = run_steps(opt.SGD(**kw), to_tensors(params), grads)
    update, st, p = ref_sgd(**kw), {}, params["w"].astype(np.float64)
    for step, gs in enumerate(grads):
        p = update(p, gs["w"].astype(np.float64), st)
        np.testing.assert_allclose(got[step]["w"].astype(np.float64), p, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cls", [opt.Adam, opt.RMSProp, opt.AdaGrad])
def test_adaptive_optimizers_refuse_float16(cls):
    p = tensor.from_numpy(np.ones(3, np.float16))
    with pytest.raises(TypeError, match="float32 master weights"):
        cls().apply("p", p, tensor.from_numpy(np.ones(3, np.float16)))


def test_adam_bias_correction_counts_each_parameters_updates():
    # "late" first gets a gradient at the third step: its first update is Adam's first (t = 1), as in torch.
    o = opt.Adam(lr=0.1)
    early, late = tensor.from_numpy(np.zeros(2)), tensor.from_numpy(np.zeros(2))
    for _ in range(2):
        o.apply("early", early, tensor.from_numpy(np.ones(2)))
        o.step()
    o.apply("late", late, tensor.from_numpy(np.ones(2)))
    np.testing.assert_allclose(tensor.to_numpy(late), -0.1 / (1 + 1e-8), rtol=1e-12)
    assert o.get_states()["t"] == {"early": 2, "late": 1}


# ---------------------------------------------------------------- against torch.optim
def _torch_case(cls, kw):
    import torch

    kw = dict(kw)
    if cls is opt.SGD:
        return torch.optim.SGD, kw
    if cls is opt.Adam:
        return torch.optim.Adam, dict(lr=kw.get("lr", 0.001), betas=(kw.get("beta_1", 0.9), kw.get("beta_2", 0.999)),
                                      eps=kw.get("epsilon", 1e-8), weight_decay=kw.get("weight_decay", 0))
    if cls is opt.RMSProp:
        return torch.optim.RMSprop, dict(lr=kw.get("lr", 0.1), alpha=kw.get("rho", 0.9),
                                         eps=kw.get("epsilon", 1e-8), weight_decay=kw.get("weight_decay", 0))
    return torch.optim.Adagrad, dict(lr=kw.get("lr", 0.1), eps=kw.get("epsilon", 1e-8),
                                     weight_decay=kw.get("weight_decay", 0))


TORCH_CASES = [
    (opt.SGD, dict(lr=0.1)),
    (opt.SGD, dict(lr=0.05, weight_decay=0.01)),
    (opt.SGD, dict(lr=0.1, momentum=0.9)),
    (opt.SGD, dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.02)),
    (opt.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (opt.SGD, dict(lr=0.02, momentum=0.5, weight_decay=0.1, nesterov=True)),
    (opt.Adam, dict()),
    (opt.Adam, dict(lr=0.05, beta_1=0.5, beta_2=0.9, epsilon=1e-6, weight_decay=0.1)),
    # SINGA puts RMSProp's and AdaGrad's epsilon inside the square root, torch outside: equal for epsilon = 0
    (opt.RMSProp, dict(lr=0.01, rho=0.8, epsilon=0.0)),
    (opt.RMSProp, dict(lr=0.01, rho=0.5, epsilon=0.0, weight_decay=0.05)),
    (opt.AdaGrad, dict(lr=0.3, epsilon=0.0)),
    (opt.AdaGrad, dict(lr=0.1, epsilon=0.0, weight_decay=0.1)),
    # ... and close for a small epsilon
    (opt.RMSProp, dict(lr=0.01, epsilon=1e-8)),
    (opt.AdaGrad, dict(lr=0.1, epsilon=1e-8)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda c: case_id((c[0], None, c[1])))
def test_matches_torch_optim(case, dtype):
    torch = pytest.importorskip("torch")
    cls, kw = case
    params, grads = make_data(3, dtype)
    tparams = [torch.tensor(params[n], requires_grad=True) for n in params]
    tcls, tkw = _torch_case(cls, kw)
    topt = tcls(tparams, **tkw)
    o = cls(**kw)
    pt = to_tensors(params)
    got = run_steps(o, pt, grads)
    loose = kw.get("epsilon", 0.0) != 0.0 and cls in (opt.RMSProp, opt.AdaGrad)
    tol = dict(rtol=1e-5, atol=1e-6) if loose or dtype == np.float32 else dict(rtol=1e-11, atol=1e-12)
    for step, gs in enumerate(grads):
        for tp, n in zip(tparams, params):
            tp.grad = torch.tensor(gs[n])
        topt.step()
        for tp, n in zip(tparams, params):
            np.testing.assert_allclose(got[step][n], tp.detach().numpy(), **tol, err_msg=f"{n} after {step + 1}")


# ---------------------------------------------------------------- schedules
def test_schedule_values():
    assert [opt.Constant(0.3)(s) for s in (0, 5, 100)] == [0.3, 0.3, 0.3]

    e = opt.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    for s in (0, 1, 5, 10, 25):
        assert e(s) == pytest.approx(0.1 * 0.5 ** (s / 10), rel=1e-12)
    es = opt.ExponentialDecay(0.1, 10, 0.5, staircase=True)
    assert [es(s) for s in (0, 9, 10, 19, 20, 35)] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.0125])

    sd = opt.StepDecay(1.0, step_size=3, gamma=0.1)
    assert [sd(s) for s in range(8)] == pytest.approx([1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01])

    lin = opt.LinearDecay(1.0, 0.2, decay_steps=4)
    assert [lin(s) for s in range(7)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2])

    # SINGA passes its step counter as a one-element tensor
    assert e(tensor.from_numpy(np.array([5.0], np.float32))) == pytest.approx(e(5))


def test_custom_schedule_singa_style():
    class Warmup(opt.DecayScheduler):
        def call(self, step):
            return self.init_value * min(1.0, (step + 1) / 4)

    o = opt.SGD(lr=Warmup(0.4), momentum=opt.LinearDecay(0.5, 0.9, 4))
    seen = []
    for _ in range(6):
        seen.append((o.lr_value, o.mom_value))
        o.step()
    assert [v[0] for v in seen] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    assert [v[1] for v in seen] == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9, 0.9])


def test_scheduled_lr_drives_updates():
    sched = opt.ExponentialDecay(0.2, decay_steps=2, decay_rate=0.5)
    o = opt.SGD(lr=sched)
    p = tensor.from_numpy(np.zeros(2))
    expected = 0.0
    for step in range(5):
        assert o.lr_value == pytest.approx(sched(step)) and o.step_counter == step
        o.apply("p", p, tensor.from_numpy(np.ones(2)))
        expected -= sched(step)
        o.step()
    np.testing.assert_allclose(tensor.to_numpy(p), expected, rtol=1e-12)


@pytest.mark.parametrize("make", [
    lambda: opt.ExponentialDecay(0.1, 0, 0.5),
    lambda: opt.ExponentialDecay(0.1, 10, -0.5),
    lambda: opt.StepDecay(0.1, 0, 0.5),
    lambda: opt.StepDecay(0.1, 2.5, 0.5),
    lambda: opt.LinearDecay(0.1, 0.0, -1),
])
def test_bad_schedules(make):
    with pytest.raises(ValueError):
        make()
    with pytest.raises(TypeError):
        opt.Constant("0.1")
    with pytest.raises(ValueError, match="step"):
        opt.Constant(0.1)(-1)


def test_schedule_that_leaves_the_domain_fails_at_step_and_changes_nothing():
    o = opt.SGD(lr=opt.LinearDecay(0.2, -0.2, 4))  # reaches lr < 0 at step 3
    o.step()
    o.step()
    with pytest.raises(ValueError, match="lr must be >= 0"):
        o.step()
    assert o.step_counter == 2 and o.lr_value == pytest.approx(0.0)


# ---------------------------------------------------------------- state and checkpoints
@pytest.mark.parametrize("case", [CASES[3], CASES[5], CASES[7], CASES[9], CASES[11]], ids=case_id)
def test_states_round_trip_continues_identically(case):
    cls, _, kw = case
    params, grads = make_data(4, np.float32, steps=8)
    a = cls(**kw)
    pa = to_tensors(params)
    run_steps(a, pa, grads[:3])
    states = a.get_states()
    # plain data: numpy arrays and Python numbers, nothing that needs pickle
    assert states["step_counter"] == 3
    for k, v in states.items():
        if isinstance(v, dict):
            assert v and all(isinstance(x, (np.ndarray, int, float)) for x in v.values()), k
    saved = {k: ({n: np.array(x, copy=True) for n, x in v.items()} if isinstance(v, dict) else v)
             for k, v in states.items()}

    b = cls(**kw)
    pb = to_tensors({n: tensor.to_numpy(p) for n, p in pa.items()})
    b.load_state_dict(saved)
    assert b.step_counter == 3 and b.lr_value == a.lr_value
    ha = run_steps(a, pa, grads[3:])
    hb = run_steps(b, pb, grads[3:])
    for sa, sb in zip(ha, hb):
        for n in sa:
            np.testing.assert_array_equal(sa[n], sb[n])
    # the saved copy was not aliased by the optimizer
    assert all(np.array_equal(saved[k][n], states[k][n]) for k in saved if isinstance(saved[k], dict)
               for n in saved[k])


def test_state_dict_aliases_and_singa_style_states():
    o = opt.SGD(lr=opt.StepDecay(0.1, 2, 0.5), momentum=0.9)
    assert opt.SGD.state_dict is opt.SGD.get_states and opt.SGD.load_state_dict is opt.SGD.set_states
    # SINGA's get_states held a float32 step counter and tensors
    o.set_states({"step_counter": np.float32(4.0),
                  "moments": {"w": tensor.from_numpy(np.ones((2, 2), np.float32))}})
    assert o.step_counter == 4 and o.lr_value == pytest.approx(0.025)
    p = tensor.from_numpy(np.zeros((2, 2)))  # float64 parameter: the float32 state is cast to it
    o.apply("w", p, tensor.from_numpy(np.zeros((2, 2))))
    np.testing.assert_allclose(tensor.to_numpy(p), -0.025 * 0.9)
    assert o.moments["w"].dtype == tensor.float64


def test_state_is_created_lazily_per_name():
    o = opt.Adam()
    assert o.get_states() == {"step_counter": 0, "m": {}, "v": {}, "t": {}}
    w = tensor.from_numpy(np.ones((2, 3), np.float64))
    o.apply("w", w, tensor.from_numpy(np.ones((2, 3))))
    assert set(o.m) == set(o.v) == {"w"}
    assert o.m["w"].shape == (2, 3) and o.m["w"].dtype == tensor.float64
    assert o.m["w"].data.data_ptr != w.data.data_ptr
    o.apply("b", tensor.from_numpy(np.ones(3)), tensor.from_numpy(np.ones(3)))
    assert set(o.m) == {"w", "b"}

    sgd = opt.SGD(lr=0.1)  # no momentum: no state at all
    sgd.apply("w", w, tensor.from_numpy(np.ones((2, 3))))
    assert sgd.moments == {}
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    sgd.apply("w", w, tensor.from_numpy(np.ones((2, 3))))
    assert set(sgd.moments) == {"w"}


def test_set_states_rejects_bad_input_and_changes_nothing():
    o = opt.Adam()
    w = tensor.from_numpy(np.ones(3))
    o.apply("w", w, tensor.from_numpy(np.ones(3)))
    o.step()
    before = o.get_states()
    with pytest.raises(ValueError, match="unknown entries"):
        o.set_states({"step_counter": 1, "moments": {}})
    with pytest.raises(ValueError, match="step_counter"):
        o.set_states({"step_counter": -1})
    with pytest.raises(ValueError, match="step_counter"):
        o.set_states({"m": {}})
    with pytest.raises(ValueError, match="must be a number"):
        o.set_states({"step_counter": 1, "t": {"w": "x"}})
    after = o.get_states()
    assert after["step_counter"] == before["step_counter"] and after["t"] == before["t"]
    np.testing.assert_array_equal(after["m"]["w"], before["m"]["w"])


def test_loaded_state_of_the_wrong_shape_raises_before_updating():
    o = opt.SGD(lr=0.1, momentum=0.9)
    o.set_states({"step_counter": 0, "moments": {"w": np.zeros((2, 2), np.float32)}})
    w = tensor.from_numpy(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="state 'moments' has shape"):
        o.apply("w", w, tensor.from_numpy(np.ones(3, np.float32)))
    np.testing.assert_array_equal(tensor.to_numpy(w), 1)


# ---------------------------------------------------------------- in place
@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[7], CASES[9], CASES[11]], ids=case_id)
def test_update_is_in_place(case):
    cls, _, kw = case
    w = tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    core, ptr = w.data, w.data.data_ptr
    row = w[1]          # a view (1, 4): shares the storage
    npview = np.asarray(w)  # numpy reads the tensor's memory
    g = tensor.from_numpy(np.ones((3, 4), np.float32))
    g_before = tensor.to_numpy(g)
    o = cls(**kw)
    for _ in range(3):
        o.apply("w", w, g)
        o.step()
    assert w.data is core and w.data.data_ptr == ptr
    after = tensor.to_numpy(w)
    assert not np.array_equal(after, np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(tensor.to_numpy(row), after[1:2])
    np.testing.assert_array_equal(npview, after)
    np.testing.assert_array_equal(tensor.to_numpy(g), g_before)  # the gradient is left as it was


@pytest.mark.parametrize("case", [CASES[3], CASES[11]], ids=case_id)
def test_strided_parameter_view(case):
    cls, ref, kw = case
    base = tensor.from_numpy(np.arange(12, dtype=np.float64).reshape(3, 4))
    w = tensor.Tensor(data=base.data.transpose([]))  # a (4, 3) non-contiguous view of base
    assert not w.is_contiguous()
    grads = [np.random.default_rng(i).normal(size=(4, 3)) for i in range(3)]
    o = cls(**kw)
    update, st, p = ref(**kw), {}, np.arange(12, dtype=np.float64).reshape(3, 4).T
    for g in grads:
        o.apply("w", w, tensor.from_numpy(g))
        o.step()
        p = update(p, g, st)
    np.testing.assert_allclose(tensor.to_numpy(base), p.T, rtol=1e-12, atol=1e-12)


def test_raw_core_gradient_is_accepted():
    w = tensor.from_numpy(np.ones(3))
    opt.SGD(lr=0.5).apply("w", w, _core.Tensor.from_buffer(np.ones(3)))
    np.testing.assert_allclose(tensor.to_numpy(w), 0.5)


# ---------------------------------------------------------------- names, update(), the contract
def test_update_names_unnamed_parameters_and_warns():
    o = opt.SGD(lr=0.1, momentum=0.9)
    a, b = tensor.from_numpy(np.ones(2)), tensor.from_numpy(np.ones(3))
    with pytest.warns(DeprecationWarning):
        o.update(a, tensor.from_numpy(np.ones(2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        o.update(b, tensor.from_numpy(np.ones(3)))
        o.update(a, tensor.from_numpy(np.ones(2)))
    assert (a.name, b.name) == ("param0", "param1")
    assert set(o.moments) == {"param0", "param1"}
    named = tensor.from_numpy(np.ones(2))
    named.name = "fc.W"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        o.update(named, tensor.from_numpy(np.ones(2)))
    assert named.name == "fc.W" and "fc.W" in o.moments


def test_a_subclass_written_to_the_contract_gets_schedules_and_checkpoints():
    class SignSGD(opt.Optimizer):
        """param -= lr * sign(grad + ...) with a step count per parameter, to exercise the contract."""
        _state_slots = ("last",)
        _scalar_slots = ("count",)

        def __init__(self, lr=0.1, scale=1.0):
            super().__init__(lr)
            self.scale = self._hyper("scale", scale)

        def apply(self, param_name, param_value, param_grad):
            g = self._check(param_name, param_value, param_grad)
            last = self._get_state("last", param_name, param_value)
            last = (last if last is not None else self._new_state("last", param_name, param_value)).data
            _core.sign(g, out=last)
            _core.axpy_(-self.lr_value * self.scale_value, last, param_value.data)
            self.count[param_name] = self.count.get(param_name, 0) + 1

    o = SignSGD(lr=opt.StepDecay(1.0, 1, 0.5), scale=2.0)
    w = tensor.from_numpy(np.zeros(3))
    for _ in range(2):
        o.apply("w", w, tensor.from_numpy(np.array([1.0, -2.0, 0.0])))
        o.step()
    np.testing.assert_allclose(tensor.to_numpy(w), [-3.0, 3.0, 0.0])
    st = o.get_states()
    assert st["count"] == {"w": 2} and st["step_counter"] == 2
    o2 = SignSGD(lr=opt.StepDecay(1.0, 1, 0.5), scale=2.0)
    o2.set_states(st)
    assert o2.lr_value == 0.25 and o2.count == {"w": 2}
    with pytest.raises(ValueError, match="scale must be >= 0"):
        SignSGD(scale=-1.0)
    with pytest.raises(NotImplementedError):
        opt.Optimizer(0.1).apply("w", w, w)


# ---------------------------------------------------------------- bad hyper-parameters
@pytest.mark.parametrize("make, match", [
    (lambda: opt.SGD(lr=-0.1), "lr must be >= 0"),
    (lambda: opt.SGD(lr=math.nan), "lr must be >= 0"),
    (lambda: opt.SGD(momentum=-0.1), "momentum must be in"),
    (lambda: opt.SGD(momentum=1.0), "momentum must be in"),
    (lambda: opt.SGD(momentum=0.9, dampening=1.5), "dampening must be in"),
    (lambda: opt.SGD(weight_decay=-1e-4), "weight_decay must be >= 0"),
    (lambda: opt.SGD(nesterov=True), "Nesterov"),
    (lambda: opt.SGD(momentum=0.9, dampening=0.1, nesterov=True), "Nesterov"),
    (lambda: opt.Adam(lr=-1), "lr must be >= 0"),
    (lambda: opt.Adam(beta_1=1.0), "beta_1 must be in"),
    (lambda: opt.Adam(beta_2=-0.5), "beta_2 must be in"),
    (lambda: opt.Adam(epsilon=-1e-8), "epsilon must be >= 0"),
    (lambda: opt.Adam(weight_decay=-1), "weight_decay must be >= 0"),
    (lambda: opt.RMSProp(rho=1.0), "rho must be in"),
    (lambda: opt.RMSProp(epsilon=math.inf), "epsilon must be >= 0"),
    (lambda: opt.AdaGrad(epsilon=-1.0), "epsilon must be >= 0"),
    (lambda: opt.AdaGrad(lr=opt.Constant(-0.1)), "lr must be >= 0"),
])
def test_bad_hyper_parameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("make", [lambda: opt.SGD(lr="0.1"), lambda: opt.SGD(lr=None), lambda: opt.Adam(beta_1=True),
                                  lambda: opt.SGD(dtype="complex64")])
def test_bad_hyper_parameter_types_raise(make):
    with pytest.raises(TypeError):
        make()


# ---------------------------------------------------------------- bad gradients
def _bad_grads():
    return [
        (lambda: tensor.from_numpy(np.ones((4, 3), np.float32)), ValueError, "shape"),
        (lambda: tensor.from_numpy(np.ones((1, 4), np.float32)), ValueError, "shape"),  # would broadcast
        (lambda: tensor.from_numpy(np.ones((3, 4), np.float64)), TypeError, "float64"),
        (lambda: np.ones((3, 4), np.float32), TypeError, "gradient must be a tensor"),
    ]


@pytest.mark.parametrize("cls", [lambda: opt.SGD(momentum=0.9, weight_decay=0.1), opt.Adam, opt.RMSProp,
                                 opt.AdaGrad], ids=["SGD", "Adam", "RMSProp", "AdaGrad"])
@pytest.mark.parametrize("bad", range(4))
def test_mismatched_gradient_raises_and_changes_nothing(cls, bad):
    make_grad, exc, match = _bad_grads()[bad]
    o = cls()
    w = tensor.from_numpy(np.ones((3, 4), np.float32))
    with pytest.raises(exc, match=match):
        o.apply("w", w, make_grad())
    np.testing.assert_array_equal(tensor.to_numpy(w), 1)
    assert all(v == {} for k, v in o.get_states().items() if k != "step_counter")  # no state was created
    # after a good step the state exists; a bad one then leaves parameter and state as they were
    o.apply("w", w, tensor.from_numpy(np.full((3, 4), 0.5, np.float32)))
    snap_w, snap_s = tensor.to_numpy(w), o.get_states()
    with pytest.raises(exc, match=match):
        o.apply("w", w, make_grad())
    np.testing.assert_array_equal(tensor.to_numpy(w), snap_w)
    for k, v in o.get_states().items():
        if isinstance(v, dict):
            for n in v:
                np.testing.assert_array_equal(v[n], snap_s[k][n])


def test_non_float_parameters_are_refused():
    w = tensor.from_numpy(np.ones(3, np.int32))
    with pytest.raises(TypeError, match="int32"):
        opt.SGD().apply("w", w, tensor.from_numpy(np.ones(3, np.int32)))
    with pytest.raises(TypeError, match="tensor.Tensor"):
        opt.SGD().apply("w", np.ones(3), tensor.from_numpy(np.ones(3)))
