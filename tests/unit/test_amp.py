"""amp: the dynamic loss scaler, MixedPrecision's float32 master weights and skipped steps, and its checkpoints
(singa_lite.checkpoint save / load). The digits CNN in float16: test_amp_digits.py."""
from __future__ import annotations

import numpy as np
import pytest

from singa_lite import autograd, checkpoint, opt, tensor
from singa_lite.optim import amp


# ---------------------------------------------------------------- LossScaler
def test_scaler_backs_off_on_overflow_and_grows_after_n_good_steps():
    s = amp.LossScaler(init_scale=1024.0, growth_interval=3)
    s.update(overflow=True)
    assert s.scale == 512.0 and s.overflows == 1 and s.good_steps == 0
    for _ in range(2):
        s.update(overflow=False)
    assert s.scale == 512.0 and s.good_steps == 2
    s.update(overflow=True)  # an overflow restarts the count
    assert s.scale == 256.0 and s.good_steps == 0
    for _ in range(3):
        s.update(overflow=False)
    assert s.scale == 512.0 and s.good_steps == 0 and s.overflows == 2


def test_scaler_bounds_and_static_mode():
    s = amp.LossScaler(init_scale=2.0, min_scale=1.0, max_scale=4.0, growth_interval=1)
    s.update(True), s.update(True), s.update(True)
    assert s.scale == 1.0
    for _ in range(5):
        s.update(False)
    assert s.scale == 4.0
    st = amp.LossScaler(init_scale=8.0, dynamic=False, growth_interval=1)
    st.update(True), st.update(False), st.update(False)
    assert st.scale == 8.0 and st.overflows == 1


@pytest.mark.parametrize("kw", [{"init_scale": 0}, {"init_scale": float("inf")}, {"growth_interval": 0},
                                {"backoff_factor": 1.0}, {"growth_factor": 0.5}, {"growth_interval": 2.5}])
def test_scaler_rejects_bad_arguments(kw):
    with pytest.raises(ValueError):
        amp.LossScaler(**kw)


def test_scaler_states_round_trip_and_are_checked():
    s = amp.LossScaler(init_scale=64.0, growth_interval=5)
    s.update(True), s.update(False)
    t = amp.LossScaler()
    t.set_states(s.get_states())
    assert (t.scale, t.good_steps, t.overflows) == (32.0, 1, 1)
    with pytest.raises(ValueError):
        t.set_states({"scale": -1.0, "good_steps": 0, "overflows": 0})
    assert t.scale == 32.0


# ---------------------------------------------------------------- MixedPrecision
def linear_model(dtype, seed=0):
    rng = np.random.default_rng(seed)
    w = tensor.Tensor(data=rng.standard_normal((6, 3)) * 0.5, dtype=dtype, requires_grad=True, stores_grad=True,
                      name="W")
    b = tensor.Tensor(data=np.zeros(3), dtype=dtype, requires_grad=True, stores_grad=True, name="b")
    return {"W": w, "b": b}


def batch(step):
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)


def loss_of(params, x, y, loss_factor=1.0):
    dtype = params["W"].dtype
    h = autograd.add_bias(autograd.matmul(tensor.Tensor(data=x, dtype=dtype), params["W"]), params["b"])
    loss = autograd.softmax_cross_entropy(autograd.cast(h, tensor.float32), tensor.from_numpy(y))
    return loss if loss_factor == 1.0 else autograd.mul(loss, loss_factor)


def values(params):
    return {k: tensor.to_numpy(v).astype(np.float64) for k, v in params.items()}


@pytest.mark.parametrize("dtype", [tensor.float16, tensor.bfloat16])
def test_half_parameters_track_a_float32_run(dtype):
    ref = linear_model(tensor.float32)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    half = linear_model(dtype)
    mp = amp.MixedPrecision(opt.SGD(lr=0.1, momentum=0.9), amp.LossScaler(init_scale=256.0))
    autograd.training = True
    for step in range(15):
        x, y = batch(step)
        sgd(loss_of(ref, x, y))
        mp(loss_of(half, x, y))
    assert half["W"].dtype == dtype and mp.masters["W"].dtype == tensor.float32
    assert mp.opt.moments["W"].dtype == tensor.float32  # the wrapped optimizer's state is float32 too
    assert mp.step_counter == 15 and mp.scaler.overflows == 0
    tol = 2e-2 if dtype == tensor.float16 else 6e-2
    for k, want in values(ref).items():
        np.testing.assert_allclose(values(half)[k], want, atol=tol, err_msg=k)
        # the half parameter is its master rounded once
        np.testing.assert_array_equal(values(half)[k], tensor.to_numpy(
            tensor.Tensor(data=mp.masters[k].data.cast(dtype))).astype(np.float64))


