"""Fixtures shared by the GPU tests."""
import secrets

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A generator on a fresh seed each run (more inputs seen over time); a failure message can name the seed
    (rng.seed_for_message) so that the run can be repeated."""
    seed = secrets.randbits(32)
    rng = np.random.default_rng(seed)
    rng.seed_for_message = seed
    return rng
