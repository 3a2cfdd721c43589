"""Hypothesis profiles for the fuzz tests: `ci` (the default: a sample that runs in seconds) and `fuzz`, the
dedicated run (`SINGA_LITE_FUZZ=1 python -m pytest tests/fuzz`, or `--hypothesis-profile fuzz`), which runs
enough examples per test for well over 10,000 cases in all."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=2500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile("fuzz" if os.environ.get("SINGA_LITE_FUZZ") else "ci")
