"""Hypothesis profiles for the fuzz tests: `ci` (the default: a sample that runs in seconds) and `fuzz`, the
dedicated run (`SINGA_LITE_FUZZ=1 python -m pytest tests/fuzz`, or `--hypothesis-profile fuzz`), which runs
enough examples per test for well over 10,000 cases in all."""
import os
import resource

import pytest

from hypothesis import HealthCheck, settings

# Fuzzed sizes reach 2**31 and beyond. Whether the system grants a 17 GB request depends on its overcommit
# policy and free memory, and a granted one is then written and takes the machine down with it. Capping
# the address space while the fuzz tests run makes every huge request fail the same way everywhere:
# MemoryError, which is what the tests expect of them. The cap is 8 GiB above what the process already
# maps (a CUDA context maps a lot), and the previous limit is restored afterwards.
# Under AddressSanitizer the cap is left off: the sanitizer's own mappings (shadow memory, allocator regions)
# would hit it, and a failed internal mapping ends the process. There the sanitizer bounds each request
# instead (ASAN_OPTIONS max_allocation_size_mb + allocator_may_return_null, set by tools/sanitize.sh).
def _under_asan() -> bool:
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


@pytest.fixture(autouse=True, scope="module")
def _bounded_address_space():
    if _under_asan():
        options = os.environ.get("ASAN_OPTIONS", "")
        if "max_allocation_size_mb" not in options or "allocator_may_return_null=1" not in options:
            pytest.fail("under AddressSanitizer the fuzz tests need ASAN_OPTIONS with max_allocation_size_mb=8192 "
                        "and allocator_may_return_null=1 (huge requests must fail, not be granted): run "
                        "tools/sanitize.sh", pytrace=False)
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    limit = mapped + (8 << 30)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=2500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile("fuzz" if os.environ.get("SINGA_LITE_FUZZ") else "ci")
