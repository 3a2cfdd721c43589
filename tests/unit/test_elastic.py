"""Restart and resume in one process (issue 31, item 1): ElasticSampler's exact resume on any number of ranks,
ElasticState's resume and commit, the launcher's generation variables and options, and the store refusing a
rank of another generation."""
import sys

import numpy as np
import pytest

from singa_lite import opt, tensor
from singa_lite.checkpoint import CheckpointError, ElasticState
from singa_lite.comm import env, launch_args
from singa_lite.comm.communicator import CommError
from singa_lite.comm.store import TcpStore
from singa_lite.data import DistributedSampler, ElasticSampler
from singa_lite.optim.amp import LossScaler


# ---------------------------------------------------------------- the sampler
def consume(n, world, batch, cursor, steps=None, epoch=0, seed=1):
    """The indices each rank takes, step by step, from `cursor` on (`steps` steps, None: to the epoch's end);
    returns (indices of all ranks, the cursor after)."""
    samplers = [ElasticSampler(n, r, world, batch, seed=seed) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch, cursor=cursor)
    iters = [iter(s) for s in samplers]
    taken, k = [], 0
    while steps is None or k < steps:
        got = [next(it, None) for it in iters]
        if got[0] is None:
            assert all(g is None for g in got)  # every rank runs out at the same step
            break
        taken += [i for g in got for i in g.tolist()]
        k += 1
    cursors = {s.cursor for s in samplers}
    assert len(cursors) == 1
    return taken, cursors.pop()


@pytest.mark.parametrize("n,batch,before,after", [(103, 4, 2, 2), (103, 4, 2, 1), (103, 4, 2, 3), (100, 5, 1, 4),
                                                  (97, 3, 3, 2)])
def test_a_failure_between_commits_consumes_every_sample_once(n, batch, before, after):
    """Steps after the last commit are lost with the failure: the resumed ranks, however many, take exactly
    the indices the committed steps did not."""
    committed, cursor = consume(n, before, batch, 0, steps=5)
    lost, _ = consume(n, before, batch, cursor, steps=2)  # trained, then lost: not committed
    assert lost  # those samples come again after the resume
    saved = ElasticSampler(n, 0, before, batch, seed=1)
    saved.set_epoch(0, cursor=cursor)
    state = saved.state_dict()
    resumed = ElasticSampler(n, 0, after, batch, seed=1)
    resumed.load_state_dict(resumed.resharded_state(state))
    assert resumed.cursor == cursor and resumed.epoch == 0
    rest, end = consume(n, after, batch, resumed.cursor)
    assert end == n
    assert sorted(committed + rest) == list(range(n))


