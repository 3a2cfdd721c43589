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
    ("join", 2),
    ("join", 3),
])
def test_scenario(name, world_size):
    out, _, _ = run_ranks(training_cases.run, world_size, timeout=300, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out
