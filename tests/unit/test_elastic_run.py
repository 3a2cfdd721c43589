"""In-process elasticity in one process (issue 31, point 2): dist.elastic's arguments, a one-rank job whose
train function fails once (run regroups in a new round and calls it again from the last in-memory commit), the
commit and restore of every part of the state, and a start below min_np failing with what it waited for. The
multi-process behaviour is in tests/multiproc/test_elastic_inprocess.py and tests/multihost/test_elastic_hosts.py."""
import socket

import numpy as np
import pytest

from singa_lite import autograd, dist, layer, model, opt, tensor
from singa_lite.comm.communicator import CommError
from singa_lite.comm.membership import ElasticTimeout, Prefixed, check_counts
from singa_lite.data import DistributedSampler, ElasticSampler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch):
    for k in ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              "SINGA_LITE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    dist.elastic.shutdown()


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.l1 = layer.Linear(6)
        self.l2 = layer.Linear(3)

    def forward(self, x):
        return self.l2(autograd.relu(self.l1(x)))

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer(loss)
        return loss


def data(n=40):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    return x, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]


@pytest.mark.parametrize("min_np, max_np, what", [(0, None, "min_np"), (True, None, "min_np"), (2, 1, "max_np"),
                                                   (1, 0, "max_np"), (None, None, "min_np")])
def test_counts_are_checked(min_np, max_np, what):
    with pytest.raises(ValueError, match=what):
        check_counts(min_np, max_np)


def test_state_refuses_what_it_cannot_restore():
    with pytest.raises(ValueError, match="every must be None or a number of steps"):
        dist.elastic.State(every=0)
    with pytest.raises(TypeError, match="use a data.ElasticSampler"):
        dist.elastic.State(sampler=DistributedSampler(10, 0, 1))
    with pytest.raises(TypeError, match="scaler must have get_states"):
        dist.elastic.State(scaler=object())


def test_init_refuses_a_launcher_that_stops_every_rank(one_rank, monkeypatch):
    monkeypatch.setenv("SINGA_LITE_HOLDER", "x")
    with pytest.raises(ValueError, match="started by singa-run, which stops every rank when one fails"):
        dist.elastic.init()


def test_run_needs_init_and_a_state():
    dist.elastic.shutdown()
    with pytest.raises(RuntimeError, match=r"call dist.elastic.init\(\) first"):
        dist.elastic.current()
    with pytest.raises(TypeError, match="must be a dist.elastic.State"):
        dist.elastic.run(lambda s: None)(object())


def test_a_failure_in_train_regroups_and_goes_on_from_the_last_commit(one_rank):
    comm = dist.elastic.init(timeout=30)
    assert (comm.rank, comm.world_size) == (0, 1)
    with pytest.raises(RuntimeError, match="already joined"):
        dist.elastic.init()
    x, y = data()
    np.random.seed(0)
    net = Net()
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
    net.set_optimizer(sgd)
    net.compile([tensor.from_numpy(x[:2])], is_train=True)
    sampler = ElasticSampler(len(x), 0, 1, batch_size=4, seed=1)
    rng = np.random.default_rng(5)
    logged = []
    state = dist.elastic.State(model=net, optimizer=sgd, sampler=sampler, rng=rng, every=3, log=logged.append)
    calls, at_commit = [], {}

    @dist.elastic.run
    def train(state):
        calls.append((state.steps, state.sampler.cursor, state.extra.get("tag")))
        if len(calls) == 2:  # restored: the commit's parameters and random state, exactly
            for k, v in net.get_states().items():
                np.testing.assert_array_equal(tensor.to_numpy(v), at_commit["params"][k])
            assert rng.bit_generator.state == at_commit["rng"]
        for epoch in range(state.epoch, 2):
            state.sampler.set_epoch(epoch)
            for idx in state.sampler:
                net.train_one_batch(tensor.from_numpy(x[idx]), tensor.from_numpy(y[idx]))
                rng.random()
                if state.step(extra={"tag": state.steps}) and state.steps == 6 and "params" not in at_commit:
                    at_commit["params"] = {k: tensor.to_numpy(v).copy() for k, v in net.get_states().items()}
                    at_commit["rng"] = rng.bit_generator.state
                if state.steps == 8 and len(calls) == 1:  # two steps after the commit at 6: lost, done again
                    raise CommError("rank 1 (pid 1) died (a simulated failure)")
            state.commit(extra={"tag": state.steps})
        return state.steps

    assert train(state) == 20  # 10 steps of 4 samples per epoch, 2 epochs: the lost ones done again
    assert calls[0] == (0, 0, None)
    assert calls[1] == (6, 24, 5), calls  # the commit at step 6: cursor 24, its extra (made before the step)
    assert state.resets == 1 and dist.elastic.current().round == 1
    assert any("round 1: 1 -> 1 rank(s) after a failure (rank 1 (pid 1) died" in m for m in logged), logged
    assert sgd.communicator is dist.elastic.current().communicator and not sgd.communicator.closed
    assert comm.closed  # the failed one was closed


