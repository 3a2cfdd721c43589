"""Finds and opens oneDNN for the CPU convolutions (csrc/cpu/onednn.h), on first use.

The library comes from the ``onednn-cpu-gomp`` wheel (Apache-2.0, x86-64 Linux; a dependency of singa_lite
there): oneDNN 3.x built on GNU OpenMP, the runtime singa_lite's kernels link too, so the process keeps one
OpenMP pool. The wheel puts ``libdnnl.so.3`` in its install prefix's ``lib/`` (``sys.prefix/lib`` in a venv), which
is found through the wheel's file list. ``SINGA_LITE_ONEDNN_LIB=/path/libdnnl.so.3`` names another copy;
``SINGA_LITE_ONEDNN=0`` keeps convolutions on im2col + GEMM. Without the library (other platforms) they run
as im2col + GEMM, as before.
"""
from __future__ import annotations

import os

from .. import _core

LIB_VAR = "SINGA_LITE_ONEDNN_LIB"
SWITCH_VAR = "SINGA_LITE_ONEDNN"
DISTRIBUTIONS = ("onednn-cpu-gomp",)

_tried = False
_status = "not looked for yet"


def find_library() -> str | None:
    """The path of libdnnl.so.3: SINGA_LITE_ONEDNN_LIB, else the onednn-cpu-gomp wheel's copy; None if neither."""
    path = os.environ.get(LIB_VAR)
    if path:
        return path
    from importlib import metadata

    for dist in DISTRIBUTIONS:
        try:
            files = metadata.files(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name == "libdnnl.so.3":
                return str(f.locate().resolve())
    return None


def ready() -> bool:
    """True when CPU convolutions may run on oneDNN: loaded (on the first call), switched on, usable here."""
    global _tried, _status
    if not _tried:
        _tried = True
        if os.environ.get(SWITCH_VAR, "1") == "0":
            _core.set_onednn_enabled(False)
            _status = f"switched off ({SWITCH_VAR}=0)"
        else:
            path = find_library()
            if path is None:
                _status = "not installed (pip install onednn-cpu-gomp; x86-64 Linux only)"
            else:
                try:
                    _status = f"oneDNN {_core.onednn_load(path)} from {path}"
                except RuntimeError as e:  # a broken or foreign copy: im2col + GEMM, and the reason kept
                    _status = str(e)
    return _core.onednn_available()


def status() -> str:
    """Where oneDNN was loaded from, or why CPU convolutions do not use it."""
    ready()
    reason = _core.onednn_unavailable_reason()
    return _status if not reason or not _core.onednn_version() else f"{_status}; not used: {reason}"
