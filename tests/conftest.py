"""Test-wide setup: tests marked `gpu` run only where a CUDA build sees a GPU; the `training` fixture."""
import pytest

from singa_lite import autograd, device


@pytest.fixture
def training():
    """autograd.training on for the test (SINGA's switch for recording the graph), restored after it. A module
    whose every test trains says `pytestmark = pytest.mark.usefixtures("training")`."""
    saved = autograd.training
    autograd.training = True
    yield
    autograd.training = saved


def pytest_collection_modifyitems(config, items):
    if device.cuda_is_available():
        return
    from singa_lite import _core

    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {_core.cuda_unavailable_reason()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
