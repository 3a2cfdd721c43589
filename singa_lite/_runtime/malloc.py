"""glibc malloc's thresholds: a training loop reuses freed memory instead of faulting it in again every step.

Every step of a training loop allocates and frees the same arrays: numpy's augmented batch, its padded copy,
the logits, the small tensors below the size that singa_lite's own block cache keeps (csrc/core/storage.cpp).
glibc decides per free whether that memory goes back to the kernel:

- an array above the *mmap threshold* is its own mapping, unmapped when freed, and the next one like it is
  faulted in page by page (4 KiB each, zeroed by the kernel);
- free space above the *trim threshold* at the top of the heap is given back (``sbrk``), and the next step
  grows the heap and faults it in again.

glibc starts both low (128 KiB) and raises them as the process frees large mappings (up to 32 MiB / 64 MiB),
so the cost of a loop depends on what the process freed before: the same numpy work, or the same training
step, runs at two speeds and pays page faults or none depending on the thresholds (measured in
docs/benchmarks/training.md, "The loop, again"). So at import,
singa_lite sets the thresholds where glibc's own heuristic ends up: mmap threshold 32 MiB, trim threshold
64 MiB (``mallopt``; docs/benchmarks/training.md, "The loop, again", its malloc paragraph). The cost is memory: up to
64 MiB of free heap per malloc arena stays with the process instead of going back to the system.

Left alone: ``SINGA_LITE_MALLOC=keep``; a user who tuned malloc (any ``MALLOC_*_`` threshold variable, or
``glibc.malloc`` in ``GLIBC_TUNABLES``); C libraries other than glibc (musl), and allocators preloaded in
glibc's place (jemalloc, tcmalloc), whose own settings glibc's ``mallopt`` does not reach.
"""
from __future__ import annotations

import ctypes
import os

SWITCH_VAR = "SINGA_LITE_MALLOC"  # "keep": leave malloc as it is
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the highest its heuristic goes
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what the heuristic pairs with it
# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_")


def why_left_alone() -> str | None:
    """Why the thresholds are not to be changed in this process, or None if they are."""
    if os.environ.get(SWITCH_VAR) == "keep":
        return f"{SWITCH_VAR}=keep"
    for var in USER_SETTINGS:
        if var in os.environ:
            return f"{var} is set"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets glibc.malloc"
    return None


def settle_malloc() -> dict:
    """Sets glibc malloc's mmap and trim thresholds as the module docstring says. Returns what was done:
    ``{"mmap_threshold": n, "trim_threshold": n}``, or ``{"left_alone": reason}``."""
    reason = why_left_alone()
    if reason is not None:
        return {"left_alone": reason}
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return {"left_alone": "not glibc"}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting either one ends glibc's own adjustment of both.
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return {"left_alone": "mallopt refused the thresholds"}
    return {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}


def trim() -> bool:
    """Gives the free memory of glibc's heaps back to the system (``malloc_trim(0)``, which also releases whole
    free pages inside a heap), after a one-off peak that later steps will not reach again (ZeRO stage 2's first
    step, parallel/zero.py). Returns whether memory was released; False on C libraries other than glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only)
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(malloc_trim(0))
