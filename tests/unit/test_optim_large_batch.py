"""AdamW, LAMB, LARS and WarmupCosineDecay (singa_lite/optim/large_batch.py, schedules.py): AdamW against
torch.optim.AdamW, LAMB and LARS against their papers' update rules written out here in numpy, the
schedule against torch's LinearLR + CosineAnnealingLR and its closed form; checkpoints, in-place updates,
mixed precision, and clear errors. Under DistOpt on several ranks: "equivalence_other_optimizers" in
tests/multiproc/helpers/distopt_cases.py (k ranks == 1 process on the whole batch).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from singa_lite import opt, tensor
from singa_lite.optim import amp
from singa_lite.optim import one_dimensional

SHAPES = {"w": (5, 4), "b": (4,), "z": (3, 2)}  # "z" starts at zero: the trust ratios' zero-norm branch
FLOAT_TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}


def make_data(seed, dtype, steps=8, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    params = {n: rng.normal(size=s).astype(dtype) for n, s in shapes.items()}
    if "z" in params:
        params["z"][:] = 0
    grads = [{n: rng.normal(size=s).astype(dtype) for n, s in shapes.items()} for _ in range(steps)]
    return params, grads


def to_tensors(params):
    """Named parameter tensors (stores_grad: what a model's get_params() and checkpoints see)."""
    return {n: tensor.Tensor(data=a.copy(), requires_grad=True, stores_grad=True, name=n) for n, a in params.items()}


def run_steps(o, ptensors, grads):
    history = []
    for gs in grads:
        for n, p in ptensors.items():
            o.apply(n, p, tensor.from_numpy(gs[n]))
        o.step()
        history.append({n: tensor.to_numpy(p) for n, p in ptensors.items()})
    return history


# ---------------------------------------------------------------- the papers' rules, in float64
def ref_adamw(lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.01, amsgrad=False, **_):
    def update(name, p, g, st):
        st["t"] = t = st.get("t", 0) + 1
        p = p * (1 - lr * weight_decay)
        st["m"] = beta_1 * st.get("m", 0.0) + (1 - beta_1) * g
        st["v"] = beta_2 * st.get("v", 0.0) + (1 - beta_2) * g * g
        v = st["v"]
        if amsgrad:
            st["vmax"] = v = np.maximum(st.get("vmax", 0.0), v)
        m_hat, v_hat = st["m"] / (1 - beta_1 ** t), v / (1 - beta_2 ** t)
        return p - lr * m_hat / (np.sqrt(v_hat) + epsilon)
    return update


def ref_lamb(lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=0.01, bias_correction=True,
             max_trust_ratio=None, exclude=None, **_):
    """You et al. 2019, Algorithm 2, with phi the identity."""
    def update(name, p, g, st):
        st["t"] = t = st.get("t", 0) + 1
        st["m"] = m = beta_1 * st.get("m", 0.0) + (1 - beta_1) * g
        st["v"] = v = beta_2 * st.get("v", 0.0) + (1 - beta_2) * g * g
        if bias_correction:
            m, v = m / (1 - beta_1 ** t), v / (1 - beta_2 ** t)
        r = m / (np.sqrt(v) + epsilon)
        if exclude is not None and exclude(name, p):
            return p - lr * r
        r = r + weight_decay * p
        pn, rn = np.linalg.norm(p), np.linalg.norm(r)
        ratio = pn / rn if pn > 0 and rn > 0 else 1.0
        if max_trust_ratio is not None:
            ratio = min(ratio, max_trust_ratio)
        st["ratio"] = ratio
        return p - lr * ratio * r
    return update


def ref_lars(lr=0.1, momentum=0.9, weight_decay=0.0001, eta=0.001, epsilon=0.0, exclude=one_dimensional, **_):
    """You, Gitman, Ginsburg 2017, Algorithm 1 (eta: the trust coefficient of its equation 6)."""
    def update(name, p, g, st):
        if exclude is not None and exclude(name, p):
            local, d = 1.0, g
        else:
            pn, gn = np.linalg.norm(p), np.linalg.norm(g)
            local = eta * pn / (gn + weight_decay * pn + epsilon) if pn > 0 and gn > 0 else 1.0
            d = g + weight_decay * p
        st["ratio"] = local
        st["v"] = momentum * st.get("v", 0.0) + lr * local * d
        return p - st["v"]
    return update


def bias_or_z(name, p):
    return name in ("b", "z")


CASES = [
    (opt.AdamW, ref_adamw, dict()),
    (opt.AdamW, ref_adamw, dict(lr=0.05, beta_1=0.5, beta_2=0.9, epsilon=1e-6, weight_decay=0.1)),
    (opt.AdamW, ref_adamw, dict(lr=0.02, weight_decay=0.0, amsgrad=True)),
    (opt.AdamW, ref_adamw, dict(lr=0.02, beta_2=0.5, weight_decay=0.3, amsgrad=True)),
    (opt.LAMB, ref_lamb, dict()),
    (opt.LAMB, ref_lamb, dict(lr=0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-4, weight_decay=0.1)),
    (opt.LAMB, ref_lamb, dict(lr=0.05, weight_decay=0.0, bias_correction=False)),
    (opt.LAMB, ref_lamb, dict(lr=0.05, max_trust_ratio=0.5)),
    (opt.LAMB, ref_lamb, dict(lr=0.05, weight_decay=0.05, exclude=bias_or_z)),
    (opt.LARS, ref_lars, dict()),
    (opt.LARS, ref_lars, dict(lr=2.0, momentum=0.8, weight_decay=0.01, eta=0.02, epsilon=1e-3)),
    (opt.LARS, ref_lars, dict(lr=1.0, momentum=0.0, eta=0.05, exclude=None)),
    (opt.LARS, ref_lars, dict(lr=1.0, eta=0.05, weight_decay=0.1, exclude=bias_or_z)),
]


def case_id(case):
    cls, _, kw = case
    return cls.__name__ + "(" + ",".join(f"{k}={getattr(v, '__name__', v)}" for k, v in kw.items()) + ")"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_the_papers_rules(case, dtype):
    cls, ref, kw = case
    params, grads = make_data(1, dtype)
    o = cls(**kw)
    got = run_steps(o, to_tensors(params), grads)
    for n in params:
        update, st, p = ref(**kw), {}, params[n].astype(np.float64)
        for step, gs in enumerate(grads):
            p = update(n, p, gs[n].astype(np.float64), st)
            assert got[step][n].dtype == dtype
            np.testing.assert_allclose(got[step][n], p, **FLOAT_TOL[dtype], err_msg=f"{n} after step {step + 1}")
        if "ratio" in st:  # the logged trust ratio is the last one applied
            assert o.last_trust_ratio[n] == pytest.approx(st["ratio"], rel=1e-5)


def test_trust_ratio_branches():
    # zero parameter: ratio 1 (the first LAMB step moves it by lr * r); LARS's default leaves 1-D parameters out
    params, grads = make_data(2, np.float64, steps=1)
    lamb = opt.LAMB(lr=0.1, max_trust_ratio=10.0)
    run_steps(lamb, to_tensors(params), grads)
    assert lamb.last_trust_ratio["z"] == 1.0 and lamb.last_trust_ratio["w"] != 1.0
    lars = opt.LARS(lr=1.0)
    pt = to_tensors(params)
    run_steps(lars, pt, grads)
    assert lars.last_trust_ratio["b"] == 1.0 and lars.last_trust_ratio["z"] == 1.0
    assert lars.last_trust_ratio["w"] == pytest.approx(
        0.001 * np.linalg.norm(params["w"]) / (np.linalg.norm(grads[0]["w"]) + 1e-4 * np.linalg.norm(params["w"])))
    # a zero gradient: ratio 1 and nothing moves without decay
    w = tensor.from_numpy(np.ones((2, 2)))
    lars = opt.LARS(lr=1.0, weight_decay=0.0)
    lars.apply("w", w, tensor.from_numpy(np.zeros((2, 2))))
    assert lars.last_trust_ratio["w"] == 1.0
    np.testing.assert_array_equal(tensor.to_numpy(w), 1.0)
    assert one_dimensional("b", tensor.from_numpy(np.ones(3))) and not one_dimensional("w", w)


# ---------------------------------------------------------------- AdamW against torch.optim.AdamW
@pytest.mark.parametrize("kw", [dict(lr=0.01, weight_decay=0.1),
                                dict(lr=0.003, beta_1=0.8, beta_2=0.99, epsilon=1e-6, weight_decay=0.01),
                                dict(lr=0.01, weight_decay=0.05, amsgrad=True)],
                         ids=["decay", "betas", "amsgrad"])
def test_adamw_matches_torch_on_a_small_model(kw):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    names = [n for n, _ in model.named_parameters()]
    ours = {n: tensor.from_numpy(p.detach().numpy().copy()) for n, p in model.named_parameters()}
    topt = torch.optim.AdamW(model.parameters(), lr=kw["lr"], betas=(kw.get("beta_1", 0.9), kw.get("beta_2", 0.999)),
                             eps=kw.get("epsilon", 1e-8), weight_decay=kw["weight_decay"],
                             amsgrad=kw.get("amsgrad", False))
    o = opt.AdamW(**kw)
    gen = torch.Generator().manual_seed(1)
    for step in range(20):
        x, y = torch.randn(32, 6, generator=gen), torch.randint(0, 3, (32,), generator=gen)
        topt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for n, p in model.named_parameters():  # the same gradients for both
            o.apply(n, ours[n], tensor.from_numpy(p.grad.numpy().copy()))
        topt.step()
        o.step()
        for n, p in zip(names, model.parameters()):
            want = p.detach().numpy()
            got = tensor.to_numpy(ours[n])
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(),
                                       err_msg=f"{n} after step {step + 1}")