def test_master_weights_keep_updates_smaller_than_half_an_ulp():
    # 1.0 in float16 has ulp 2^-10: steps of 2^-13 are rounded away in float16 parameters, but add up in the
    # float32 master, which the parameter follows.
    p = tensor.Tensor(data=np.ones(4), dtype=tensor.float16, requires_grad=True, stores_grad=True, name="p")
    mp = amp.MixedPrecision(opt.SGD(lr=2.0 ** -13), amp.LossScaler(init_scale=1.0))
    plain = tensor.Tensor(data=np.ones(4), dtype=tensor.float16, name="q")
    sgd16 = opt.SGD(lr=2.0 ** -13)
    g = tensor.Tensor(data=-np.ones(4), dtype=tensor.float16)
    for _ in range(16):
        mp.apply("p", p, g)
        mp.step()
        sgd16.apply("q", plain, g)
        sgd16.step()
    np.testing.assert_array_equal(tensor.to_numpy(plain), 1.0)           # stuck
    np.testing.assert_array_equal(tensor.to_numpy(p), 1.0 + 16 * 2.0 ** -13)  # 1.001953125, exact in float16


def test_overflow_skips_the_step_and_backs_the_scale_off():
    params = linear_model(tensor.float16)
    mp = amp.MixedPrecision(opt.SGD(lr=0.1, momentum=0.9), amp.LossScaler(init_scale=1024.0, growth_interval=2))
    autograd.training = True
    x, y = batch(0)
    mp(loss_of(params, x, y))
    before = values(params)
    masters = {k: tensor.to_numpy(m).copy() for k, m in mp.masters.items()}
    moments = {k: tensor.to_numpy(m).copy() for k, m in mp.opt.moments.items()}
    # An injected overflow: the float16 gradients of a loss 1e6 times larger are inf at this scale.
    mp(loss_of(params, *batch(1), loss_factor=1e6))
    assert mp.scaler.scale == 512.0 and mp.scaler.overflows == 1 and mp.step_counter == 1
    for k in before:
        np.testing.assert_array_equal(values(params)[k], before[k])
        np.testing.assert_array_equal(tensor.to_numpy(mp.masters[k]), masters[k])
        np.testing.assert_array_equal(tensor.to_numpy(mp.opt.moments[k]), moments[k])
    # good steps again: the scale grows back after growth_interval of them, and the parameters move
    mp(loss_of(params, *batch(2)))
    mp(loss_of(params, *batch(3)))
    assert mp.scaler.scale == 1024.0 and mp.step_counter == 3
    assert not np.array_equal(values(params)["W"], before["W"])


def test_float16_loss_scale_finds_its_level():
    # A scale too large for float16 gradients backs off step after step until the gradients fit.
    params = linear_model(tensor.float16)
    mp = amp.MixedPrecision(opt.SGD(lr=0.05), amp.LossScaler(init_scale=2.0 ** 30, growth_interval=1000))
    autograd.training = True
    for step in range(30):
        mp(loss_of(params, *batch(step)))
    assert mp.scaler.overflows > 0 and mp.scaler.scale < 2.0 ** 30
    assert mp.step_counter == 30 - mp.scaler.overflows > 0


def test_float32_parameters_are_their_own_master_and_match_plain_sgd():
    a, b = linear_model(tensor.float32), linear_model(tensor.float32)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    mp = amp.MixedPrecision(opt.SGD(lr=0.1, momentum=0.9), amp.LossScaler(init_scale=2.0 ** 10))
    autograd.training = True
    for step in range(5):
        x, y = batch(step)
        sgd(loss_of(a, x, y))
        mp(loss_of(b, x, y))
    assert mp.masters == {}
    for k, want in values(a).items():  # a power-of-two scale is exact: the same values up to float32 rounding
        np.testing.assert_allclose(values(b)[k], want, rtol=1e-6, atol=1e-6)


