"""bfloat16 on the wire and mixed precision (amp.MixedPrecision) under DistOpt, on 2 and 3 shm ranks started
by multiprocessing. Scenarios live in helpers/amp_cases.py."""
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import amp_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


@pytest.mark.parametrize("name,world_size", [
    ("all_reduce_bf16", 2),
    ("all_reduce_bf16", 3),
    ("half_bf16", 2),
    ("half_bf16", 3),
    ("amp_skip", 2),
    ("amp_skip", 3),
    ("amp_bf16_wire", 2),
    ("amp_partial", 2),
    ("amp_partial", 3),
])
def test_scenario(name, world_size):
    out, _, _ = run_ranks(amp_cases.run, world_size, timeout=300, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out
