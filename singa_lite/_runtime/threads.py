"""The thread pools singa_lite shares the cores with: its own OpenBLAS, numpy's, and oneDNN's OpenMP team.

singa_lite runs one pool: its OpenMP threads, each calling its own OpenBLAS (the scipy-openblas32 wheel) on
a single thread (csrc/cpu/matmul.cpp). Two things follow.

1. **Our OpenBLAS starts single-threaded, and only ours.** OpenBLAS reads ``OPENBLAS_NUM_THREADS`` once, when
   it is loaded. The variable is set to 1 just while our library loads and restored right after: set for the
   whole process, it would make numpy's OpenBLAS single-threaded too whenever singa_lite is imported before
   numpy, and numpy's large matmuls about twice as slow (docs/benchmarks/training.md).

2. **numpy's OpenBLAS stops spinning when its work is done.** After each call, numpy's BLAS worker threads
   keep spinning, 2^28 CPU cycles by default (``OPENBLAS_THREAD_TIMEOUT=28``, about 0.1 s), before they sleep.
   A training loop that does any numpy BLAS between steps (an accuracy matmul, augmentation) then runs every
   step against those spinning threads, several times slower than the two alone; with numpy's timeout at 2^4
   cycles the loop costs about the sum, and numpy's own large matmuls keep their speed (measured in
   docs/benchmarks/training.md, "A training loop with numpy work").
   So at import, singa_lite sets numpy's OpenBLAS thread timeout to ``OPENBLAS_THREAD_TIMEOUT`` (default
   4, kept if the user set it). The timeout is only read when the threads start, so the library re-reads
   its environment (``openblas_read_env``) and stops its idle threads (``blas_thread_shutdown_``). They
   start again on the next threaded call, with the new timeout. Thread counts are not changed.
   ``SINGA_LITE_NUMPY_BLAS=keep`` leaves numpy's OpenBLAS as it is. Other BLAS libraries (MKL, an OpenMP
   build of OpenBLAS) are left alone.
   When singa_lite is imported before numpy, the variable is simply set before numpy's OpenBLAS loads
   (``preset_numpy_blas``), which works with every OpenBLAS: numpy 2.5's (OpenBLAS 0.3.34 of scipy-openblas64)
   no longer exports ``openblas_read_env`` / ``blas_thread_shutdown_``, so with numpy 2.5 imported first
   its threads keep their default timeout (import singa_lite first, or set ``OPENBLAS_THREAD_TIMEOUT=4``).

3. **oneDNN's OpenMP threads stop spinning soon after a convolution.** oneDNN (the float32 CPU convolutions) runs
   on GNU OpenMP's team, everything else on singa_lite's own pool. libgomp's idle workers spin for
   ``GOMP_SPINCOUNT`` pause instructions (300,000 by default: milliseconds) after each parallel region, so
   after every convolution they would hold a core while our pool runs the batch norm, ReLU and adds that follow.
   libgomp reads the variable once, when it loads, which is when our extension loads: so before that,
   singa_lite sets ``GOMP_SPINCOUNT`` to 1000 (enough to bridge the back-to-back regions inside one
   convolution: reorder, kernel, reorder) unless the user set it or ``OMP_WAIT_POLICY``;
   ``SINGA_LITE_OPENMP_SPIN=keep`` leaves libgomp as it is. When another library has loaded libgomp first
   (PyTorch imported before singa_lite), it is too late and nothing is changed. Like the OpenBLAS timeout, the
   variable is inherited by child processes and applies to every user of libgomp in this process.
   Measured in docs/benchmarks/training.md ("oneDNN's OpenMP team").
"""
from __future__ import annotations

import contextlib
import ctypes
import os

SPIN_VAR = "OPENBLAS_THREAD_TIMEOUT"
SPIN_DEFAULT = "4"  # 2^4 cycles: idle workers sleep at once
SWITCH_VAR = "SINGA_LITE_NUMPY_BLAS"  # "keep": leave numpy's OpenBLAS alone
OMP_SPIN_VAR = "GOMP_SPINCOUNT"
OMP_SPIN_DEFAULT = "1000"
OMP_SWITCH_VAR = "SINGA_LITE_OPENMP_SPIN"  # "keep": leave libgomp's spinning alone


@contextlib.contextmanager
def single_threaded_openblas_load():
    """OPENBLAS_NUM_THREADS=1 while the block runs (our OpenBLAS loads in it), restored afterwards."""
    saved = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = saved


def preset_numpy_blas() -> None:
    """Before numpy is imported: its OpenBLAS will read OPENBLAS_THREAD_TIMEOUT when it loads (the default 4
    unless the user set one; nothing with SINGA_LITE_NUMPY_BLAS=keep). Does nothing once numpy is loaded."""
    import sys

    if "numpy" not in sys.modules and os.environ.get(SWITCH_VAR) != "keep":
        os.environ.setdefault(SPIN_VAR, SPIN_DEFAULT)


def loaded_libgomp() -> bool:
    """Whether GNU OpenMP's runtime is already loaded in this process (it then read its variables)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line.rsplit("/", 1)[-1] for line in f)
    except OSError:  # not Linux
        return False


def preset_openmp_spin() -> str | None:
    """Before our extension (and with it libgomp) loads: a short spin for libgomp's idle workers, as the module
    docstring says. Returns the value set, or None when the user's settings or an earlier libgomp stand."""
    if os.environ.get(OMP_SWITCH_VAR) == "keep" or OMP_SPIN_VAR in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return None
    if loaded_libgomp():
        return None
    os.environ[OMP_SPIN_VAR] = OMP_SPIN_DEFAULT
    return OMP_SPIN_DEFAULT


def loaded_openblas(exclude: str) -> list:
    """Paths of the OpenBLAS libraries loaded in this process, other than `exclude` (ours)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1].lower()}
    except OSError:  # not Linux
        return []
    ours = os.path.realpath(exclude)
    return sorted(p for p in paths if p.startswith("/") and os.path.realpath(p) != ours and ".so" in p)


def calm_numpy_blas(ours: str) -> list:
    """Sets the spin timeout of every other OpenBLAS in the process (numpy's) as the module docstring says.
    Returns the libraries changed."""
    if os.environ.get(SWITCH_VAR) == "keep":
        return []
    changed = []
    for path in loaded_openblas(ours):
        try:
            lib = ctypes.CDLL(path)
            read_env, shutdown = lib.openblas_read_env, lib.blas_thread_shutdown_
        except (OSError, AttributeError):  # not a pthreads OpenBLAS that exposes them: leave it
            continue
        os.environ.setdefault(SPIN_VAR, SPIN_DEFAULT)
        read_env()
        shutdown()  # idle workers end; the next threaded call starts them with the new timeout
        changed.append(path)
    return changed
