"""Scenarios for bfloat16 on the wire and mixed precision under DistOpt (test_amp_dist.py runs them on shm
ranks started by multiprocessing). Each takes a Communicator and raises AssertionError when an expectation
fails; references are one process on the whole batch, computed on every rank locally."""
from __future__ import annotations

import numpy as np

from singa_lite import _core, autograd, opt, tensor
from singa_lite.optim import amp

from distopt_cases import data, loss_of, make_opt, make_params, reference, shard_of, train


def bf16_round(x) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), through the core's conversion."""
    t = _core.Tensor.from_buffer(np.ascontiguousarray(x, np.float32)).cast(tensor.bfloat16)
    return np.asarray(t.cast(tensor.float32))


def scenario_all_reduce_bf16(comm):
    """The communicator reduces bfloat16 itself: in float32, rounded once, the same on every rank."""
    rng = np.random.default_rng(7)
    every = bf16_round(rng.standard_normal((comm.world_size, 1000)))
    mine = tensor.Tensor(data=every[comm.rank], dtype=tensor.bfloat16).data
    comm.all_reduce(mine, "sum")
    want = bf16_round(every.astype(np.float32).sum(0))  # float32 sum in rank order, one rounding
    np.testing.assert_array_equal(np.asarray(mine.cast(tensor.float32)), want)
    avg = tensor.Tensor(data=every[comm.rank], dtype=tensor.bfloat16).data
    comm.all_reduce(avg, "avg")
    np.testing.assert_array_equal(np.asarray(avg.cast(tensor.float32)),
                                  bf16_round(every.astype(np.float32).sum(0) / np.float32(comm.world_size)))
    return "ok"


def scenario_half_bf16(comm, steps=20):
    """backward_and_update_half(dtype=bfloat16) trains as one process on the whole batch, within bfloat16's
    precision, and sends 2 bytes per gradient element."""
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    got = train(params, dopt, steps, shard=(comm.rank, comm.world_size), method="backward_and_update_half",
                threshold=100, dtype=tensor.bfloat16)
    want = reference("sgd", steps)
    for k in want:  # 8 significant bits on the wire: ~2-3 digits per step
        np.testing.assert_allclose(got[k], want[k], rtol=5e-2, atol=5e-2, err_msg=k)
    elements = sum(int(np.prod(v.shape)) for v in params.values())
    assert dopt.bytes_sent == 2 * elements * steps, (dopt.bytes_sent, elements)
    try:
        dopt.backward_and_update_half(loss_of(params, *data(0)), dtype=tensor.float32)
    except ValueError as e:
        assert "bfloat16" in str(e)
    else:
        raise AssertionError("a float32 wire dtype for the half exchange was accepted")
    return "ok"


def half_params(seed: int, dtype):
    return {k: tensor.Tensor(data=tensor.to_numpy(v), dtype=dtype, requires_grad=True, stores_grad=True, name=k)
            for k, v in make_params(seed).items()}


def half_loss(params, x, y, factor=1.0):
    dtype = params["W1"].dtype
    h = autograd.tanh(autograd.add_bias(autograd.matmul(tensor.Tensor(data=x, dtype=dtype), params["W1"]),
                                        params["b1"]))
    logits = autograd.add_bias(autograd.matmul(h, params["W2"]), params["b2"])
    loss = autograd.softmax_cross_entropy(autograd.cast(logits, tensor.float32), tensor.from_numpy(y))
    return loss if factor == 1.0 else autograd.mul(loss, factor)


