"""DistOpt's training features on 1 to 3 shm ranks started by multiprocessing: gradient accumulation,
clipping by the global norm, buffers and SyncBatchNorm2d, join for uneven inputs. Scenarios live in
training_cases.py (the mpi backend runs them too: test_training_features_mpi.py)."""
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import training_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


@pytest.mark.parametrize("name,world_size", [
    ("accumulation", 2),
    ("accumulation", 3),
    ("accumulation_misuse", 2),
    ("clip_grad_norm", 2),
    ("clip_grad_norm", 3),
    ("sync_batchnorm", 2),
    ("sync_batchnorm", 3),
    ("sync_buffers", 2),
    ("sync_buffers", 3),
    ("buffers_at_checkpoint", 2),
    ("buffers_at_checkpoint", 3),
    ("join", 2),
    ("join", 3),
    ("join_ddp_and_accumulation", 2),
    ("join_ddp_and_accumulation", 3),
])
def test_scenario(name, world_size):
    out, _, _ = run_ranks(training_cases.run, world_size, timeout=300, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out


# ---------------------------------------------------------------- a rank that simply finished early
def test_a_rank_that_finished_early_is_named_with_the_likely_cause():
    # rank 0 returns while rank 1 enters one more all-reduce: rank 1's error says rank 0 left (not "died")
    # and points at a different number of steps and at join()
    out, _, _ = run_ranks(training_cases.scenario_finished_early, 2, timeout=60, comm_timeout=20)
    assert out[0] == ("ok", "ok"), out
    kind, message = out[1][0], out[1][2]
    assert kind == "error" and out[1][1] == "CommError", out
    assert "rank 0" in message and "left" in message and "died" not in message, message
    assert "number of steps probably differed" in message and "dist_opt.join()" in message, message


def test_singa_run_says_a_rank_exited_normally_before_the_failure(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "early.py"
    script.write_text("import numpy as np\n"
                      "from singa_lite import dist, tensor\n"
                      "comm = dist.init(timeout=20)\n"
                      "if comm.rank != 0:\n"
                      "    import time; time.sleep(0.3)\n"
                      "    comm.all_reduce(tensor.from_numpy(np.ones(4, np.float32)))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SINGA_LITE", "PMI", "OMPI", "HYDRA"))}
    proc = subprocess.run([sys.executable, "-m", "singa_lite.run", "-np", "2", "--backend", "shm", str(script)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert ("rank(s) 0 exited normally with code 0 while rank 1 was still running (inside a collective, if its "
            "error names them): the number of steps probably differed") in out, out
    assert "left (it exited or closed its communicator)" in out, out