def test_adamw_decay_is_decoupled_from_adam_l2():
    # with a zero gradient Adam's L2 decay still divides by sqrt(v); AdamW shrinks by exactly 1 - lr * wd
    w = tensor.from_numpy(np.full(3, 2.0))
    o = opt.AdamW(lr=0.1, weight_decay=0.5)
    o.apply("w", w, tensor.from_numpy(np.zeros(3)))
    np.testing.assert_allclose(tensor.to_numpy(w), 2.0 * (1 - 0.05), rtol=1e-15)


# ---------------------------------------------------------------- WarmupCosineDecay
def closed_form(step, base, total, warmup, start, final):
    if step < warmup:
        return start + (base - start) * step / warmup
    if step >= total:
        return final
    return final + (base - final) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


@pytest.mark.parametrize("warmup,start,final", [(5, 0.0, 0.0), (5, 0.01, 0.002), (0, 0.0, 0.001), (1, 0.05, 0.0)])
def test_warmup_cosine_against_torch_and_closed_form(warmup, start, final):
    base, total = 0.1, 30
    s = opt.WarmupCosineDecay(base, total_steps=total, warmup_steps=warmup, start_value=start, final_value=final)
    values = [s(k) for k in range(total + 5)]
    for k, v in enumerate(values):
        assert v == pytest.approx(closed_form(k, base, total, warmup, start, final), rel=1e-12, abs=1e-15)
    assert values[warmup] == pytest.approx(base) and values[total:] == [final] * 5
    assert values[0] == pytest.approx(start if warmup else base)
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(1))
    topt = torch.optim.SGD([p], lr=base)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=total - warmup, eta_min=final)
    if warmup:
        linear = torch.optim.lr_scheduler.LinearLR(topt, start_factor=max(start / base, 1e-12), end_factor=1.0,
                                                   total_iters=warmup)
        sched = torch.optim.lr_scheduler.SequentialLR(topt, [linear, cosine], milestones=[warmup])
    else:
        sched = cosine
    for k in range(total + 1):
        assert topt.param_groups[0]["lr"] == pytest.approx(values[k], rel=1e-6, abs=1e-10), k
        topt.step()
        sched.step()


