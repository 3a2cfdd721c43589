"""A transformer encoder layer (layer.TransformerEncoderLayer) under DistOpt on 2 shm ranks started by
multiprocessing: the ranks' parameters after three steps equal one process's on the whole batch."""
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import transformer_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


def test_encoder_layer_trains_under_distopt_like_one_process():
    out, _, _ = run_ranks(transformer_cases.scenario_distopt, 2, timeout=180)
    assert out == {0: ("ok", "ok"), 1: ("ok", "ok")}, out
