"""Fixtures shared by the GPU tests, and the guard of a GPU run: with SINGA_LITE_REQUIRE_GPU=1 (tools/gpu_check.sh's
test step sets it) a session that cannot use a GPU stops with the reason instead of skipping every GPU test and
ending green."""
import os
import secrets

import numpy as np
import pytest

import singa_lite
from singa_lite import _core, device


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SINGA_LITE_REQUIRE_GPU") != "1" or device.cuda_is_available():
        return
    cuda = singa_lite.build_info()["cuda"]
    raise pytest.UsageError(
        f"SINGA_LITE_REQUIRE_GPU=1 but no GPU is usable: {_core.cuda_unavailable_reason()} (build: CUDA compiled "
        f"{cuda['compiled']}, runtime {cuda['runtime_version']}, driver {cuda['driver_version']}). On a GPU machine "
        f"this is the failure to fix (a driver older than the build's CUDA, CUDA_VISIBLE_DEVICES, no device); "
        f"elsewhere unset SINGA_LITE_REQUIRE_GPU and the GPU tests skip.")


@pytest.fixture
def rng():
    """A generator on a fresh seed each run (more inputs seen over time); a failure message can name the seed
    (rng.seed_for_message) so that the run can be repeated."""
    seed = secrets.randbits(32)
    return _SeededGenerator(seed)


class _SeededGenerator(np.random.Generator):
    """numpy's Generator, remembering its seed (numpy 2.5's Generator takes no attributes of its own)."""

    def __init__(self, seed):
        super().__init__(np.random.PCG64(seed))
        self.seed_for_message = seed