def test_warmup_cosine_drives_an_optimizer_and_survives_a_checkpoint():
    sched = opt.WarmupCosineDecay(0.4, total_steps=10, warmup_steps=4)
    o = opt.LARS(lr=sched, momentum=0.0, exclude=None, eta=1.0, weight_decay=0.0)
    assert o.lr_value == 0.0
    for _ in range(6):
        o.step()
    assert o.lr_value == pytest.approx(sched(6))
    o2 = opt.LARS(lr=sched, momentum=0.0, exclude=None, eta=1.0, weight_decay=0.0)
    o2.set_states(o.get_states())
    assert o2.lr_value == o.lr_value


@pytest.mark.parametrize("kw, exc, match", [
    (dict(total_steps=10, warmup_steps=10), ValueError, "greater than warmup_steps"),
    (dict(total_steps=5, warmup_steps=8), ValueError, "greater than warmup_steps"),
    (dict(total_steps=0), ValueError, "greater than warmup_steps"),
    (dict(total_steps=-3), ValueError, "total_steps must be an int >= 0"),
    (dict(total_steps=10.5), ValueError, "total_steps must be an int"),
    (dict(total_steps=10, warmup_steps=-1), ValueError, "warmup_steps must be an int >= 0"),
    (dict(total_steps=10, warmup_steps=True), ValueError, "warmup_steps must be an int"),
    (dict(total_steps=10, final_value=math.nan), ValueError, "final_value must be finite"),
    (dict(total_steps=10, start_value="0"), TypeError, "start_value must be a number"),
])
def test_warmup_cosine_bad_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        opt.WarmupCosineDecay(0.1, **kw)
    with pytest.raises(ValueError, match="init_value must be finite"):
        opt.WarmupCosineDecay(math.inf, 10)
    with pytest.raises(ValueError, match="step must be >= 0"):
        opt.WarmupCosineDecay(0.1, 10)(-1)