def scenario_amp_skip_on_every_rank(comm, steps=8, bad_step=3):
    """DistOpt(MixedPrecision(SGD)) on float16 parameters: when one rank's gradients overflow, every rank
    skips the step (parameters, masters and momentum unchanged) and every rank's scaler backs off alike."""
    params = half_params(0, tensor.float16)
    mp = amp.MixedPrecision(opt.SGD(lr=0.1, momentum=0.9), amp.LossScaler(init_scale=2.0 ** 8, growth_interval=100))
    dopt = opt.DistOpt(mp, communicator=comm)
    autograd.training = True
    for step in range(steps):
        x, y = shard_of(*data(step), comm.rank, comm.world_size)
        before = {k: tensor.to_numpy(v).copy() for k, v in params.items()}
        moments = {k: tensor.to_numpy(m).copy() for k, m in mp.opt.moments.items()}
        # rank 1 injects an overflow: its float16 gradients of a loss 1e6 times larger are inf at this scale
        factor = 1e6 if (step == bad_step and comm.rank == 1) else 1.0
        dopt.backward_and_update(half_loss(params, x, y, factor), threshold=150)
        if step == bad_step:
            assert dopt.skipped_steps == 1 and mp.scaler.overflows == 1, (dopt.skipped_steps, mp.scaler)
            assert mp.scaler.scale == 2.0 ** 7 and mp.step_counter == bad_step
            for k in params:
                np.testing.assert_array_equal(tensor.to_numpy(params[k]), before[k], err_msg=k)
                np.testing.assert_array_equal(tensor.to_numpy(mp.opt.moments[k]), moments[k], err_msg=k)
    assert mp.step_counter == steps - 1 and mp.scaler.scale == 2.0 ** 7
    assert params["W1"].dtype == tensor.float16 and mp.masters["W1"].dtype == tensor.float32
    # every rank holds the same parameters and master weights
    flat = np.concatenate([tensor.to_numpy(mp.masters[k]).reshape(-1) for k in sorted(params)])
    gathered = np.asarray(comm.all_gather(_core.Tensor.from_buffer(flat)))
    for r in range(comm.world_size):
        np.testing.assert_array_equal(gathered[r], gathered[0])
    # and training went somewhere sensible: close to one float32 process that skips the same step
    ref = make_params(0)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    for step in range(steps):
        if step != bad_step:
            sgd(loss_of(ref, *data(step)))
    for k in ref:
        np.testing.assert_allclose(tensor.to_numpy(params[k]).astype(np.float32), tensor.to_numpy(ref[k]),
                                   atol=3e-2, err_msg=k)
    return "ok"


def scenario_amp_bf16_half_wire(comm, steps=10):
    """bfloat16 parameters, bfloat16 on the wire, float32 masters: tracks one float32 process."""
    params = half_params(0, tensor.bfloat16)
    dopt = opt.DistOpt(amp.MixedPrecision(opt.SGD(lr=0.1, momentum=0.9)), communicator=comm)
    autograd.training = True
    for step in range(steps):
        x, y = shard_of(*data(step), comm.rank, comm.world_size)
        dopt.backward_and_update_half(half_loss(params, x, y), threshold=150, dtype=tensor.bfloat16)
    want = reference("sgd", steps)
    for k in want:
        np.testing.assert_allclose(tensor.to_numpy(params[k]), want[k], atol=6e-2, err_msg=k)
    return "ok"


def scenario_amp_partial_update(comm, steps=6):
    """backward_and_partial_update with MixedPrecision: parameter values averaged by DistOpt (not through the
    optimizer) become the masters at the next step, so the ranks' replicas agree after average_parameters."""
    params = half_params(0, tensor.float16)
    mp = amp.MixedPrecision(opt.SGD(lr=0.1), amp.LossScaler(init_scale=2.0 ** 8))
    dopt = opt.DistOpt(mp, communicator=comm)
    autograd.training = True
    for step in range(steps):
        x, y = shard_of(*data(step), comm.rank, comm.world_size)
        dopt.backward_and_partial_update(half_loss(params, x, y), threshold=150)
    dopt.average_parameters()
    names = sorted(params)
    masters = np.concatenate([tensor.to_numpy(mp._master(k, params[k])).reshape(-1) for k in names])
    gathered = np.asarray(comm.all_gather(_core.Tensor.from_buffer(masters)))
    for r in range(comm.world_size):
        np.testing.assert_array_equal(gathered[r], gathered[0])
    flat = np.concatenate([tensor.to_numpy(params[k]).astype(np.float32).reshape(-1) for k in names])
    np.testing.assert_array_equal(masters, flat)  # the averaged half values, exactly
    return "ok"


SCENARIOS = {
    "amp_partial": scenario_amp_partial_update,
    "all_reduce_bf16": scenario_all_reduce_bf16,
    "half_bf16": scenario_half_bf16,
    "amp_skip": scenario_amp_skip_on_every_rank,
    "amp_bf16_wire": scenario_amp_bf16_half_wire,
}


def run(comm, name):
    return SCENARIOS[name](comm)
