"""DistOpt's public two-phase step (backward -> PendingStep.synchronize -> finish), its get_states /
set_states, and sparse averages that overflow the sum (or the average itself), on 2 and 3 shm ranks started
by multiprocessing. Scenarios live in distopt_public_cases.py."""
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import distopt_public_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


@pytest.mark.parametrize("name,world_size", [
    ("two_phases_equal_backward_and_update", 2),
    ("averaged_gradients_between_the_phases", 3),
    ("misuse_is_refused", 2),
    ("nonfinite_between_the_phases", 2),
    ("states_round_trip", 2),
    ("states_round_trip", 1),
    ("ddp_optimizer_between_the_phases", 2),
    ("sparse_average_does_not_overflow", 2),
    ("sparse_average_does_not_overflow", 3),
    ("sparse_nonfinite_average_is_skipped", 2),
])
def test_scenario(name, world_size):
    out, _, _ = run_ranks(distopt_public_cases.run, world_size, timeout=180, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out


# ---------------------------------------------------------------- the Fuser's pass, in one process
@pytest.fixture
def comm():
    from singa_lite import dist

    c = dist.init(backend="shm")
    yield c
    c.close()


def test_a_fuser_pass_sends_its_first_bucket_early_then_at_the_threshold(comm):
    import numpy as np

    from singa_lite import tensor
    from singa_lite.parallel.fusion import Fuser

    sent, real = [], comm.all_reduce

    def all_reduce(t, op="sum", async_op=False):
        sent.append(t.numel)
        return real(t, op, async_op)

    comm.all_reduce = all_reduce
    fuser = Fuser(comm, 100, op="avg")
    grads = [tensor.Tensor(data=np.full(n, float(i), np.float32)).data for i, n in enumerate((6, 6, 30, 30, 70))]
    with pytest.raises(RuntimeError, match="outside a pass"):
        fuser.push(grads[0])
    fuser.begin(50, first_bucket=10)
    with pytest.raises(RuntimeError, match="already under way"):
        fuser.begin(50)
    for g, after in zip(grads, ([], [12], [12], [12, 30], [12, 30, 70])):
        fuser.push(g)
        assert sent == after, (g.numel, sent)
    assert fuser.in_pass
    fuser.finish()
    assert sent == [12, 30, 70, 30] and not fuser.in_pass
    for i, g in enumerate(grads):  # one rank: the average is the value itself, written back
        np.testing.assert_array_equal(np.asarray(g), np.full(g.numel, float(i), np.float32))

    # first_bucket=0: the first bucket waits for the threshold too; cancel() drops the open bucket unsent
    sent.clear()
    fuser.begin(50)
    fuser.push(grads[0])
    fuser.push(grads[1])
    assert sent == []
    fuser.cancel()
    assert not fuser.in_pass and sent == []
    fuser.begin(50, first_bucket=0)
    fuser.finish()
    assert sent == []
    with pytest.raises(ValueError, match="first_bucket must be a number of elements >= 0"):
        fuser.begin(50, first_bucket=-1)
    with pytest.raises(ValueError, match="exceeds the fusion buffer"):
        fuser.begin(101)
    assert not fuser.in_pass