def test_a_schedule_going_negative_is_refused_by_the_optimizer():
    o = opt.AdamW(lr=opt.WarmupCosineDecay(0.1, 4, final_value=-0.1))
    with pytest.raises(ValueError, match="lr must be >= 0"):
        for _ in range(4):
            o.step()


# ---------------------------------------------------------------- checkpoints, in place, contract
STATEFUL = [CASES[3], CASES[5], CASES[8], CASES[10]]


@pytest.mark.parametrize("case", STATEFUL, ids=case_id)
def test_states_round_trip_continues_identically(case):
    cls, _, kw = case
    params, grads = make_data(4, np.float32, steps=8)
    a = cls(**kw)
    pa = to_tensors(params)
    run_steps(a, pa, grads[:3])
    states = a.get_states()
    expected_slots = {opt.AdamW: {"m", "v", "v_max", "t"}, opt.LAMB: {"m", "v", "t"}, opt.LARS: {"moments"}}[cls]
    assert set(states) == expected_slots | {"step_counter"} and states["step_counter"] == 3
    for k, v in states.items():
        if isinstance(v, dict):
            assert set(v) == set(params) and all(isinstance(x, (np.ndarray, int)) for x in v.values()), k
    saved = {k: ({n: np.array(x, copy=True) for n, x in v.items()} if isinstance(v, dict) else v)
             for k, v in states.items()}
    b = cls(**kw)
    pb = to_tensors({n: tensor.to_numpy(p) for n, p in pa.items()})
    b.set_states(saved)
    for sa, sb in zip(run_steps(a, pa, grads[3:]), run_steps(b, pb, grads[3:])):
        for n in sa:
            np.testing.assert_array_equal(sa[n], sb[n])


def test_amsgrad_slot_only_with_amsgrad():
    assert opt.AdamW().get_states() == {"step_counter": 0, "m": {}, "v": {}, "t": {}}
    assert set(opt.AdamW(amsgrad=True).state_tensors()) == {"m", "v", "v_max"}
    with pytest.raises(ValueError, match="unknown entries"):
        opt.AdamW().set_states({"step_counter": 0, "v_max": {}})


@pytest.mark.parametrize("case", [CASES[3], CASES[5], CASES[10], CASES[11]], ids=case_id)
def test_update_is_in_place_on_strided_views(case):
    cls, ref, kw = case
    base = tensor.from_numpy(np.arange(12, dtype=np.float64).reshape(3, 4) / 10 + 0.1)
    w = tensor.Tensor(data=base.data.transpose([]))  # a (4, 3) non-contiguous view of base
    assert not w.is_contiguous()
    core, ptr = w.data, w.data.data_ptr
    grads = [np.random.default_rng(i).normal(size=(4, 3)) for i in range(3)]
    o = cls(**kw)
    update, st, p = ref(**kw), {}, tensor.to_numpy(w).astype(np.float64)
    for g in grads:
        gt = tensor.from_numpy(g.copy())
        o.apply("w", w, gt)
        o.step()
        np.testing.assert_array_equal(tensor.to_numpy(gt), g)  # the gradient is left as it was
        p = update("w", p, g, st)
    assert w.data is core and w.data.data_ptr == ptr
    np.testing.assert_allclose(tensor.to_numpy(base), p.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: opt.AdamW(weight_decay=0.1, amsgrad=True), lambda: opt.LAMB(),
                                  lambda: opt.LARS(exclude=None)], ids=["AdamW", "LAMB", "LARS"])
