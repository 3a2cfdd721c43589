"""glibc malloc's thresholds (singa_lite/_runtime/malloc.py): after `import singa_lite`, arrays freed in a loop
are reused
without page faults; SINGA_LITE_MALLOC=keep, or a user's own malloc settings, leave glibc as it was. Each case
runs in a fresh interpreter: glibc's thresholds depend on what the process freed before."""
import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")

# Three 1 MiB arrays alive at once, then freed, twenty times. glibc's defaults give the 3 MiB at the top of the
# heap back to the kernel each time (its trim threshold has only risen to 2 MiB), so every round faults it in
# again; with singa_lite's thresholds it stays.
PROBE = """
import json, resource, sys
import numpy as np
import singa_lite
def round_():
    arrays = [np.ones(1 << 18, np.float32) for _ in range(3)]
    return sum(float(a[-1]) for a in arrays)
for _ in range(5):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    round_()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
print(json.dumps({"faults": faults, "malloc": singa_lite.build_info()["malloc"]}))
"""
PAGES_PER_ROUND = 3 * (1 << 20) // 4096


def probe(**env):
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "SINGA_LITE_MALLOC")}
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                       env={**base, **env})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_freed_arrays_are_reused_without_page_faults():
    got = probe()
    assert got["malloc"] == {"mmap_threshold": 32 << 20, "trim_threshold": 64 << 20}, got
    assert got["faults"] < PAGES_PER_ROUND / 20, got


def test_keep_leaves_glibc_alone_and_then_the_loop_faults():
    got = probe(SINGA_LITE_MALLOC="keep")
    assert got["malloc"] == {"left_alone": "SINGA_LITE_MALLOC=keep"}, got
    # What the module saves: glibc's own thresholds give the memory back and fault it in every round.
    assert got["faults"] >= PAGES_PER_ROUND / 2, got


@pytest.mark.parametrize("env, reason", [
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "MALLOC_TRIM_THRESHOLD_ is set"),
    ({"MALLOC_MMAP_THRESHOLD_": "1000000"}, "MALLOC_MMAP_THRESHOLD_ is set"),
    ({"GLIBC_TUNABLES": "glibc.malloc.top_pad=0"}, "GLIBC_TUNABLES sets glibc.malloc"),
])
def test_a_users_own_malloc_settings_are_kept(env, reason):
    assert probe(**env)["malloc"] == {"left_alone": reason}


def test_python_m_singa_lite_says_what_it_did():
    out = subprocess.run([sys.executable, "-m", "singa_lite"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SINGA_LITE_MALLOC": "keep"})
    assert out.returncode == 0, out.stderr
    assert "malloc: left alone (SINGA_LITE_MALLOC=keep)" in out.stdout
