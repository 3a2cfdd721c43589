"""Test-wide setup: tests marked `gpu` run only where a CUDA build sees a GPU."""
import pytest

from singa_lite import device


def pytest_collection_modifyitems(config, items):
    if device.cuda_is_available():
        return
    from singa_lite import _core

    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {_core.cuda_unavailable_reason()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
