"""In-process elasticity (issue 31, point 2): dist.elastic.run keeps an env-launched job training when a rank is
SIGKILLed mid-epoch (the survivors regroup without restarting), lets a process that comes later join at a
commit, and fails with a message naming what it waited for below min_np. The job (jobs/inprocess_elastic_job.py)
records the indices each commit covers: every sample of every epoch is committed exactly once across the
failure. Every job runs under a hard limit."""
import collections
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from singa_lite import _core

from paths import JOBS

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

JOB = os.path.join(JOBS, "inprocess_elastic_job.py")
LAUNCH_VARS = ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SINGA_LITE_JOB_ID", "SINGA_LITE_RESTART_COUNT",
               "TORCHELASTIC_RESTART_COUNT", "KILL_AT", "KILL_RANK", "MIN_NP", "MAX_NP", "STEP_SLEEP", "WAIT_JOIN",
               "SINGA_LITE_STORE_SERVER", "SINGA_LITE_ELASTIC_MIN_NP", "SINGA_LITE_ELASTIC_MAX_NP")
LIMIT_S = 180
N, BATCH, EVERY, EPOCHS = 600, 8, 5, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(port: int, world: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), SINGA_LITE_COMM_TIMEOUT="5",
               SINGA_LITE_ELASTIC_TIMEOUT="60", OMP_NUM_THREADS="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(logdir, rank: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, JOB, str(logdir), str(N), str(BATCH), str(EVERY), str(EPOCHS)],
                            env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(procs) -> list:
    """(exit code, output) of each process, killing all of them after LIMIT_S."""
    deadline = time.monotonic() + LIMIT_S
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text, _ = p.communicate()
            text += "\nTEST: killed after the limit"
        out.append((p.returncode, text))
    return out


def committed(logdir) -> collections.Counter:
    """(epoch, index) -> how many times a commit of some process covered it."""
    seen = collections.Counter()
    for name in os.listdir(logdir):
        with open(os.path.join(logdir, name)) as f:
            for line in f:
                epoch, *ids = map(int, line.split())
                seen.update((epoch, i) for i in ids)
    return seen


def check_exact(logdir, text: str) -> None:
    seen = committed(logdir)
    assert set(seen) == {(e, i) for e in range(EPOCHS) for i in range(N)}, text
    twice = [k for k, c in seen.items() if c != 1]
    assert not twice, f"committed more than once: {twice[:10]}\n{text}"
    total = N * (N - 1) // 2  # the sum of every index, per epoch, as the job's state counted it
    assert f"sums {[float(total)] * EPOCHS}" in text, text


def accuracy(text: str) -> float:
    return float(re.search(r"^done world \d+ steps \d+ accuracy ([\d.]+)", text, re.M).group(1))


def runner_threads(text: str) -> dict:
    """rank -> the communicators' worker threads each process still has at its end."""
    return {int(r): [t for t in names.split() if re.fullmatch(r"singa_lite-(shm|tcp)-rank\d+", t)]
            for r, names in re.findall(r"^threads rank (\d+) (.*)$", text, re.M)}


def uninterrupted_run(logdir, backend: str) -> str:
    """The job on 3 plain processes, nobody killed: the peer of the runs with a failure."""
    os.makedirs(logdir, exist_ok=True)
    env = environment(free_port(), 3, SINGA_LITE_COMM_BACKEND=backend)
    uninterrupted = finish([start(logdir, r, env) for r in range(3)])
    text0 = "".join(t for _, t in uninterrupted)
    assert [c for c, _ in uninterrupted] == [0, 0, 0], text0
    check_exact(logdir, text0)
    return text0


@pytest.fixture(scope="module")
def uninterrupted_shm(tmp_path_factory):
    """One uninterrupted shm run for every test of this module that compares with it (CI time)."""
    return uninterrupted_run(tmp_path_factory.mktemp("clean"), "shm")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_sigkill_of_one_rank_of_three_the_survivors_finish_in_process(tmp_path, backend, request):
    text0 = (request.getfixturevalue("uninterrupted_shm") if backend == "shm" else
             uninterrupted_run(tmp_path / "clean", backend))

    logdir = tmp_path / "killed"
    logdir.mkdir()
    # step 17 is between the commits at 15 and 20: steps 16 and 17 are lost and done again on 2 ranks
    env = environment(free_port(), 3, SINGA_LITE_COMM_BACKEND=backend, KILL_AT=17, KILL_RANK=1)
    results = finish([start(logdir, r, env) for r in range(3)])
    text = "".join(f"--- launch rank {r}: exit {c}\n{t}" for r, (c, t) in enumerate(results))
    assert [c for c, _ in results] == [0, -9, 0], text
    # (the cause it quotes is the first error this rank saw: rank 1's death, or a survivor's abort because of it)
    assert re.search(r"^elastic: round 1: 3 -> 2 rank\(s\) after a failure \(.*\); going on from the commit at step 15 "
                     r"\(epoch 0", text, re.M), text
    assert "regrouped rank 1 of 2 at step 15 epoch 0" in text, text
    assert re.search(r"^done world 2 steps \d+ accuracy [\d.]+ resets 1 ", text, re.M), text
    check_exact(logdir, text)
    assert accuracy(text) >= accuracy(text0) - 0.02, text
    # the failed communicator's worker threads ended with it: at most the current one's in each survivor
    threads = runner_threads(text)
    assert sorted(threads) == [0, 1] and all(len(v) <= 1 for v in threads.values()), text
    # and no shared-memory segment of theirs is still mapped
    before = max(map(int, re.findall(r" shm (\d+)$", text0, re.M)))
    assert max(map(int, re.findall(r" shm (\d+)$", text, re.M))) <= before, text