def test_steps_and_shares():
    s = [ElasticSampler(10, r, 3, 2, shuffle=False) for r in range(3)]
    assert [x.step_indices().tolist() for x in s] == [[0, 1], [2, 3], [4, 5]]
    assert len(s[0]) == 2  # 6 + the last 4
    assert [x.step_indices(cursor=6).tolist() for x in s] == [[6, 7], [8], [9]]  # the rest, as even as can be
    assert [b.tolist() for b in s[1]] == [[2, 3], [8]] and s[1].cursor == 10 and len(s[1]) == 0
    s[1].set_epoch(1)
    assert s[1].cursor == 0 and len(s[1]) == 2
    # the permutation is DistributedSampler's: the same on every rank, another one each epoch
    a, b = ElasticSampler(50, 0, 2, 4, seed=3), DistributedSampler(50, 0, 1, seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    assert np.array_equal(a.order(), b.order())


def test_sampler_errors():
    with pytest.raises(ValueError, match="rank must be in"):
        ElasticSampler(10, 2, 2, 4)
    with pytest.raises(TypeError, match="num_samples is the dataset's size"):
        ElasticSampler(np.zeros(10), 0, 1, 4)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ElasticSampler(10, 0, 1, 0)
    s = ElasticSampler(10, 0, 2, 2, seed=1)
    with pytest.raises(ValueError, match="seed=2, this sampler 1"):
        s.load_state_dict({**s.state_dict(), "seed": 2})
    with pytest.raises(ValueError, match="no 'cursor'.*DistributedSampler"):
        s.load_state_dict(DistributedSampler(10, 0, 2).state_dict())
    with pytest.raises(ValueError, match="cursor must be in"):
        s.set_epoch(0, cursor=11)
    with pytest.raises(ValueError, match="made for 10 samples"):
        s.batches(np.zeros(9), np.zeros(9))


# ---------------------------------------------------------------- ElasticState
def parts(seed=0):
    w = tensor.from_numpy(np.random.default_rng(seed).standard_normal((3, 2)).astype(np.float32))
    w.requires_grad = w.stores_grad = True
    w.name = "w"
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    return {"w": w}, sgd


def train(model, sgd, sampler, state, steps):
    x = np.random.default_rng(9).standard_normal((sampler.num_samples, 3)).astype(np.float32)
    for _ in range(steps):
        idx = next(iter(sampler))
        g = tensor.from_numpy(np.repeat(x[idx].mean(0, keepdims=True), 2, 0).T.copy())
        sgd.apply("w", model["w"], g)
        sgd.step()
        state.step()


def test_resume_restores_the_commit_and_counts_steps(tmp_path):
    logs = []
    model, sgd = parts()
    sampler = ElasticSampler(40, 0, 1, 4, seed=2)
    scaler = LossScaler(init_scale=8.0)
    state = ElasticState(str(tmp_path / "c"), model=model, optimizer=sgd, sampler=sampler, scaler=scaler, every=3,
                         log=logs.append)
    start = state.resume()
    assert not start.resumed and start.step == 0 and "no commit" in logs[-1]
    train(model, sgd, sampler, state, 7)  # commits after steps 3 and 6
    scaler.update(True)  # after the last commit: lost
    # the state of the commit of step 6: train another copy 6 steps
    m2, s2 = parts()
    smp2 = ElasticSampler(40, 0, 1, 4, seed=2)
    train(m2, s2, smp2, ElasticState(str(tmp_path / "other"), model=m2, optimizer=s2, sampler=smp2, log=None), 6)
    at6 = tensor.to_numpy(m2["w"])
    model3, sgd3 = parts(seed=5)  # a fresh process: other initial values
    sampler3 = ElasticSampler(40, 0, 1, 4, seed=2)
    scaler3 = LossScaler(init_scale=1.0)
    state3 = ElasticState(str(tmp_path / "c"), model=model3, optimizer=sgd3, sampler=sampler3, scaler=scaler3,
                          every=3, log=logs.append)
    start = state3.resume()
    assert start.resumed and start.step == 6 and start.epoch == 0 and start.saved_world_size == 1
    assert sampler3.cursor == 24 and state3.steps == 6
    assert "resumed from the commit at step 6 (epoch 0, cursor 24 of 40)" in logs[-1]
    np.testing.assert_array_equal(tensor.to_numpy(model3["w"]), at6)
    assert scaler3.get_states() == {"scale": 8.0, "good_steps": 0, "overflows": 0}
    state3.commit(extra={"note": [1, 2]})
    assert ElasticState(str(tmp_path / "c"), model=parts()[0], optimizer=opt.SGD(lr=0.1, momentum=0.9),
                        sampler=ElasticSampler(40, 0, 1, 4, seed=2), log=None).resume().extra == {"note": [1, 2]}


def test_elastic_state_errors(tmp_path):
    with pytest.raises(ValueError, match="every must be None or a number of steps >= 1"):
        ElasticState(str(tmp_path), every=0)
    with pytest.raises(TypeError, match="scaler must have get_states"):
        ElasticState(str(tmp_path), scaler=object())
    model, _ = parts()
    from singa_lite import checkpoint

    checkpoint.save(str(tmp_path / "plain"), model)
    with pytest.raises(CheckpointError, match="not written by ElasticState.commit"):
        ElasticState(str(tmp_path / "plain"), model=model, log=None).resume()


# ---------------------------------------------------------------- generations
def test_generation_comes_from_the_launcher():
    assert env.generation({}) == 0
    assert env.generation({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    assert env.generation({"SLURM_RESTART_COUNT": "3"}) == 3
    assert env.generation({"SINGA_LITE_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "2"}) == 1
    with pytest.raises(ValueError, match="TORCHELASTIC_RESTART_COUNT must be the number of restarts"):
        env.generation({"TORCHELASTIC_RESTART_COUNT": "-1"})


def test_the_store_refuses_a_rank_of_another_generation():
    server = TcpStore("127.0.0.1", 0, 2, is_server=True, timeout=10, rank=0, generation=1)
    try:
        with pytest.raises(CommError, match="serves generation 1 of the job.*generation 0: a rank of an earlier"):
            TcpStore("127.0.0.1", server.port, 2, is_server=False, timeout=5, rank=1, generation=0)
        peer = TcpStore("127.0.0.1", server.port, 2, is_server=False, timeout=5, rank=1, generation=1)
        peer.set("k", b"v")
        assert server.get("k") == b"v"
        peer.close()
    finally:
        server.close()
    with pytest.raises(ValueError, match="generation must be an int >= 0"):
        TcpStore("127.0.0.1", 0, 1, is_server=True, generation=-1)


# ---------------------------------------------------------------- singa-run's options
def singa_run_args(argv):
    args = launch_args.parse_command_line(launch_args.build_parser(), argv)
    launch_args.check_args(args)
    return args


def test_restart_variables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    args = singa_run_args(["-np", "2", "--max-restarts", "3", "train.py", "--max-restarts", "9"])
    assert args.max_restarts == 3 and args.args == ["--max-restarts", "9"]  # the script's own stays its own
    args.generation = 2
    e = launch_args.rank_environment(args, 1, "holder", base={})
    assert e["SINGA_LITE_RESTART_COUNT"] == "2" and e["SINGA_LITE_MAX_RESTARTS"] == "3"
    assert "SINGA_LITE_RESTART_COUNT" not in launch_args.rank_environment(singa_run_args(["-np", "2", "train.py"]),
                                                                          0, "holder", base={})


@pytest.mark.parametrize("argv,message", [
    (["-np", "2", "--max-restarts", "-1", "train.py"], "--max-restarts must be a number of restarts from 0"),
    (["-np", "2", "--restart-delay", "-1", "train.py"], "--restart-delay must be a number of seconds"),
    (["-np", "2", "--min-np", "1", "train.py"], "--min-np is for jobs on the hosts of a --hostfile"),
    (["--hostfile", "HOSTS", "--min-np", "5", "train.py"], "--min-np must be from 1 to -np (2)"),
])
def test_restart_option_errors(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "HOSTS").write_text("h1:1\nh2:1\n")
    with pytest.raises(launch_args.UsageError) as info:
        singa_run_args(argv)
    assert message in str(info.value)


def test_min_np_leaves_out_the_hosts_that_do_not_answer(tmp_path, monkeypatch):
    """--launcher-exec is called as `CMD host true`: here a script that answers for h1 and h3 only."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "HOSTS").write_text("h1:2\nh2:2\nh3:1\n")
    probe = tmp_path / "probe"
    probe.write_text(f"#!{sys.executable}\nimport sys, time\nif sys.argv[1] == 'h2': time.sleep(30)\n"
                     f"sys.exit(0 if sys.argv[1] in ('h1', 'h3') else 1)\n")
    probe.chmod(0o755)
    args = singa_run_args(["--hostfile", "HOSTS", "--min-np", "3", "--max-restarts", "1", "--probe-timeout", "2",
                           "--launcher-exec", str(probe), "train.py"])
    alive = launch_args.answering_hosts(args, args.hosts)
    assert alive == [("h1", 2), ("h3", 1)]
    launch_args.replace_on_hosts(args, alive)
    assert args.np == 3 and [p["host"] for p in args.placement] == ["h1", "h1", "h3"] and args.master_addr == "h1"
    with pytest.raises(launch_args.UsageError, match=r"only 1 slot\(s\) left on the hosts that answer \(h3\)"):
        launch_args.replace_on_hosts(args, [("h3", 1)])
