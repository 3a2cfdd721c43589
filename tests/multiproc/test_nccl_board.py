"""The nccl backend's host board (singa_lite/comm/board.py): a timed-out collective names the ranks that never
entered it, and the user's line that entered it here. Run on CPU with a stand-in for _core.NcclComm
(helpers/nccl_board_cases.py) in separate processes, which share the board as real ranks of one host do."""
import os
import sys

import numpy as np
import pytest

from nccl_board_cases import Direct, hang_worker, install, unique_id
from shm_harness import run_ranks
from singa_lite import _core, tensor
from singa_lite.comm import board as host_board, nccl

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "nccl_board_cases.py")


def _board_files():
    d = host_board.default_dir()
    return {f for f in os.listdir(d) if f.startswith("singa_lite_board_")}


@pytest.mark.parametrize("mode", ["late", "closed", "dead", "other_kind", "inside"])
def test_a_timed_out_collective_names_the_rank_that_never_entered_it(mode, tmp_path):
    before = _board_files()
    results = run_ranks(hang_worker, 2, mode, str(tmp_path), timeout=90, silent=(1,) if mode == "dead" else ())
    kind, value = results[0]
    assert kind == "ok", value
    message, line = value
    assert message.startswith("nccl all_reduce (rank 0 of 2, cuda:0): not finished after"), message
    assert "host board of collectives entered per rank: " in message, message
    if mode == "inside":
        assert "every rank on this host entered all_reduce #3" in message, message
        assert "stuck inside it" in message, message
    elif mode == "other_kind":
        assert "rank 1's collective #3 is a broadcast, this rank's a all_reduce" in message, message
    else:
        assert ("rank 1 entered 2 collective(s), this rank 3: rank 1 never entered all_reduce #3 (this rank "
                f"entered it at {CASES}:{line})") in message, message
    if mode == "closed":
        assert "rank 1 closed its communicator normally" in message, message
    if mode == "dead":
        assert "rank 1 is no longer running" in message, message
    else:
        assert "no longer running" not in message, message
    assert _board_files() <= before  # unlinked once both ranks had it mapped


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(nccl._core, "NcclComm", None, raising=False)
    monkeypatch.setattr(nccl, "_require_ready", None)
    monkeypatch.setattr(nccl, "choose_device", None)
    return install


def test_an_earlier_collective_the_wait_queued_behind_is_the_one_named(stand_in, tmp_path):
    # GPU work queues: a blocking call (a barrier, DistOpt's CPU-staged vote after its buckets) times out
    # behind a bucket the other rank never entered; the board names the bucket, not the blocking call.
    stand_in(stuck_at=3)
    c = Direct(unique_id(str(tmp_path)), 0, 2, timeout=30)
    peer, why = host_board.HostBoard.open(unique_id(str(tmp_path)), 1, 2, 2)  # rank 1 entered two collectives
    assert peer is not None, why
    peer.enter("all_reduce")
    peer.enter("all_reduce")
    t = tensor.from_numpy(np.ones(4, np.float32))
    c.all_reduce(t)
    c.all_reduce(t)
    c.broadcast(t, 0); line = sys._getframe().f_lineno  # noqa: E702 -- only queued: no host wait
    with pytest.raises(_core.CommError) as e:
        c.barrier()  # the host waits
    assert str(e.value).startswith("nccl broadcast (rank 0 of 2, cuda:0): not finished after"), str(e.value)
    assert ("rank 1 entered 2 collective(s), this rank 4: rank 1 never entered broadcast #3 (this rank entered "
            f"it at {__file__}:{line})") in str(e.value), str(e.value)
    with pytest.raises(_core.CommError) as again:  # later calls raise the same, explained error
        c.all_reduce(t)
    assert str(again.value) == str(e.value)
    c.close()


def test_ranks_on_other_hosts_are_said_to_be_out_of_sight(stand_in, tmp_path):
    stand_in(stuck_at=1)
    c = Direct(unique_id(str(tmp_path)), 0, 3, local_rank=0, local_size=2, timeout=30)  # rank 2: another host
    peer, _ = host_board.HostBoard.open(unique_id(str(tmp_path)), 1, 3, 2)
    peer.enter("all_reduce")
    work = c.all_reduce(tensor.from_numpy(np.ones(4, np.float32)), async_op=True)
    with pytest.raises(_core.CommError) as e:
        work.wait(timeout=5)
    message = str(e.value)
    assert "every rank on this host entered all_reduce #1" in message, message
    assert "rank 2 run(s) on other hosts, where this host's board cannot see: look at their output" in message
    c.close()


def test_without_a_board_the_message_says_it_cannot_tell_and_why(stand_in, tmp_path, monkeypatch):
    stand_in(stuck_at=1)
    monkeypatch.setattr(host_board, "default_dir", lambda: str(tmp_path / "missing"))
    c = Direct(unique_id(str(tmp_path)), 0, 2, timeout=30)
    work = c.all_reduce(tensor.from_numpy(np.ones(4, np.float32)), async_op=True)
    with pytest.raises(_core.CommError) as e:
        work.wait(timeout=5)
    assert "cannot name the missing ranks: this rank has no host board of collectives entered (its file " \
           in str(e.value) and "could not be created (No such file or directory))" in str(e.value), str(e.value)
    c.close()


def test_the_board_file_is_private_and_refused_when_someone_else_made_it(tmp_path):
    board, why = host_board.HostBoard.open(b"k" * 128, 0, 2, 2, directory=str(tmp_path))
    assert board is not None, why
    (path,) = tmp_path.iterdir()
    assert (path.stat().st_mode & 0o777) == 0o600
    board.unlink()
    # a file of the same name that does not fit (planted, or stale from another size) is not used
    path.write_bytes(b"x" * 7)
    other, why = host_board.HostBoard.open(b"k" * 128, 0, 2, 2, directory=str(tmp_path))
    assert other is None and "has 7 bytes, not 64" in why
    os.unlink(path)
    os.symlink(tmp_path / "elsewhere", path)
    other, why = host_board.HostBoard.open(b"k" * 128, 0, 2, 2, directory=str(tmp_path))
    assert other is None and "could not be created" in why and not (tmp_path / "elsewhere").exists()
