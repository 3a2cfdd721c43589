"""Multi-process scenarios for parallel.ddp (Needle's ddp API) and parallel.DataParallel (the DDP exercises' MyDP),
run by tests/multiproc/test_ddp.py on the shm backend (spawned children import this module).

The model is the DDP exercises': a tanh MLP classifying generated data (small here). Every rank starts from a
different, rank-dependent initialisation, so the tests fail unless the broadcast works; the reference is one
process training the same model (rank 0's initialisation) on the whole batch, computed on every rank."""
from __future__ import annotations

import warnings

import numpy as np

from singa_lite import autograd, layer, opt, parallel, tensor
from singa_lite.parallel import ddp

D, H, C = 12, 20, 5  # input, hidden, classes; W2 (20x20 = 400 elements) is the largest parameter
N = 24  # the global batch: 12 per rank on 2 ranks, 8 on 3
EXAMPLES = 5 * N + 7  # 5 global batches per epoch, and an incomplete one that is dropped


class MLP(layer.Layer):
    """The DDP exercises' MLP: Linear + tanh layers, then a classifier (dims scaled down)."""

    def __init__(self, n_layers=3):
        super().__init__()
        dims = [D] + [H] * (n_layers - 1) + [C]
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            setattr(self, f"fc{i}", layer.Linear(a, b))
        self.n_layers = n_layers

    def forward(self, x):
        for i in range(self.n_layers):
            x = getattr(self, f"fc{i}")(x)
            if i < self.n_layers - 1:
                x = autograd.tanh(x)
        return x


def make_model(seed: int) -> MLP:
    m = MLP()
    rng = np.random.default_rng(seed)
    for _, p in m.get_params().items():
        p.copy_from_numpy((rng.standard_normal(p.shape) * 0.4).astype(np.float32))
    return m


def gen_dataset(seed=0):
    """The DDP exercises' gen_dataset: the same data on every rank (rand_state 0)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((EXAMPLES, D)).astype(np.float32)
    teacher = rng.standard_normal((D, C))
    return x, np.argmax(x @ teacher, axis=1).astype(np.int32)


def make_opt(kind: str):
    return {"sgd": lambda: opt.SGD(lr=0.1, momentum=0.9), "adam": lambda: opt.Adam(lr=0.01)}[kind]()


def values(m) -> dict:
    return {k: tensor.to_numpy(v) for k, v in m.get_params().items()}


def reference(seed: int, kind: str, epochs: int) -> dict:
    """One process, the whole batch, rank 0's initialisation, the same order of examples."""
    m = make_model(seed)
    sgd = make_opt(kind)
    loader = ddp.ShardLoader(gen_dataset(), N, 0, 1, dtype="float32", shuffle=True, seed=5)
    autograd.training = True
    for _ in range(epochs):
        for x, y in loader:
            sgd(autograd.softmax_cross_entropy(m(x), y))
    return values(m)


def assert_matches(got: dict, want: dict, what: str, rtol=1e-5):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=rtol, err_msg=f"{what}: {k}")


