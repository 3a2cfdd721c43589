"""A resumed run continues bit for bit as an uninterrupted one: 2 ranks, every DistOpt method (plain, half,
partial, sparse top-K and threshold), under mpiexec (mpi backend), singa-run and Python multiprocessing
(shm backend). For each
launcher three jobs run tests/multiproc/jobs/ckpt_job.py: the whole run, the first part ending in a checkpoint, and
the rest in new processes from that checkpoint; every subprocess has a hard time limit. Also: a save over
another job's checkpoint is refused on both ranks."""
import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from singa_lite import _core

import checkpoint_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402
from paths import JOBS, job  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = job("ckpt_job.py")
sys.path.insert(0, JOBS)  # the job's model and settings, shared with the test
from ckpt_job import BATCH, METHODS, STOP, Net  # noqa: E402

from singa_lite import checkpoint, opt, tensor  # noqa: E402

# Variables of an enclosing launcher must not leak into the jobs.
CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                      "LOCAL_WORLD_SIZE")}


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(here):
        pytest.skip("no mpiexec next to this Python: pip install 'singa_lite[mpi]'")
    pytest.importorskip("mpi4py")
    return [here, "-n", "2", sys.executable, JOB]


def shm():
    if not hasattr(_core, "ShmComm"):
        pytest.skip("this build has no shm backend")


def singa_run():
    shm()
    return [sys.executable, "-m", "singa_lite.run", "-np", "2", JOB]


def multiprocessing():
    shm()
    return [sys.executable, JOB, "--multiprocessing"]


LAUNCHERS = {"mpiexec": mpiexec, "singa-run": singa_run, "multiprocessing": multiprocessing}


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def runs(request, tmp_path_factory):
    """{phase: {method: [rank 0's arrays, rank 1's]}} of the three jobs under one launcher, the output of
    the errors job ("errors"), the work directory ("dir") and the launcher's name ("launcher")."""
    launcher = LAUNCHERS[request.param]()
    workdir = str(tmp_path_factory.mktemp(request.param.replace("-", "")))
    out = {"dir": workdir, "launcher": request.param}
    for phase in ("full", "first", "resume", "errors"):
        if phase == "errors":
            shutil.copytree(os.path.join(workdir, "ckpt-plain"), os.path.join(workdir, "ckpt-keep"))
            shutil.copytree(os.path.join(workdir, "ckpt-plain"), os.path.join(workdir, "ckpt-missing"))
            os.remove(glob.glob(os.path.join(workdir, "ckpt-missing", "rank-00001.*"))[0])
        proc = subprocess.run(launcher + [phase, workdir], capture_output=True, text=True, timeout=120,
                              env=CLEAN, cwd=HERE)
        assert proc.returncode == 0, f"{request.param} {phase}:\n{proc.stdout}\n{proc.stderr}"
        if phase == "errors":
            out[phase] = proc.stdout
        else:
            out[phase] = {m: [dict(np.load(os.path.join(workdir, f"{phase}-{m}-rank{r}.npz"))) for r in range(2)]
                          for m in METHODS}
    return out


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_resume_is_bitwise_identical(runs, method):
    for rank in range(2):
        full, first, resumed = (runs[p][method][rank] for p in ("full", "first", "resume"))
        assert same_bits(first["losses"], full["losses"][:STOP]), f"rank {rank}: runs are not deterministic"
        assert same_bits(resumed["losses"], full["losses"][STOP:]), \
            f"rank {rank}: losses after the resume differ\n{resumed['losses']}\n{full['losses'][STOP:]}"
        assert sorted(resumed) == sorted(full)
        for k in set(full) - {"losses"}:
            assert same_bits(resumed[k], full[k]), f"rank {rank}: {k} differs after the resume"


def test_the_ranks_states_differ_where_they_should(runs):
    # What makes the per-rank files necessary: batch-norm statistics of each rank's own batches, and with
    # partial updates the parameters themselves, differ between the ranks at the end of the run.
    ranks = runs["full"]["plain"]
    assert not same_bits(ranks[0]["model/bn.running_mean"], ranks[1]["model/bn.running_mean"])
    assert same_bits(ranks[0]["model/fc.W"], ranks[1]["model/fc.W"])
    ranks = runs["full"]["partial"]
    assert not all(same_bits(ranks[0][k], ranks[1][k]) for k in ranks[0] if k.startswith("model/"))


def test_a_failure_on_one_rank_raises_on_every_rank(runs):
    out = runs["errors"]
    for r in range(2):
        load = [line for line in out.splitlines() if f"rank {r} load CheckpointError" in line]
        assert len(load) == 1 and "rank-00001." in load[0] and "missing (rank 1's file" in load[0], out
        save = [line for line in out.splitlines() if f"rank {r} save CheckpointError" in line]
        assert len(save) == 1 and "the previous checkpoint is unchanged: rank 0:" in save[0], out
        assert "extra['bad'] is an array of dtype object" in save[0], out
    assert len(os.listdir(os.path.join(runs["dir"], "ckpt-keep"))) == 4  # manifest, shared, 2 ranks: no strays


@pytest.mark.parametrize("ranks", [1, 3])
def test_resharding_to_another_number_of_ranks(runs, ranks):
    """The 2-rank checkpoints of every method loaded on 1 and on 3 ranks (singa-run; the job's reshard phase
    asserts what carries over, then trains on)."""
    if runs["launcher"] != "singa-run":
        pytest.skip("run once, with the singa-run launcher's checkpoints")
    shm()
    proc = subprocess.run([sys.executable, "-m", "singa_lite.run", "-np", str(ranks), JOB, "reshard", runs["dir"]],
                          capture_output=True, text=True, timeout=120, env=CLEAN, cwd=HERE)
    assert proc.returncode == 0, f"reshard on {ranks}:\n{proc.stdout}\n{proc.stderr}"
    assert all(f"OK reshard rank {r}" in proc.stdout for r in range(ranks)), proc.stdout


def test_another_number_of_ranks_is_refused(runs):
    net = Net(*METHODS["plain"])
    net.set_optimizer(opt.SGD(lr=0.1))
    net.compile([tensor.Tensor((BATCH, 1, 5, 5))], is_train=True)
    with pytest.raises(checkpoint.CheckpointError, match=r"saved by 2 rank\(s\), loaded by 1"):
        checkpoint.load(os.path.join(runs["dir"], "ckpt-plain"), net, net.optimizer)


def test_a_save_over_another_jobs_checkpoint_is_refused_on_every_rank(tmp_path):
    """2 shm ranks (multiprocessing): rank 0 decides whether a save may replace the checkpoint there (another
    job's id: refused on both ranks, none hangs; overwrite=True, or a load first: allowed); see
    tests/unit/test_checkpoint_owner.py for every rule in one process."""
    shm()
    out, _, _ = run_ranks(checkpoint_cases.scenario_another_jobs_checkpoint, 2, timeout=120,
                          args=(str(tmp_path / "ck"),))
    assert out == {r: ("ok", "ok") for r in range(2)}, out
