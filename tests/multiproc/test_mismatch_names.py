"""When one rank's backward gives no gradient for some parameters (its forward skipped a layer), the ranks'
gradient buckets differ. The error names those parameters, the rank, the step and the line of the user's script
that called the step, instead of only element counts (issue 18.3). On the shm backend (multiprocessing),
under mpiexec (mpi backend) and on the tcp backend; the model and training loop are helpers/mismatch_names_cases.py."""
import json
import re
import subprocess
import sys

import pytest

from dist_cases import run_ranks
from mismatch_names_cases import __file__ as CASES_PY, train_skipping
from paths import job

CASES = CASES_PY[:-1] if CASES_PY.endswith(".pyc") else CASES_PY
HINT = "A parameter is skipped when the rank's forward did not use it"


def _shm(*args):
    out, _, _ = run_ranks(train_skipping, 2, args=args, timeout=120, comm_timeout=30)
    assert sorted(out) == [0, 1], out
    for r in (0, 1):
        assert out[r][0] == "ok", out[r]
    return {r: out[r][1] for r in (0, 1)}


def _mpi(*args):
    pytest.importorskip("mpi4py")
    from test_dist_mpi import mpiexec

    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, job("mismatch_names_job.py"),
                           *(str(int(a) if isinstance(a, bool) else a) for a in args)],
                          capture_output=True, text=True, timeout=180)
    text = proc.stdout + proc.stderr
    # (mpiexec may join two ranks' lines into one: each result is decoded from its own start)
    found = {int(m.group(1)): tuple(json.JSONDecoder().raw_decode(text, m.end())[0])
             for m in re.finditer(r"RESULT (\d) ", text)}
    assert sorted(found) == [0, 1], text
    return found


def _tcp(*args):
    from test_tcp_backend import run_tcp

    out, _ = run_tcp(train_skipping, 2, args=args, timeout=120)
    for r in (0, 1):
        assert out[r][0] == "ok", out[r]
    return {r: out[r][1] for r in (0, 1)}


RUN = {"shm": _shm, "mpi": _mpi, "tcp": _tcp}


@pytest.mark.parametrize("backend", ["shm", "mpi", "tcp"])
@pytest.mark.parametrize("style", ["distopt", "two_phase"])
def test_every_rank_names_the_skipped_parameters_the_rank_the_step_and_the_line(backend, style):
    # the models were compared before training (as Model.compile does), so the difference shows in the buckets
    got = RUN[backend](1, 2, True, style, 2097152)
    for r in (0, 1):
        message, line = got[r]
        assert message.startswith("ValueError: DistOpt: the ranks' gradients differ at step 2 (called from "
                                  f"{CASES}:{line}): fc3.W, fc3.b skipped on rank 1. {HINT}"), message
        assert "The communicator said: " in message and "467 float32" in message, message


@pytest.mark.parametrize("backend", ["shm", "mpi"])
def test_data_parallel_names_them_too(backend):
    got = RUN[backend](1, 2, True, "data_parallel", 2097152)
    for r in (0, 1):
        message, line = got[r]
        assert message.startswith("ValueError: DataParallel: the ranks' gradients differ at step 2 (called from "
                                  f"{CASES}:{line}): fc3.W, fc3.b skipped on rank 1. {HINT}"), message


@pytest.mark.parametrize("backend", ["shm", "mpi"])
def test_a_layer_skipped_at_the_first_step_is_named_by_the_model_check(backend):
    got = RUN[backend](1, 1, False, "distopt", 2097152)
    for r in (0, 1):
        message, line = got[r]
        assert "rank 0 has 8 parameters, rank 1 has 6 (rank 1 lacks fc3.b, fc3.W)" in message, message
        assert f"did not use some parameters at the first step (called from {CASES}:{line})" in message, message


@pytest.mark.parametrize("buff", [4194304, 50], ids=["big-buffer", "buffer-fills-during-backward"])
@pytest.mark.parametrize("skip_rank", [0, 1])
def test_with_several_buckets_each_rank_says_what_it_knows(skip_rank, buff):
    # Small buckets (and the largest gradients alone), the buckets' all-reduces on the communication thread:
    # the rank that skipped sends fewer collectives, so after the first difference the ranks' calls no longer
    # pair up (later ones are still queued) and they exchange nothing more; the rank that skipped names its
    # parameters, the other says that another rank did. Neither hangs nor blames a death. With a small buffer
    # the difference is met in the middle of backward (a full buffer waits for its buckets): the rest of the pass
    # still counts, so no parameter is blamed for not being reached yet.
    threshold = 100 if buff > 100 else 40
    out, _, seconds = run_ranks(train_skipping, 2, args=(skip_rank, 2, True, "distopt", threshold, buff, "thread"),
                                timeout=120, comm_timeout=30)
    assert seconds < 25, seconds  # no rank waited for the communicator's timeout
    other = 1 - skip_rank
    skipped, line = out[skip_rank][1]
    assert f"at step 2 (called from {CASES}:{line}): fc3.W, fc3.b skipped on this rank (rank {skip_rank})" \
        in skipped, skipped
    told, _ = out[other][1]
    assert (f"this rank (rank {other}) had gradients for all 8 parameters of the first step, so another rank "
            f"skipped some (its own error names them)") in told, told


@pytest.mark.parametrize("buff", [4194304, 50], ids=["big-buffer", "buffer-fills-during-backward"])
@pytest.mark.parametrize("skip_rank", [0, 1])
def test_inline_buckets_let_every_rank_name_the_skipped_parameters(skip_rank, buff):
    # The same steps with each bucket all-reduced inline (exchange="inline"): the first difference is met by both
    # ranks at the same collective and nothing is left in flight, so the ranks still pair up and exchange what
    # they lack: every rank names the parameters and the rank that skipped them.
    threshold = 100 if buff > 100 else 40
    out, _, seconds = run_ranks(train_skipping, 2, args=(skip_rank, 2, True, "distopt", threshold, buff, "inline"),
                                timeout=120, comm_timeout=30)
    assert seconds < 25, seconds
    for r in (0, 1):
        message, line = out[r][1]
        assert message.startswith(f"ValueError: DistOpt: the ranks' gradients differ at step 2 (called from "
                                  f"{CASES}:{line}): fc3.W, fc3.b skipped on rank {skip_rank}. {HINT}"), message


def test_matching_steps_still_train():
    # no rank skips (skip_rank 2 does not exist): the names cost nothing visible and the steps go through
    got = _shm(2, 2, True, "distopt", 100)
    assert got == {0: ("ok", None), 1: ("ok", None)}, got