def test_sync_restores_every_part_of_the_commit(one_rank):
    comm = dist.elastic.init(timeout=30)
    x, y = data()
    net = Net()
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
    net.set_optimizer(sgd)
    net.compile([tensor.from_numpy(x[:2])], is_train=True)
    sampler = ElasticSampler(len(x), 0, 1, batch_size=4, seed=1)
    rng = np.random.default_rng(5)
    state = dist.elastic.State(model=net, optimizer=sgd, sampler=sampler, rng=rng)
    for idx in sampler:
        net.train_one_batch(tensor.from_numpy(x[idx]), tensor.from_numpy(y[idx]))
        state.step()
        if sampler.cursor == 12:
            break
    state.commit(extra={"note": "here", "values": np.arange(3.0)})
    params = {k: tensor.to_numpy(v).copy() for k, v in net.get_states().items()}
    slots = sgd.get_states()["opt"]
    rng_state = rng.bit_generator.state
    for idx in sampler:  # train on: everything changes
        net.train_one_batch(tensor.from_numpy(x[idx]), tensor.from_numpy(y[idx]))
        state.step()
    rng.random()
    state.sync(0)
    assert (state.steps, sampler.epoch, sampler.cursor) == (3, 0, 12)
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), params[k])
    assert rng.bit_generator.state == rng_state
    assert state.extra["note"] == "here" and list(state.extra["values"]) == [0.0, 1.0, 2.0]
    assert sgd.get_states()["opt"].keys() == slots.keys()


def test_a_start_below_min_np_fails_naming_what_it_waited_for(one_rank):
    with pytest.raises(ElasticTimeout, match=r"round 0: waited 1 s for at least min_np=2 rank\(s\): 1 process\(es\) "
                                             r"are here"):
        dist.elastic.init(min_np=2, timeout=1)


def test_a_prefixed_view_keeps_each_round_apart(one_rank):
    dist.elastic.init(timeout=30)
    store = dist.elastic.current().store
    a, b = Prefixed(store, "elastic/r7/comm/"), Prefixed(store, "elastic/r8/comm/")
    a.set("table", b"seven")
    b.set("table", b"eight")
    assert (a.get("table"), b.get("table"), store.get("elastic/r7/comm/table")) == (b"seven", b"eight", b"seven")
    assert a.add("n", 2) == 2 and b.add("n", 1) == 1


def test_rebind_keeps_the_settings_and_the_comm_hook(one_rank):
    from singa_lite.parallel.hooks import fp16_compress_hook

    comm = dist.elastic.init(timeout=30)
    sgd = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, buffSize=1000, overlap=False, on_nonfinite="raise")
    sgd.register_comm_hook(None, fp16_compress_hook)
    other = dist.init(backend="shm", holder=None, rank=0, world_size=1)
    sgd.rebind(other)
    assert sgd.communicator is other and sgd.reducer.communicator is other
    assert (sgd.buffSize, sgd.overlap, sgd.on_nonfinite) == (1000, False, "raise")
    assert sgd.reducer.comm_hook == (None, fp16_compress_hook)
    other.close()


def test_a_communicator_kept_from_before_a_regroup_is_named(one_rank):
    comm = dist.elastic.init(timeout=30)
    state = dist.elastic.State()
    t = tensor.from_numpy(np.ones(2, np.float32))

    @dist.elastic.run
    def train(state):
        comm.all_reduce(t)  # the first round's communicator, closed by the regroup below
        raise CommError("rank 1 (pid 1) died (a simulated failure)")

    with pytest.raises(RuntimeError, match="used a communicator that a regroup closed"):
        train(state)
    assert state.resets == 1


def test_a_joiner_never_let_in_fails_naming_what_it_waited_for(one_rank):
    from singa_lite.comm.env import LaunchEnv
    from singa_lite.comm.membership import Membership

    dist.elastic.init(timeout=30)  # round 0 is over: one rank, and no commit will let anyone in
    first = dist.elastic.current()
    late = Membership(LaunchEnv("torchrun", 1, 1, "127.0.0.1", first.store.port), timeout=1)
    try:
        solo = late.start()
        assert late.pending and solo.world_size == 1
        with pytest.raises(ElasticTimeout, match=r"waited 1 s for a place in the job \(it lets joiners in at its "
                                                 r"commits, up to max_np=None"):
            late.regroup(-1)
    finally:
        late.close()
