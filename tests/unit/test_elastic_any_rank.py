"""In-process elasticity without a rank that must live (issue 31): singa-run --elastic's options and ranks'
environment, the job's exit status, a round whose coordinator dies before deciding (another member takes
over), the keys of old rounds deleted once every member passed them (the store does not grow with the rounds),
each member restoring its own commit (sparse residuals, device random streams) and a newcomer the source's, and
a process that waits to join when the job finishes. The multi-process behaviour (SIGKILL of launch rank 0 under
singa-run --elastic, a replacement joining) is in tests/multiproc/test_elastic_inprocess.py."""
import socket

import numpy as np
import pytest

from singa_lite import autograd, device, dist, layer, model, opt, tensor
from singa_lite.comm import env, launch_args, launcher
from singa_lite.comm.communicator import CommError
from singa_lite.comm.env import LaunchEnv
from singa_lite.comm.membership import DEAD_S, JobFinished, Membership, counts_from_env
from singa_lite.comm.store import TcpStore
from singa_lite.data import ElasticSampler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch):
    for k in ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              "SINGA_LITE_STORE_SERVER", "SINGA_LITE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
              "SLURM_RESTART_COUNT",
              "SINGA_LITE_ELASTIC_MIN_NP", "SINGA_LITE_ELASTIC_MAX_NP"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    dist.elastic.shutdown()


# ---------------------------------------------------------------- singa-run --elastic
def singa_run_args(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "HOSTS").write_text("h1:1\nh2:1\n")
    args = launch_args.parse_command_line(launch_args.build_parser(), argv)
    launch_args.check_args(args)
    return args


def test_elastic_ranks_meet_through_the_store_singa_run_serves(tmp_path, monkeypatch):
    args = singa_run_args(tmp_path, monkeypatch, ["--elastic", "-np", "2", "--min-np", "1", "--max-np", "4",
                                                  "--max-restarts", "3", "train.py"])
    assert (args.elastic, args.max_np, args.min_np, args.max_restarts) == (True, 4, 1, 3)
    e = launch_args.elastic_environment(args, 1, 4321, base={})
    assert "SINGA_LITE_HOLDER" not in e and "SINGA_LITE_RESTART_COUNT" not in e  # not a restart generation
    assert (e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == ("1", "2", "127.0.0.1", "4321")
    assert e["SINGA_LITE_STORE_SERVER"] == "singa-run" and e["SINGA_LITE_JOB_ID"] == args.job_id
    assert e["SINGA_LITE_JOB_SECRET"] == args.secret  # the store singa-run serves checks the same key
    assert (e["SINGA_LITE_ELASTIC_MIN_NP"], e["SINGA_LITE_ELASTIC_MAX_NP"]) == ("1", "4")
    assert env.detect(e) == "torchrun" and env.store_served(e) == "singa-run"
    assert singa_run_args(tmp_path, monkeypatch, ["--elastic", "-np", "3", "train.py"]).max_np == 3
    # no rank serves the store: launch rank 0 is a client like the others, and claims nothing
    store = TcpStore("127.0.0.1", 0, 2, True, credentials=launcher.elastic_credentials(args))
    try:
        e0 = {**e, "RANK": "0", "MASTER_PORT": str(store.port)}
        client = env.open_store(env.read(e0), 10.0, environ=e0, claim=False)
        assert not client.is_server and client.rank is None
        client.set("k", b"v")
        assert store.get("k") == b"v"
        client.close()
        # the job's identity and key still decide who gets in: another key is refused
        stranger = {**e0, "SINGA_LITE_JOB_SECRET": "another job's secret, 0123456789"}
        with pytest.raises(CommError, match="refused"):
            env.open_store(env.read(stranger), 3.0, environ=stranger, claim=False)
    finally:
        store.close()


@pytest.mark.parametrize("argv,message", [
    (["--elastic", "-np", "3", "--max-np", "2", "train.py"], "--max-np (2) must be at least -np (3)"),
    (["-np", "2", "--max-np", "4", "train.py"], "--max-np is for --elastic jobs"),
    (["--elastic", "-np", "2", "--min-np", "3", "train.py"], "--min-np must be from 1 to -np (2)"),
    (["--elastic", "--hostfile", "HOSTS", "train.py"], "--elastic runs the ranks on this host"),
    (["--elastic", "-np", "2", "--report", "5", "train.py"], "cannot be used with --elastic"),
])
def test_elastic_option_errors(tmp_path, monkeypatch, argv, message):
    with pytest.raises(launch_args.UsageError) as info:
        singa_run_args(tmp_path, monkeypatch, argv)
    assert message in str(info.value)


@pytest.mark.parametrize("ends,status", [
    ([(0, -9), (1, 0), (2, 0), (3, 0)], 0),  # a rank killed, the others (and its replacement) finished
    ([(1, 0), (0, 0)], 0),
    ([(0, -9), (1, 1), (2, 1)], 1),  # nobody finished: the last failure's status
    ([(0, -9)], 137),
    ([(1, 0), (2, 3)], 3),  # a failure after ranks finished: the job did not end well
])
def test_an_elastic_jobs_exit_status(ends, status):
    assert launcher.elastic_status(ends) == status


def test_min_np_and_max_np_come_from_singa_run(monkeypatch):
    assert counts_from_env(None, None, {}) == (1, None)
    assert counts_from_env(None, None, {"SINGA_LITE_ELASTIC_MIN_NP": "2", "SINGA_LITE_ELASTIC_MAX_NP": "5"}) == (2, 5)
    assert counts_from_env(3, None, {"SINGA_LITE_ELASTIC_MIN_NP": "2", "SINGA_LITE_ELASTIC_MAX_NP": "5"}) == (3, 5)
    with pytest.raises(ValueError, match="SINGA_LITE_ELASTIC_MAX_NP must be a number of ranks >= 1, got 'x'"):
        counts_from_env(None, None, {"SINGA_LITE_ELASTIC_MAX_NP": "x"})


# ---------------------------------------------------------------- rounds without a fixed coordinator
def test_a_coordinator_that_dies_before_deciding_is_replaced(one_rank):
    dist.elastic.init(timeout=30)
    member = dist.elastic.current()
    assert member.coordinator and member.round == 0
    # round 1 was claimed by a process that never beats (it died right after its claim)
    member.store.add("elastic/r1/claim/0", 1)
    member.store.set("elastic/r1/coord/0", b"ghost")
    result = member._take_part(1, step=4)
    assert result["members"] == [member.uid] and result["source"] == 0 and result["steps"] == [4]
    assert member.store.get("elastic/r1/coord/1").decode() == member.uid  # the next claim was this one's
    assert member.is_gone("ghost") and DEAD_S > 0


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.l1 = layer.Linear(6)
        self.l2 = layer.Linear(3)

    def forward(self, x):
        return self.l2(autograd.relu(self.l1(x)))

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer.backward_and_sparse_update(loss, spars=0.3, topK=True)
        return loss


def data(n=40):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    return x, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]