@pytest.mark.parametrize("bad", [
    (lambda: tensor.from_numpy(np.ones((4, 3), np.float32)), ValueError, "shape"),
    (lambda: tensor.from_numpy(np.ones((3, 4), np.float64)), TypeError, "float64"),
    (lambda: np.ones((3, 4), np.float32), TypeError, "gradient must be a tensor"),
], ids=["shape", "dtype", "numpy"])
def test_bad_gradient_raises_and_changes_nothing(make, bad):
    make_grad, exc, match = bad
    o = make()
    w = tensor.from_numpy(np.ones((3, 4), np.float32))
    o.apply("w", w, tensor.from_numpy(np.full((3, 4), 0.5, np.float32)))
    snap_w, snap_s = tensor.to_numpy(w), o.get_states()
    with pytest.raises(exc, match=match):
        o.apply("w", w, make_grad())
    np.testing.assert_array_equal(tensor.to_numpy(w), snap_w)
    for k, v in o.get_states().items():
        if isinstance(v, dict):
            for n in v:
                np.testing.assert_array_equal(v[n], snap_s[k][n])


@pytest.mark.parametrize("cls", [opt.AdamW, opt.LAMB, opt.LARS])
def test_float16_parameters_need_master_weights(cls):
    p = tensor.from_numpy(np.ones(3, np.float16))
    with pytest.raises(TypeError, match="float32 master weights"):
        cls().apply("p", p, tensor.from_numpy(np.ones(3, np.float16)))


