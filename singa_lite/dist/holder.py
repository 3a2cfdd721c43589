"""NcclIdHolder: what processes started by ``multiprocessing`` (or singa-run) need to find each other.

Created once in the parent and passed to every rank (as SINGA's scripts do); unlike SINGA's it is picklable,
so it works with both the ``fork`` and the ``spawn`` start methods and with ``Pool``. It carries the name of
the shared-memory segment the ``shm`` backend rendezvouses in (every build) and, when this build has NCCL,
a NCCL unique id (the ``nccl`` backend, with the CUDA issue).
"""
from __future__ import annotations

import atexit
import os
import secrets

from .. import _core


class NcclIdHolder:
    def __init__(self):
        # Owner-only segment with an unguessable name: another user cannot pre-create or join it.
        self.shm_name = f"/singa_lite_{os.getpid()}_{secrets.token_hex(8)}"
        make_id = getattr(_core, "nccl_get_unique_id", None)
        self.nccl_id = make_id() if make_id is not None else None
        self._owner_pid = os.getpid()
        # The ranks unlink the segment once all have joined; if a rank died before that, the parent removes
        # the name when it exits.
        atexit.register(self._cleanup)

    def _cleanup(self):
        unlink = getattr(_core, "shm_unlink", None)
        if os.getpid() == self._owner_pid and unlink is not None:
            unlink(self.shm_name)

    def __getstate__(self):
        return {"shm_name": self.shm_name, "nccl_id": self.nccl_id}

    def __setstate__(self, state):
        self.shm_name, self.nccl_id = state["shm_name"], state["nccl_id"]
        self._owner_pid = None  # a copy in a child never removes the parent's segment name

    def __repr__(self):
        return f"NcclIdHolder(shm_name={self.shm_name!r}, nccl_id={'set' if self.nccl_id else 'none'})"
