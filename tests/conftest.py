"""Test-wide setup: tests marked `gpu` run only where a CUDA build sees a GPU; the `training` fixture; the opt-in
shuffled order (`--shuffle=SEED`, docs/testing.md)."""
import random

import pytest

from singa_lite import autograd, device


@pytest.fixture
def training():
    """autograd.training on for the test (SINGA's switch for recording the graph), restored after it; the default
    device's generator is seeded (0) so that random operators (dropout) draw the same values every run. A module
    whose every test trains says `pytestmark = pytest.mark.usefixtures("training")`."""
    device.get_default_device().SetRandSeed(0)
    saved = autograd.training
    autograd.training = True
    yield
    autograd.training = saved


@pytest.fixture(autouse=True)
def _training_flag_restored():
    """Model.train() and Model.eval() set autograd.training for the whole process, as SINGA's do; a test that calls
    them must not hand its mode on to whichever test runs next."""
    saved = autograd.training
    yield
    autograd.training = saved


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle", metavar="SEED", default=None,
        help="run the files in a shuffled order and the tests of each file in a shuffled order, from SEED (an "
             "integer, or 'random' for a fresh one); the seed is printed in the header so that the order can be "
             "repeated. Finds tests that pass only after (or before) another one.")


_SEED = pytest.StashKey[int]()


def _shuffle_seed(config):
    """The seed of --shuffle (one 'random' draw per session), or None without the option."""
    value = config.getoption("--shuffle")
    if value is None:
        return None
    if _SEED not in config.stash:
        if value == "random":
            config.stash[_SEED] = random.SystemRandom().randrange(1 << 32)
        else:
            try:
                config.stash[_SEED] = int(value)
            except ValueError:
                raise pytest.UsageError(f"--shuffle takes an integer seed or 'random', not {value!r}") from None
    return config.stash[_SEED]


def pytest_report_header(config):
    seed = _shuffle_seed(config)
    if seed is not None:
        return f"shuffled order: --shuffle={seed}"


def _shuffle(items, seed):
    """Files in a random order, each file's tests together and in a random order among themselves. Keeping a file's
    tests together keeps its module-scoped fixtures set up once; every pair of tests can still meet in either
    order, which is what a leak of state from one test into another needs to show."""
    rng = random.Random(seed)
    by_file = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    files = list(by_file.values())
    rng.shuffle(files)
    for tests in files:
        rng.shuffle(tests)
    items[:] = [item for tests in files for item in tests]


# trylast: the shuffle comes after pytest's own reordering of the items (by parametrized fixtures).
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    seed = _shuffle_seed(config)
    if seed is not None:
        _shuffle(items, seed)
    if device.cuda_is_available():
        return
    from singa_lite import _core

    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {_core.cuda_unavailable_reason()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