@pytest.mark.slow
def test_a_process_that_comes_later_joins_at_the_next_commit(tmp_path):
    port = free_port()
    env = environment(port, 2, MAX_NP=3, STEP_SLEEP=0.05)
    procs = [start(tmp_path, r, env) for r in range(2)]
    line = procs[0].stdout.readline()  # "started ...": round 0 is over
    assert line.startswith("started rank 0"), line
    time.sleep(1.0)
    procs.append(start(tmp_path, 1, env))  # RANK 1 again: a new process, not a claim on rank 1's place
    results = finish(procs)
    text = line + "".join(f"--- process {k}: exit {c}\n{t}" for k, (c, t) in enumerate(results))
    assert [c for c, _ in results] == [0, 0, 0], text
    assert re.search(r"^elastic: round 1: 2 -> 3 rank\(s\) after processes joined", text, re.M), text
    assert re.search(r"^done world 3 steps \d+ accuracy", text, re.M), text
    check_exact(tmp_path, text)


@pytest.mark.slow
def test_below_min_np_the_survivors_wait_then_fail_naming_what_they_waited_for(tmp_path):
    env = environment(free_port(), 3, KILL_AT=7, KILL_RANK=2, MIN_NP=3, SINGA_LITE_ELASTIC_TIMEOUT=6)
    started = time.monotonic()
    results = finish([start(tmp_path, r, env) for r in range(3)])
    elapsed = time.monotonic() - started
    text = "".join(f"--- launch rank {r}: exit {c}\n{t}" for r, (c, t) in enumerate(results))
    assert [c for c, _ in results][2] == -9, text
    assert all(c not in (0, None) for c, _ in results[:2]), text
    for _, t in results[:2]:
        assert re.search(r"ElasticTimeout: dist\.elastic, round 1: waited 6 s for at least min_np=3 rank\(s\): 2 "
                         r"process\(es\) are here", t), text
    assert "1 gone (ended, or no heartbeat for 3 s: " in text, text
    assert elapsed < LIMIT_S, text


def singa_run(logdir, *flags, **extra) -> subprocess.Popen:
    """The job under `singa-run --elastic` (singa-run serves the store; no rank does)."""
    env = {k: v for k, v in environment(0, 1, **extra).items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")}
    cmd = [sys.executable, "-m", "singa_lite.run", "--elastic", *flags, JOB, str(logdir), str(N), str(BATCH),
           str(EVERY), str(EPOCHS)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_singa_run_elastic_survives_the_loss_of_launch_rank_0_and_a_replacement_joins(tmp_path, uninterrupted_shm):
    # launch rank 0 (the first round's rank 0) SIGKILLs itself at step 17, between the commits at 15 and 20; the
    # peer is the same job uninterrupted (same seed, shm), on plain processes
    [(code, text)] = finish([singa_run(tmp_path, "-np", "3", "--max-restarts", "1", KILL_AT=17, KILL_RANK=0,
                                       WAIT_JOIN=3)])
    assert code == 0, text
    assert "singa-run: rank 0 failed (killed by SIGKILL): the 2 other(s) go on (--elastic); starting rank 3 in its " \
           "place (replacement 1 of at most 1)" in text, text
    # the survivors regrouped without launch rank 0: launch rank 1 is rank 0 now and speaks for the job
    assert re.search(r"^\[rank 1\] elastic: round 1: 3 -> 2 rank\(s\) after a failure \(.*\); going on from the "
                     r"commit at step 15 \(epoch 0", text, re.M), text
    # the replacement joined at a later commit, and the job ended on 3 ranks again
    assert re.search(r"^\[rank 3\] regrouped rank 2 of 3 at step \d+", text, re.M), text
    assert re.search(r"elastic: round 2: 2 -> 3 rank\(s\) after processes joined", text), text
    assert re.search(r"^\[rank 1\] done world 3 steps \d+ accuracy [\d.]+ resets 2 ", text, re.M), text
    assert "singa-run: elastic job finished: rank(s) " in text and "failed: 0 (killed by SIGKILL)" in text, text
    check_exact(tmp_path, text)
    assert abs(accuracy(text.replace("[rank 1] ", "")) - accuracy(uninterrupted_shm)) <= 0.02, text
