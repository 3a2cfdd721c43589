"""The timeline of a 2-rank shm DistOpt job: singa-run --timeline gathers one file per rank with the
all-reduce buckets on the communication track, and merges them into one trace (one process per rank)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

JOB = textwrap.dedent("""
    import numpy as np
    from singa_lite import autograd, layer, opt, tensor
    from singa_lite.model import Model

    class Net(Model):
        def __init__(self):
            super().__init__()
            self.l1 = layer.Linear(16)
            self.act = layer.ReLU()
            self.l2 = layer.Linear(3)

        def forward(self, x):
            return self.l2(self.act(self.l1(x)))

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = autograd.softmax_cross_entropy(out, y)
            # a small threshold: several buckets per step, some leaving during backward
            self.optimizer.backward_and_update(loss, threshold=40)
            return out, loss

    rng = np.random.default_rng(1)
    x = tensor.from_numpy(rng.random((6, 8)).astype(np.float32))
    y = tensor.from_numpy(np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2]])
    m = Net()
    m.set_optimizer(opt.DistOpt(opt.SGD(lr=0.1), first_bucket=20))
    m.compile([x], is_train=True, use_graph=False)
    for _ in range(STEPS):
        m(x, y)
""")
STEPS = 3


def _events(path):
    with open(path) as f:
        doc = json.load(f)
    evs = doc["traceEvents"]
    assert all(e["ph"] in ("X", "M") for e in evs)
    return doc, [e for e in evs if e["ph"] == "X"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tl")
    script = tmp / "job.py"
    script.write_text(JOB.replace("STEPS", str(STEPS)))
    out = tmp / "timeline"
    r = subprocess.run([sys.executable, "-m", "singa_lite.run", "-np", "2", "--backend", "shm", "--timeout", "60",
                        "--timeline", str(out), str(script)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r


def test_singa_run_gathers_both_ranks_and_merges(job):
    out, r = job
    assert sorted(os.listdir(out)) == ["timeline.json", "timeline.rank0.json", "timeline.rank1.json"]
    assert f"timeline of 2 of 2 rank(s): {out / 'timeline.json'}" in r.stderr
    merged, evs = _events(out / "timeline.json")
    assert {e["pid"] for e in evs} == {0, 1}
    per_rank = [_events(out / f"timeline.rank{k}.json")[1] for k in range(2)]
    assert len(evs) == sum(len(e) for e in per_rank)
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}


@pytest.mark.parametrize("rank", [0, 1])
def test_buckets_on_the_comm_track(job, rank):
    out, _ = job
    doc, evs = _events(out / f"timeline.rank{rank}.json")
    assert doc["otherData"]["rank"] == rank and doc["otherData"]["world_size"] == 2
    assert all(e["pid"] == rank for e in evs)
    steps = [e for e in evs if e["cat"] == "step"]
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(STEPS)]
    assert len([e for e in evs if e["cat"] == "gap"]) == STEPS - 1
    comm = [e for e in evs if e["cat"] == "comm"]
    assert comm and all(e["tid"] >= 1 for e in comm)  # never on the training thread's track
    sends = [e for e in evs if e["cat"] == "launch"]
    assert len(sends) == len(comm) and all(e["tid"] == 0 for e in sends)
    # the parameters: 8*16 + 16 + 16*3 + 3 = 195 floats a step, in several buckets
    for step in steps[1:]:  # the first step exchanges after the whole backward (models compared first)
        in_step = [e for e in comm if step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        assert len(in_step) >= 3
        assert sum(e["args"]["bytes"] for e in in_step) == 195 * 4
        assert sum(e["args"]["elements"] for e in in_step) == 195
        # overlap: the first bucket left before the backward pass ended
        bwd = [e for e in evs if e["cat"] == "backward" and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        first_send = min(e["ts"] for e in sends if step["ts"] <= e["ts"] <= step["ts"] + step["dur"])
        assert first_send < max(e["ts"] for e in bwd)
        waits = [e for e in evs if e["cat"] == "wait" and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        updates = [e for e in evs if e["cat"] == "update" and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        assert len(updates) == 1 and waits
        assert max(w["ts"] for w in waits) <= updates[0]["ts"]  # the update follows the wait
    for e in comm:  # each collective ends after its launch; the comm thread runs them one at a time
        assert e["dur"] > 0 and e["args"]["queued_us"] >= 0 and e["args"]["dtype"] == "float32"
    lane1 = sorted((e for e in comm if e["tid"] == 1), key=lambda e: e["ts"])
    for a, b in zip(lane1, lane1[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3


def _spawned_rank(rank, holder, out, queue):
    """A rank started by multiprocessing (no RANK in the environment): the file is named after the rank of
    the communicator DistOpt uses, which the timeline learns from the first bucket."""
    try:
        import numpy as np

        from singa_lite import autograd, layer, opt, tensor, timeline

        lin = layer.Linear(4)
        sgd = opt.DistOpt(opt.SGD(lr=0.1), nccl_id=holder, local_rank=rank, world_size=2, timeout=60)
        x = tensor.from_numpy(np.ones((2, 3), np.float32) * (rank + 1))
        y = tensor.from_numpy(np.eye(4, dtype=np.float32)[[0, 1]])
        autograd.training = True
        timeline.start(out)
        for _ in range(2):
            sgd.backward_and_update(autograd.softmax_cross_entropy(lin(x), y))
        queue.put((rank, timeline.stop()))
        sgd.communicator.close()
    except BaseException as e:  # reported to the test, which names the rank
        queue.put((rank, f"error: {type(e).__name__}: {e}"))


def test_multiprocessing_ranks_name_their_files(tmp_path):
    import multiprocessing as mp

    from singa_lite.dist import NcclIdHolder

    ctx = mp.get_context("spawn")
    holder, queue = NcclIdHolder(), ctx.Queue()
    out = str(tmp_path / "trace.json")
    env_rank = os.environ.pop("RANK", None)
    try:
        procs = [ctx.Process(target=_spawned_rank, args=(r, holder, out, queue)) for r in range(2)]
        for p in procs:
            p.start()
        got = dict(queue.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
    finally:
        if env_rank is not None:
            os.environ["RANK"] = env_rank
        holder.cleanup()
    assert got == {r: str(tmp_path / f"trace.rank{r}.json") for r in range(2)}, got
    for r in range(2):
        doc, evs = _events(got[r])
        assert doc["otherData"]["rank"] == r and doc["otherData"]["world_size"] == 2
        assert [e["name"] for e in evs if e["cat"] == "step"] == ["step 0", "step 1"]
        assert len([e for e in evs if e["cat"] == "comm"]) >= 2


def test_singa_run_timeline_option_checks(tmp_path):
    """--timeline names a directory (a file there is refused before anything starts); each rank gets the
    variable that makes it write its own file there."""
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    taken = tmp_path / "afile"
    taken.write_text("")
    r = subprocess.run([sys.executable, "-m", "singa_lite.run", "-np", "2", "--timeline", str(taken), str(script)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--timeline wants a directory" in r.stderr
    r = subprocess.run([sys.executable, "-m", "singa_lite.run", "-np", "2", "--dry-run", "--timeline",
                        str(tmp_path / "tl"), str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"SINGA_LITE_TIMELINE={tmp_path / 'tl'}{os.sep}") == 2


MP_JOB = textwrap.dedent("""
    import multiprocessing as mp
    import sys

    import numpy as np

    from singa_lite import autograd, layer, opt, tensor
    from singa_lite.dist import NcclIdHolder

    def rank_main(rank, holder):
        lin = layer.Linear(4)
        sgd = opt.DistOpt(opt.SGD(lr=0.1), nccl_id=holder, local_rank=rank, world_size=2, timeout=60)
        x = tensor.from_numpy(np.ones((2, 3), np.float32) * (rank + 1))
        y = tensor.from_numpy(np.eye(4, dtype=np.float32)[[0, 1]])
        autograd.training = True
        for _ in range(2):
            sgd.backward_and_update(autograd.softmax_cross_entropy(lin(x), y))
        sgd.communicator.close()

    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        holder = NcclIdHolder()
        procs = [ctx.Process(target=rank_main, args=(r, holder)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        sys.exit(max(p.exitcode for p in procs))
""")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_environment_variable_with_multiprocessing_ranks(tmp_path, method):
    """SINGA_LITE_TIMELINE set for a script that starts its ranks with multiprocessing (SINGA's seed
    pattern): each rank writes its own file although multiprocessing children skip atexit, and the parent,
    which ran no step, does not replace rank 0's file with an empty one."""
    script = tmp_path / "mp_job.py"
    script.write_text(MP_JOB)
    out = tmp_path / "tl"
    env = dict(os.environ, SINGA_LITE_TIMELINE=str(out) + os.sep)
    env.pop("RANK", None)
    r = subprocess.run([sys.executable, str(script), method], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == ["timeline.rank0.json", "timeline.rank1.json"]
    for rank in range(2):
        doc, evs = _events(out / f"timeline.rank{rank}.json")
        assert doc["otherData"]["rank"] == rank
        assert [e["name"] for e in evs if e["cat"] == "step"] == ["step 0", "step 1"]
        assert len([e for e in evs if e["cat"] == "comm"]) >= 2