def assert_drift_is_detected(check, m, comm):
    """check() is True now; after one rank's replica is nudged it is False on every rank, with a warning."""
    assert check()
    if comm.rank == comm.world_size - 1:
        w = m.get_params()["fc1.W"]
        w.copy_from_numpy(tensor.to_numpy(w) + 1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not check()
    assert any("fc1.W" in str(w.message) and "drifted" in str(w.message) for w in caught), caught


# ---------------------------------------------------------------- Needle's ddp project: the ddp module
def scenario_ddp(rank, world_size, _name, holder, kind="sgd", epochs=2):
    """Needle's ddp script, with ddp.init from the parent's holder (processes started by multiprocessing)."""
    from singa_lite import device

    got_rank, dev = ddp.init(holder, rank, world_size, device=None if not device.cuda_is_available() else "cpu")
    try:
        assert got_rank == rank and dev.is_cpu() and ddp.world_size() == world_size, (got_rank, dev)
        assert ddp.communicator().backend == "shm"
        loader, bsz = ddp.partition_dataset(gen_dataset(), N, device=dev, dtype="float32", seed=5)
        assert bsz == N // world_size and len(loader) == EXAMPLES // N
        m = make_model(seed=100 + rank)  # different on every rank until the broadcast
        ddp.broadcast_parameters(m)
        dopt = ddp.DistributedOptimizer(make_opt(kind), threshold=150, first_bucket=60)  # several buckets
        autograd.training = True
        for _ in range(epochs):
            for X, y in loader:
                dopt.reset_grad()
                assert X.shape == (bsz, D) and X.dtype == tensor.float32 and y.dtype == tensor.int32
                loss = autograd.softmax_cross_entropy(m(X), y)
                dopt.backward(loss)
                dopt.step()
        assert_matches(values(m), reference(100, kind, epochs), f"ddp {kind} on {world_size} ranks")
        assert_drift_is_detected(lambda: ddp.check_parameter_closeness(m), m, ddp.communicator())
        return "ok"
    finally:
        ddp.shutdown()


def scenario_ddp_errors(comm):
    """Differing models raise on every rank; step without backward, and backward twice, raise."""
    ddp.init(communicator=comm)
    try:
        m = MLP(n_layers=3 if comm.rank == 0 else 2)
        try:
            ddp.broadcast_parameters(m)
            raise AssertionError("differing models were not detected")
        except ValueError as e:
            assert "models differ" in str(e) and "rank 0 has 6 parameters" in str(e), e
        m = make_model(0)
        dopt = ddp.DistributedOptimizer(opt.SGD(lr=0.1))
        autograd.training = True
        x, y = gen_dataset()

        def loss():
            return autograd.softmax_cross_entropy(m(tensor.from_numpy(x[:4])), tensor.from_numpy(y[:4]))
        try:
            dopt.step()
            raise AssertionError("step without backward passed")
        except RuntimeError as e:
            assert "no gradients" in str(e), e
        dopt.backward(loss())
        try:
            dopt.backward(loss())
            raise AssertionError("a second backward passed")
        except RuntimeError as e:
            assert "reset_grad" in str(e), e
        dopt.reset_grad()  # drops them, the exchange completed on every rank
        dopt.step(loss())
        assert ddp.check_parameter_closeness(m)
        return "ok"
    finally:
        ddp.shutdown()


# ---------------------------------------------------------------- the DDP exercises: the hook-based wrapper
def scenario_hook_dp(comm, kind="sgd", epochs=2, threshold=150, first_bucket=60):
    """MyDP: any optimizer, gradients averaged by the hooks, bucketed, overlapping backward."""
    m = make_model(seed=200 + comm.rank)
    dp = parallel.MyDP(m, communicator=comm, threshold=threshold, first_bucket=first_bucket)
    assert dp.check_parameter_closeness(rtol=0, atol=0)  # rank 0's weights everywhere
    loader = ddp.ShardLoader(gen_dataset(), N // comm.world_size, comm.rank, comm.world_size, shuffle=True, seed=5)
    sgd = make_opt(kind)
    autograd.training = True
    for _ in range(epochs):
        for x, y in loader:
            sgd(autograd.softmax_cross_entropy(dp(x), y))  # a plain optimizer, nothing distributed about it
    want = reference(200, kind, epochs)
    assert_matches(values(m), want, f"DataParallel {kind} on {comm.world_size} ranks")
    assert_drift_is_detected(dp.check_parameter_closeness, m, comm)
    return "ok"


def scenario_hook_dp_overlap_and_consumers(comm):
    """Buckets leave while backward still runs; autograd.gradients sees averaged gradients; remove_hooks
    makes gradients local again."""
    m = make_model(seed=0)
    # registered before the wrapper's: runs first, when fc0.W's gradient (the last one) is final
    sends, at_last_grad = [], []
    m.get_params()["fc0.W"].register_hook(lambda g: at_last_grad.append(len(sends)))
    dp = parallel.DataParallel(m, communicator=comm, threshold=1000, first_bucket=50)
    real = comm.all_reduce

    def all_reduce(t, op="sum", async_op=False):
        sends.append(t.numel)
        return real(t, op, async_op)
    comm.all_reduce = all_reduce
    x, y = gen_dataset()
    per = N // comm.world_size
    autograd.training = True
    mine = slice(comm.rank * per, (comm.rank + 1) * per)
    grads = autograd.gradients(autograd.softmax_cross_entropy(dp(tensor.from_numpy(x[mine])),
                                                               tensor.from_numpy(y[mine])))
    del comm.all_reduce
    # gradients come as fc2.b (5), fc2.W (100), fc1.b (20), ...: the first bucket leaves at >= 50 elements
    assert at_last_grad and at_last_grad[0] >= 1, (at_last_grad, sends)
    ref = make_model(seed=0)
    want = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(
        autograd.softmax_cross_entropy(ref(tensor.from_numpy(x[:N])), tensor.from_numpy(y[:N])))}
    got = {p.name: tensor.to_numpy(g) for p, g in grads.items()}
    assert_matches(got, want, "averaged gradients through autograd.gradients")
    dp.remove_hooks()
    local = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(
        autograd.softmax_cross_entropy(m(tensor.from_numpy(x[mine])), tensor.from_numpy(y[mine])))}
    if comm.world_size > 1:
        assert not np.allclose(local["fc0.W"], want["fc0.W"], rtol=1e-4)
    return sorted(set(sends))


def scenario_wrapper(comm):
    """Every DataParallel scenario, in one group of processes."""
    return [scenario_hook_dp(comm, "sgd"), scenario_hook_dp(comm, "adam", threshold=50, first_bucket=0),
            scenario_hook_dp_overlap_and_consumers(comm), scenario_ddp_errors(comm)]