def sparse_job(comm):
    x, y = data()
    np.random.seed(0)
    net = Net()
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
    net.set_optimizer(sgd)
    net.compile([tensor.from_numpy(x[:2])], is_train=True)
    sampler = ElasticSampler(len(x), 0, 1, batch_size=4, seed=1)
    return x, y, net, sgd, sampler


def residuals(sgd) -> dict:
    return {k: np.asarray(v).copy() for k, v in sgd.get_states()["residuals"].items()}


def test_old_rounds_keys_are_deleted_once_every_member_passed_them(one_rank):
    comm = dist.elastic.init(timeout=30)
    x, y, net, sgd, sampler = sparse_job(comm)
    state = dist.elastic.State(model=net, optimizer=sgd, sampler=sampler, every=2, log=None)
    failures = []

    @dist.elastic.run
    def train(state):
        for idx in state.sampler:
            net.train_one_batch(tensor.from_numpy(x[idx]), tensor.from_numpy(y[idx]))
            state.step()
            if state.steps == 3 and len(failures) < 6:
                failures.append(state.steps)
                raise CommError("rank 1 (pid 1) died (a simulated failure)")
        return state.steps

    assert train(state) == 10 and state.resets == 6
    store = dist.elastic.current().store
    count, names = store.keys("elastic/")
    rounds = sorted({n.split("/")[1] for n in names if n.startswith("elastic/r")})
    assert rounds == ["r6"], names  # rounds 0 to 5 are gone; only the current one's keys are left
    assert count < 40, names  # and a few counters, this process's heartbeat: nothing that grows with the rounds


def test_each_member_restores_its_own_residuals_and_random_streams_a_newcomer_the_sources(one_rank):
    comm = dist.elastic.init(timeout=30)
    x, y, net, sgd, sampler = sparse_job(comm)
    state = dist.elastic.State(model=net, optimizer=sgd, sampler=sampler, log=None)
    cpu = device.create_cpu_device()
    for idx in sampler:
        net.train_one_batch(tensor.from_numpy(x[idx]), tensor.from_numpy(y[idx]))
        state.step()
        if sampler.cursor == 12:
            break
    tensor.Tensor((3,), cpu).uniform(0, 1)  # the device's stream moves on between commits
    state.commit()
    kept, stream = residuals(sgd), list(cpu.get_rng_state())
    assert kept and any(np.abs(v).sum() > 0 for v in kept.values())  # sparse updates left something behind
    for idx in sampler:
        net.train_one_batch(tensor.from_numpy(x[idx]), tensor.from_numpy(y[idx]))
        state.step()
    tensor.Tensor((3,), cpu).uniform(0, 1)
    assert list(cpu.get_rng_state()) != stream
    state.sync(0)  # this process took part in the commit: its own residuals and random stream come back
    assert list(cpu.get_rng_state()) == stream
    assert residuals(sgd).keys() == kept.keys()
    for k, v in kept.items():
        np.testing.assert_array_equal(residuals(sgd)[k], v)
    # a newcomer (no commit of that step) takes the source's shared state: no residuals, its own stream
    snap = state.committed
    tensor.Tensor((3,), cpu).uniform(0, 1)
    moved = list(cpu.get_rng_state())
    state.restore(snap, own=False)
    assert residuals(sgd) == {} and list(cpu.get_rng_state()) == moved
    assert (state.steps, sampler.cursor) == (3, 12)


def test_a_process_still_waiting_when_the_job_finishes_exits_with_status_0(one_rank):
    comm = dist.elastic.init(timeout=30)
    first = dist.elastic.current()
    late = Membership(LaunchEnv("torchrun", 1, 1, "127.0.0.1", first.store.port), timeout=30)
    try:
        late.start()
        assert late.pending
        state = dist.elastic.State(log=None)

        @dist.elastic.run
        def train(state):
            return "trained"

        assert train(state) == "trained" and comm.world_size == 1  # the members finish: they say so in the store
        with pytest.raises(JobFinished, match="the job finished before this process could join it") as info:
            late.regroup(-1)
        assert info.value.code == 0
    finally:
        late.close()
