"""parallel.ddp (Needle's ddp API) and parallel.DataParallel (the DDP exercises' MyDP) on the shm backend: 2 and
3 ranks started by multiprocessing train the DDP exercises' tanh MLP with batch n/k each and must end where one process
with batch n ends (rtol 1e-5); the replicas must agree after training, and disagree (with a warning) once one
is perturbed. Scenarios live in ddp_cases.py (spawned children import them); the data partition and the
one-process API are checked here in-process."""
import numpy as np
import pytest

from singa_lite import _core, dist, layer, parallel, tensor
from singa_lite.parallel import ddp

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import ddp_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402
from shm_harness import run_ranks as run_raw_ranks  # noqa: E402


# ---------------------------------------------------------------- many processes
@pytest.mark.parametrize("world_size,kind", [(2, "sgd"), (3, "adam")])
def test_ddp_trains_like_one_process(world_size, kind):
    holder = dist.NcclIdHolder()  # the ranks call ddp.init(holder, rank, world_size), as a SINGA script does
    out = run_raw_ranks(ddp_cases.scenario_ddp, world_size, holder, kind, timeout=180)
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out


@pytest.mark.parametrize("world_size", [2, 3])
def test_hook_data_parallel_trains_like_one_process(world_size):
    out, _, _ = run_ranks(ddp_cases.scenario_wrapper, world_size, timeout=240)
    for r in range(world_size):
        assert out[r][0] == "ok", out
        dp_sgd, dp_adam, sizes, errors = out[r][1]
        assert (dp_sgd, dp_adam, errors) == ("ok", "ok", "ok"), out[r]
        assert len(sizes) > 1, sizes  # several buckets of different sizes, not one exchange per step


# ---------------------------------------------------------------- one process
@pytest.fixture
def one_rank():
    ddp.shutdown()
    rank, device = ddp.init(backend="shm")
    yield rank, device
    ddp.shutdown()


def test_calls_before_init_say_what_to_do():
    ddp.shutdown()
    for call in (lambda: ddp.partition_dataset(np.zeros((4, 2)), 2), lambda: ddp.broadcast_parameters([]),
                 lambda: ddp.check_parameter_closeness([]), lambda: ddp.DistributedOptimizer(None), ddp.rank):
        with pytest.raises(RuntimeError, match=r"call ddp.init\(\) first"):
            call()


def test_init_once_and_its_errors(one_rank):
    assert one_rank[0] == 0 and one_rank[1].is_cpu()
    assert ddp.init() == one_rank  # again, with no arguments: the same group
    with pytest.raises(RuntimeError, match="already initialized"):
        ddp.init(backend="shm")
    assert ddp.world_size() == 1 and ddp.communicator().backend == "shm"
    ddp.shutdown()
    with pytest.raises(ValueError, match="nccl"):
        ddp.init(device="cpu", backend="nccl")
    with pytest.raises(TypeError, match="Communicator"):
        ddp.init(communicator="not one")


