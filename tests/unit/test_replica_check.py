"""The replica check's single-process parts (singa_lite.parallel.replica_check): argument checks with clear
errors, the digests (stable, sensitive to one ulp, to shapes and to the optimizer state; GPU-free dtypes and
views), the no-op between multiples of `every`, and a one-rank check. Several ranks:
tests/multiproc/test_replica_check_dist.py."""
import numpy as np
import pytest

from singa_lite import dist, opt, tensor
from singa_lite.parallel.replica_check import ReplicaCheck, check_replicas, replica_digests


@pytest.fixture(scope="module")
def comm():
    c = dist.init(backend="tcp", timeout=30)
    yield c
    c.close()


def model():
    rng = np.random.default_rng(0)
    return {"fc1.W": tensor.Tensor(data=rng.standard_normal((4, 3)).astype(np.float32), stores_grad=True),
            "fc1.b": tensor.Tensor(data=np.zeros(3, np.float32), stores_grad=True)}


@pytest.mark.parametrize("every", [0, -5, 1.5, True, "100", None])
def test_every_must_be_a_positive_int(comm, every):
    with pytest.raises(ValueError, match=r"every must be a positive int .* got " + repr(every).replace(".", r"\.")):
        ReplicaCheck(comm, every)


def test_bad_arguments_are_named(comm):
    with pytest.raises(TypeError, match="ReplicaCheck: expected a Communicator .* got str"):
        ReplicaCheck("comm", 10)
    check = ReplicaCheck(comm, 10)
    with pytest.raises(TypeError, match="step_number must be an int .* got 10.0"):
        check.after_step(10.0, model())
    with pytest.raises(TypeError, match="optimizer_states must be an Optimizer, .* got list"):
        check_replicas(comm, model(), [1, 2])
    with pytest.raises(TypeError, match="expected \\(name, tensor\\) pairs, got ndarray for 'w'"):
        check_replicas(comm, [("w", np.zeros(3))])


def test_after_step_is_a_no_op_between_multiples(comm):
    check = ReplicaCheck(comm, 4)
    m = model()
    assert [check.after_step(s, m) for s in range(1, 9)] == [False, False, False, True] * 2
    assert check.checks == 2 and check.last_step == 8
    assert check.after_step(0, m) is True  # 0 is a multiple: a check before training is allowed


def test_one_rank_always_agrees_with_itself(comm):
    m = model()
    sgd = opt.Adam(lr=0.1)
    for n, p in m.items():
        sgd.apply(n, p, tensor.from_numpy(np.ones(p.shape, np.float32)))
    sgd.step()
    check_replicas(comm, m, sgd)
    check_replicas(comm, list(m.items()), sgd.get_states())


def test_digests_see_one_ulp_shapes_and_state():
    m = model()
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    for n, p in m.items():
        sgd.apply(n, p, tensor.from_numpy(np.ones(p.shape, np.float32)))
    base = replica_digests(m, sgd)
    assert [(k, n) for k, n, *_ in base] == [
        ("parameter", "fc1.W"), ("parameter", "fc1.b"), ("optimizer state", "moments of fc1.W"),
        ("optimizer state", "moments of fc1.b"), ("optimizer state", "step_counter")]
    assert replica_digests(m, sgd) == base  # stable
    assert replica_digests(m, sgd.get_states())[:4] == base[:4]  # live state or get_states(): same digests
    a = tensor.to_numpy(m["fc1.W"])
    a[1, 2] = np.nextafter(a[1, 2], np.float32(1e9))
    m["fc1.W"].copy_from_numpy(a)
    changed = replica_digests(m, sgd)
    assert changed[0][4] != base[0][4] and changed[1:] == base[1:]
    sgd.step()
    assert replica_digests(m, sgd)[-1] != changed[-1]  # the step counter is part of the state


def test_digests_of_views_and_bfloat16():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tensor.from_numpy(a)
    view = t.T()  # not contiguous: hashed in its logical order
    (_, _, dtype, shape, d1), = replica_digests([("t", view)])
    (_, _, _, _, d2), = replica_digests([("t", tensor.from_numpy(np.ascontiguousarray(a.T)))])
    assert d1 == d2 and shape == [4, 3] and dtype == "float32"
    bf = tensor.from_numpy(a).as_type(tensor.bfloat16)
    (_, _, dtype, _, _), = replica_digests([("b", bf)])
    assert dtype == "bfloat16"
