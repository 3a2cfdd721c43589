"""singa_lite and numpy's OpenBLAS (singa_lite/_runtime/threads.py): our OpenBLAS loads single-threaded without making
numpy's single-threaded too, whichever is imported first, and numpy's idle BLAS threads are told to stop
spinning (unless SINGA_LITE_NUMPY_BLAS=keep); oneDNN's OpenMP workers spin briefly (GOMP_SPINCOUNT). Each case
runs in a fresh interpreter: OpenBLAS and libgomp read their environment when they load."""
import json
import os
import subprocess
import sys

import pytest

from singa_lite._runtime.threads import OMP_SPIN_DEFAULT

PROBE = """
import ctypes, json, os, sys
first = sys.argv[1]
if first == "singa":
    import singa_lite
import numpy
if first != "singa":
    import singa_lite
from singa_lite._runtime import threads as _threads
theirs = _threads.loaded_openblas(singa_lite._OPENBLAS)
def threads(path, names):
    lib = ctypes.CDLL(path)
    for name in names:
        if hasattr(lib, name):
            return getattr(lib, name)()
    return None
print(json.dumps({
    "ours": threads(singa_lite._OPENBLAS, ["scipy_openblas_get_num_threads", "openblas_get_num_threads"]),
    "numpy": [threads(p, ["scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                          "openblas_get_num_threads"]) for p in theirs],
    "numpy_libs": theirs,
    "env_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    "env_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
}))
"""


def probe(first, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT",
                                                             "SINGA_LITE_NUMPY_BLAS", "OMP_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", PROBE, first], capture_output=True, text=True, timeout=120,
                       env={**base, **env})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def numpy_has_openblas():
    got = probe("numpy")
    if not got["numpy_libs"] or None in got["numpy"]:
        pytest.skip(f"numpy here does not use a pthreads OpenBLAS we can query: {got['numpy_libs']}")
    return got


@pytest.mark.parametrize("first", ["numpy", "singa"])
def test_our_openblas_is_single_threaded_and_numpys_is_not(first):
    numpy_has_openblas()
    got = probe(first)
    assert got["ours"] == 1, got
    assert got["env_threads"] is None, got  # not left in the environment for numpy or child processes
    if (os.cpu_count() or 1) > 1:
        assert all(n > 1 for n in got["numpy"]), got  # importing singa_lite first used to make it 1


def test_a_users_thread_count_is_kept_for_numpy():
    numpy_has_openblas()
    got = probe("singa", OPENBLAS_NUM_THREADS="1")
    assert got["env_threads"] == "1" and got["numpy"] == [1] * len(got["numpy"]) and got["ours"] == 1, got


def numpy_blas_calmable(got) -> bool:
    """Whether numpy's OpenBLAS can re-read its environment once loaded (numpy 2.5's OpenBLAS 0.3.34 cannot)."""
    import ctypes

    return all(hasattr(ctypes.CDLL(p), "openblas_read_env") and hasattr(ctypes.CDLL(p), "blas_thread_shutdown_")
               for p in got["numpy_libs"])


@pytest.mark.parametrize("first", ["numpy", "singa"])
def test_numpys_idle_blas_threads_stop_spinning_unless_kept(first):
    got = numpy_has_openblas()
    if first == "numpy" and not numpy_blas_calmable(got):
        pytest.skip(f"numpy's OpenBLAS ({got['numpy_libs']}) exports no openblas_read_env / blas_thread_shutdown_: "
                    f"once loaded it keeps its timeout (singa_lite/_runtime/threads.py)")
    assert probe(first)["env_timeout"] == "4"
    assert probe(first, OPENBLAS_THREAD_TIMEOUT="10")["env_timeout"] == "10"  # the user's choice stands
    kept = probe(first, SINGA_LITE_NUMPY_BLAS="keep")
    assert kept["env_timeout"] is None, kept


def test_calm_numpy_blas_again_in_this_process(monkeypatch):
    if not numpy_blas_calmable(numpy_has_openblas()):
        pytest.skip("numpy's OpenBLAS cannot re-read its environment once loaded (numpy 2.5)")
    import numpy as np

    import singa_lite
    from singa_lite._runtime import threads as _threads

    monkeypatch.setenv("SINGA_LITE_NUMPY_BLAS", "keep")
    assert _threads.calm_numpy_blas(singa_lite._OPENBLAS) == []
    monkeypatch.delenv("SINGA_LITE_NUMPY_BLAS")
    changed = _threads.calm_numpy_blas(singa_lite._OPENBLAS)
    assert changed and singa_lite._OPENBLAS not in changed, changed
    a = np.arange(300 * 300, dtype=np.float64).reshape(300, 300) / 1e4
    np.testing.assert_allclose(a @ a, np.einsum("ij,jk->ik", a, a), rtol=1e-10)  # its threads come back


SPIN_PROBE = """
import ctypes, os, sys
if sys.argv[1] == "gomp-first":
    ctypes.CDLL("libgomp.so.1")
import singa_lite
print(os.environ.get("GOMP_SPINCOUNT", "unset"))
"""


def spin_probe(first="singa_lite", **env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "SINGA_LITE_OPENMP_SPIN")}
    r = subprocess.run([sys.executable, "-c", SPIN_PROBE, first], capture_output=True, text=True, timeout=120,
                       env={**clean, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_onednns_openmp_workers_spin_briefly_unless_the_user_says_otherwise():
    assert spin_probe() == OMP_SPIN_DEFAULT
    assert spin_probe(GOMP_SPINCOUNT="50000") == "50000"
    assert spin_probe(OMP_WAIT_POLICY="ACTIVE") == "unset"
    assert spin_probe(SINGA_LITE_OPENMP_SPIN="keep") == "unset"


def test_a_libgomp_loaded_before_singa_lite_is_left_as_it_is():
    # It read its variables when it loaded: setting one now would claim a setting that is not in force.
    assert spin_probe("gomp-first") == "unset"