@pytest.mark.parametrize("make, exc, match", [
    (lambda: opt.AdamW(lr=-1e-3), ValueError, "AdamW: lr must be >= 0"),
    (lambda: opt.AdamW(beta_1=1.0), ValueError, r"beta_1 must be in \[0, 1\)"),
    (lambda: opt.AdamW(beta_2=-0.1), ValueError, r"beta_2 must be in \[0, 1\)"),
    (lambda: opt.AdamW(epsilon=-1e-8), ValueError, "epsilon must be >= 0"),
    (lambda: opt.AdamW(weight_decay=-0.01), ValueError, "weight_decay must be >= 0"),
    (lambda: opt.AdamW(weight_decay=math.nan), ValueError, "weight_decay must be >= 0"),
    (lambda: opt.AdamW(amsgrad=1), TypeError, "amsgrad must be True or False"),
    (lambda: opt.AdamW(lr="0.1"), TypeError, "lr must be a number or a DecayScheduler"),
    (lambda: opt.LAMB(lr=-0.1), ValueError, "LAMB: lr must be >= 0"),
    (lambda: opt.LAMB(beta_1=1.5), ValueError, "beta_1 must be in"),
    (lambda: opt.LAMB(beta_2=1.0), ValueError, "beta_2 must be in"),
    (lambda: opt.LAMB(epsilon=math.inf), ValueError, "epsilon must be >= 0"),
    (lambda: opt.LAMB(weight_decay=-1), ValueError, "weight_decay must be >= 0"),
    (lambda: opt.LAMB(max_trust_ratio=0), ValueError, "max_trust_ratio must be None or a finite number > 0"),
    (lambda: opt.LAMB(max_trust_ratio=math.inf), ValueError, "max_trust_ratio"),
    (lambda: opt.LAMB(max_trust_ratio="10"), ValueError, "max_trust_ratio"),
    (lambda: opt.LAMB(bias_correction="yes"), TypeError, "bias_correction must be True or False"),
    (lambda: opt.LAMB(exclude=["b"]), TypeError, "exclude must be None or a callable"),
    (lambda: opt.LARS(lr=-0.1), ValueError, "LARS: lr must be >= 0"),
    (lambda: opt.LARS(momentum=1.0), ValueError, r"momentum must be in \[0, 1\)"),
    (lambda: opt.LARS(momentum=-0.5), ValueError, "momentum must be in"),
    (lambda: opt.LARS(weight_decay=-1e-4), ValueError, "weight_decay must be >= 0"),
    (lambda: opt.LARS(eta=-0.001), ValueError, "eta must be >= 0"),
    (lambda: opt.LARS(epsilon=-1.0), ValueError, "epsilon must be >= 0"),
    (lambda: opt.LARS(exclude="bias"), TypeError, "exclude must be None or a callable"),
])
def test_bad_hyper_parameters_raise(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


# ---------------------------------------------------------------- mixed precision
def test_adamw_under_mixed_precision_updates_float32_masters():
    # float16 parameters, a static power-of-two scale (unscaling is exact): the float32 masters follow AdamW
    # on float32 parameters with the unscaled gradients, and each half parameter is its master rounded
    rng = np.random.default_rng(5)
    p0 = {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)}
    grads = [{n: (rng.normal(size=a.shape) * 1024).astype(np.float16) for n, a in p0.items()} for _ in range(6)]
    half = {n: tensor.from_numpy(a.astype(np.float16)) for n, a in p0.items()}
    mp = amp.MixedPrecision(opt.AdamW(lr=0.01, weight_decay=0.1), amp.LossScaler(init_scale=1024.0, dynamic=False))
    full = {n: tensor.from_numpy(a.astype(np.float16).astype(np.float32)) for n, a in p0.items()}
    ref = opt.AdamW(lr=0.01, weight_decay=0.1)
    for gs in grads:
        for n in half:
            mp.apply(n, half[n], tensor.from_numpy(gs[n]))
            ref.apply(n, full[n], tensor.from_numpy(gs[n].astype(np.float32) / 1024))
        mp.step()
        ref.step()
    for n in half:
        master = tensor.to_numpy(mp.masters[n])
        np.testing.assert_allclose(master, tensor.to_numpy(full[n]), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(tensor.to_numpy(half[n]), master.astype(np.float16))
    assert mp.step_counter == 6 and mp.opt.m["w"].dtype == tensor.float32
    states = mp.get_states()
    assert {"m", "v", "t", "masters", "loss_scale"} <= set(states)


# ---------------------------------------------------------------- checkpoints on disk, the replica check
@pytest.mark.parametrize("make", [lambda: opt.AdamW(lr=0.01, amsgrad=True),
                                  lambda: opt.LAMB(lr=opt.WarmupCosineDecay(0.05, 20, 3)),
                                  lambda: opt.LARS(lr=1.0, eta=0.05)], ids=["AdamW", "LAMB", "LARS"])
def test_checkpoint_save_load_resumes_bit_for_bit(tmp_path, make):
    from singa_lite import checkpoint

    params, grads = make_data(6, np.float32, steps=6)
    straight_o, straight_p = make(), to_tensors(params)
    straight = run_steps(straight_o, straight_p, grads)[-1]
    o, p = make(), to_tensors(params)
    run_steps(o, p, grads[:3])
    checkpoint.save(str(tmp_path / "ckpt"), p, o)
    o2, p2 = make(), to_tensors({n: np.zeros_like(a) for n, a in params.items()})
    checkpoint.load(str(tmp_path / "ckpt"), p2, o2)
    assert o2.step_counter == 3 and o2.lr_value == o.lr_value
    resumed = run_steps(o2, p2, grads[3:])[-1]
    for n in params:
        np.testing.assert_array_equal(resumed[n], straight[n], err_msg=n)


def test_replica_digests_cover_the_new_state_slots():
    from singa_lite.parallel.replica_check import replica_digests

    params, grads = make_data(7, np.float32, steps=1, shapes={"w": (3, 2)})
    o = opt.AdamW(amsgrad=True)
    pt = to_tensors(params)
    run_steps(o, pt, grads)
    names = [name for _, name, *_ in replica_digests(pt, o)]
    assert {"m of w", "v of w", "v_max of w"} <= set(names), names
    base = replica_digests(pt, o)
    o.v_max["w"].copy_from_numpy(tensor.to_numpy(o.v_max["w"]) * 2)
    assert replica_digests(pt, o) != base