def shards(dataset, batch, world, **kw):
    """Every rank's loader (one process plays them all) and the one-process loader with the whole batch."""
    loaders = [ddp.ShardLoader(dataset, batch // world, r, world, **kw) for r in range(world)]
    return loaders, ddp.ShardLoader(dataset, batch, 0, 1, **kw)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_together_see_exactly_the_one_process_batches(world, shuffle):
    x = np.arange(50 * 3, dtype=np.float64).reshape(50, 3)
    y = np.arange(50, dtype=np.int64)
    loaders, whole = shards((x, y), 12, world, shuffle=shuffle, seed=3)
    assert all(len(ld) == len(whole) == 50 // 12 for ld in loaders)  # the incomplete global batch is dropped
    for _epoch in range(2):  # a new order each epoch, the same on every rank
        per_rank = [list(ld) for ld in loaders]
        for step, (wx, wy) in enumerate(whole):
            xs = [tensor.to_numpy(per_rank[r][step][0]) for r in range(world)]
            ys = [tensor.to_numpy(per_rank[r][step][1]) for r in range(world)]
            np.testing.assert_array_equal(np.concatenate(ys), tensor.to_numpy(wy))
            np.testing.assert_array_equal(np.concatenate(xs), tensor.to_numpy(wx))
            assert xs[0].dtype == np.float32 and ys[0].dtype == np.int64  # features cast, labels kept
    if shuffle:
        assert not np.array_equal(whole.indices(0), whole.indices(1))


def test_partition_dataset_accepts_what_the_seeds_pass(one_rank):
    x = np.random.default_rng(0).standard_normal((10, 2, 2)).astype(np.float64)
    y = np.arange(10, dtype=np.int32)
    loader, bsz = ddp.partition_dataset((x, y), 4, device=one_rank[1], dtype="float32", shuffle=False)
    assert bsz == 4 and len(loader) == 2
    bx, by = next(iter(loader))
    assert bx.shape == (4, 2, 2) and bx.dtype == tensor.float32 and by.dtype == tensor.int32

    class NeedleStyle:  # len() and dataset[i] -> (image, label), as Needle's CIFAR10Dataset
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return x[i], y[i]
    loader, _ = ddp.partition_dataset(NeedleStyle(), 4, dtype=None, shuffle=False)
    nx, ny = next(iter(loader))
    np.testing.assert_array_equal(tensor.to_numpy(nx), x[:4])
    np.testing.assert_array_equal(tensor.to_numpy(ny), y[:4])
    loader, _ = ddp.partition_dataset(x, 4, shuffle=False)  # one array: tensors, not tuples
    assert isinstance(next(iter(loader)), tensor.Tensor)

    with pytest.raises(ValueError, match="share their first axis"):
        ddp.partition_dataset((x, y[:5]), 4)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ddp.partition_dataset((x, y), 0)
    with pytest.raises(TypeError, match="dataset must be"):
        ddp.partition_dataset(42, 4)


def test_batch_smaller_than_the_world_is_refused():
    ddp.shutdown()

    class Four:  # partition_dataset only asks the communicator for rank and world size
        rank, world_size = 0, 4
    ddp._state.update(comm=Four(), device=None, owned=False)
    try:
        with pytest.raises(ValueError, match="smaller than the 4 ranks"):
            ddp.partition_dataset(np.zeros((8, 1)), 3)
    finally:
        ddp._state.update(comm=None)


def test_one_rank_api_and_parameter_forms(one_rank):
    m = ddp_cases.make_model(0)
    before = ddp_cases.values(m)
    ddp.broadcast_parameters(m)
    ddp.broadcast_parameters(list(m.get_params().values()))
    ddp.broadcast_parameters(m.get_params())

    class Plain:  # SINGA's distributed-training CNN: a plain class whose attributes are layers
        def __init__(self):
            self.fc = layer.Linear(3, 2)
    ddp.broadcast_parameters(Plain())
    assert ddp.check_parameter_closeness(m)
    for k, v in ddp_cases.values(m).items():
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(ValueError, match="found no parameters"):
        ddp.broadcast_parameters(object())
    with pytest.raises(ValueError, match="root must be a rank"):
        ddp.broadcast_parameters(m, root=1)
    dopt = ddp.DistributedOptimizer(ddp_cases.make_opt("sgd"))
    with pytest.raises(TypeError, match="already distributed"):
        ddp.DistributedOptimizer(dopt)


def test_data_parallel_refuses_a_model_without_its_parameters(one_rank):
    lazy = ddp_cases.MLP()
    lazy.fc0 = layer.Linear(4)  # infers its input size on the first call
    with pytest.raises(ValueError, match="fc0.*first call"):
        parallel.DataParallel(lazy)
    dp = parallel.DataParallel(ddp_cases.make_model(0), threshold=10)
    assert dp.module is dp.model and "fc0.W" in dp.get_params()  # the model's attributes pass through
    with pytest.raises(ValueError, match="threshold"):
        parallel.DataParallel(ddp_cases.make_model(0), buffSize=10, threshold=20)
