"""Fixtures of tests/unit. The helper functions the tests share are plain imports from core_testutil.py."""
import pytest

from singa_lite import _core


@pytest.fixture
def restore_threads():
    """Restores _core's thread count after a test that changes it."""
    n = _core.get_num_threads()
    yield n
    _core.set_num_threads(n)