def test_bad_use_is_refused():
    with pytest.raises(TypeError):
        amp.MixedPrecision(object())
    with pytest.raises(TypeError):
        amp.MixedPrecision(opt.SGD(), scaler=2.0)
    with pytest.raises(TypeError):
        amp.MixedPrecision(opt.SGD(), master_dtype=tensor.float16)
    mp = amp.MixedPrecision(opt.SGD())
    p = linear_model(tensor.float16)["W"]
    with pytest.raises(TypeError, match="gradient"):
        mp.apply("W", p, tensor.Tensor(data=np.zeros((6, 3)), dtype=tensor.float32))
    mp.apply("W", p, tensor.Tensor(data=np.zeros((6, 3)), dtype=tensor.float16))
    with pytest.raises(RuntimeError, match="step"):
        mp.get_states()


# ---------------------------------------------------------------- checkpoints
def test_checkpoint_resume_keeps_scaler_masters_and_optimizer_state(tmp_path):
    def make():
        return linear_model(tensor.float16), amp.MixedPrecision(
            opt.SGD(lr=0.1, momentum=0.9), amp.LossScaler(init_scale=2.0 ** 20, growth_interval=3))

    autograd.training = True
    straight, mp = make()
    for step in range(12):
        mp(loss_of(straight, *batch(step)))

    first, mp1 = make()
    for step in range(6):
        mp1(loss_of(first, *batch(step)))
    assert mp1.scaler.overflows > 0  # the scale has moved: it must come back from the checkpoint
    checkpoint.save(str(tmp_path / "ck"), model=first, optimizer=mp1)
    saved = mp1.scaler.get_states()

    resumed, mp2 = make()
    checkpoint.load(str(tmp_path / "ck"), model=resumed, optimizer=mp2)
    assert mp2.scaler.get_states() == saved and mp2.step_counter == mp1.step_counter
    assert set(mp2.masters) == {"W", "b"}
    for step in range(6, 12):
        mp2(loss_of(resumed, *batch(step)))
    assert mp2.scaler.get_states() == mp.scaler.get_states()
    for k, want in values(straight).items():
        np.testing.assert_array_equal(values(resumed)[k], want, err_msg=k)
        np.testing.assert_array_equal(tensor.to_numpy(mp2.masters[k]), tensor.to_numpy(mp.masters[k]))


def test_checkpoint_of_a_bfloat16_model(tmp_path):
    # numpy has no bfloat16: the model's values are saved as float32 (exactly) and rounded back on load.
    params = linear_model(tensor.bfloat16)
    mp = amp.MixedPrecision(opt.SGD(lr=0.1, momentum=0.9))
    autograd.training = True
    for step in range(3):
        mp(loss_of(params, *batch(step)))
    checkpoint.save(str(tmp_path / "bf"), model=params, optimizer=mp)
    other, mp2 = linear_model(tensor.bfloat16, seed=1), amp.MixedPrecision(opt.SGD(lr=0.1, momentum=0.9))
    checkpoint.load(str(tmp_path / "bf"), model=other, optimizer=mp2)
    for k in params:
        assert other[k].dtype == tensor.bfloat16
        np.testing.assert_array_equal(tensor.to_numpy(other[k]), tensor.to_numpy(params[k]))
        np.testing.assert_array_equal(tensor.to_numpy(mp2.masters[k]), tensor.to_numpy(mp.masters[k]))


def test_a_parameter_set_by_other_means_reseeds_its_master():
    # Loading a model (or DistOpt's partial-update averaging) writes the half parameters directly: the next
    # step must start from those values, not write the old master weights back over them.
    params = linear_model(tensor.float16)
    mp = amp.MixedPrecision(opt.SGD(lr=0.1), amp.LossScaler(init_scale=1.0))
    autograd.training = True
    mp(loss_of(params, *batch(0)))
    params["W"].copy_from_numpy(np.full((6, 3), 0.25, np.float32))
    g = tensor.Tensor(data=np.ones((6, 3)), dtype=tensor.float16)
    mp.apply("W", params["W"], g)
    mp.step()
    np.testing.assert_array_equal(tensor.to_numpy(params["W"]), np.float16(0.25 - 0.1))
    np.testing.assert_array_equal(tensor.to_numpy(mp.masters["W"]), np.float32(0.25) - np.float32(0.1))
