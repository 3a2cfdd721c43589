"""NcclIdHolder: what processes started by ``multiprocessing`` (or singa-run) need to find each other.

Created once in the parent and passed to every rank (as SINGA's scripts do); unlike SINGA's it is picklable,
so it works with both the ``fork`` and the ``spawn`` start methods and with ``Pool``. It carries the name of
the shared-memory segment the ``shm`` backend rendezvouses in (every build) and, when NCCL and a GPU are
available, a NCCL unique id for the ``nccl`` backend (``nccl_id``; otherwise None, and ``nccl_error`` says
why, so the holder still serves the ``shm`` backend). Creating the id does not initialise CUDA: the parent
can still fork workers that use the GPU. ``to_string()`` / ``from_string()`` carry it through an environment
variable (how singa-run hands it to the ranks it starts). Everything stays on this host: the segment is
owner-only (mode 0600) and unlinked once every rank joined, and NCCL's bootstrap listens on loopback only
(``NCCL_SOCKET_IFNAME=lo`` unless set).
"""
from __future__ import annotations

import atexit
import json
import os
import secrets

from .. import _core
from . import nccl


NCCL_IFNAME_VAR = "NCCL_SOCKET_IFNAME"


class NcclIdHolder:
    def __init__(self):
        # Owner-only segment with an unguessable name: another user cannot pre-create or join it.
        self.shm_name = f"/singa_lite_{os.getpid()}_{secrets.token_hex(8)}"
        self.nccl_id, self.nccl_error = None, None
        # The ranks of a holder share this host (it travels by multiprocessing or singa-run), so NCCL's
        # bootstrap listener, opened by unique_id(), needs no interface but loopback: it stays off the network
        # unless the user chose an interface (NCCL_SOCKET_IFNAME). Set here, so the ranks inherit it too.
        os.environ.setdefault(NCCL_IFNAME_VAR, "lo")
        try:
            self.nccl_id = nccl.unique_id()
        except (_core.CommError, _core.CudaError) as e:  # no NCCL or no GPU here: fine for the shm backend
            self.nccl_error = str(e)
        self._owner_pid = os.getpid()
        # The ranks unlink the segment once all have joined; if a rank died before that, the parent removes
        # the name when it exits.
        atexit.register(self._cleanup)

    def _cleanup(self):
        unlink = getattr(_core, "shm_unlink", None)
        if os.getpid() == self._owner_pid and unlink is not None:
            unlink(self.shm_name)

    def __getstate__(self):
        return {"shm_name": self.shm_name, "nccl_id": self.nccl_id, "nccl_error": self.nccl_error}

    def __setstate__(self, state):
        self.shm_name, self.nccl_id = state["shm_name"], state["nccl_id"]
        self.nccl_error = state.get("nccl_error")
        self._owner_pid = None  # a copy in a child never removes the parent's segment name

    def to_string(self) -> str:
        """This holder as one line of text (JSON), for an environment variable; from_string() reads it."""
        return json.dumps({"shm_name": self.shm_name, "nccl_id": self.nccl_id.hex() if self.nccl_id else None,
                           "nccl_error": self.nccl_error}, separators=(",", ":"))

    @classmethod
    def from_string(cls, text: str) -> "NcclIdHolder":
        """The holder written by to_string() in the parent (a copy: it never removes the parent's segment)."""
        try:
            state = json.loads(text)
            shm_name, nccl_id = state["shm_name"], state["nccl_id"]
            if not isinstance(shm_name, str) or not shm_name.startswith("/"):
                raise ValueError("shm_name")
            nccl_id = None if nccl_id is None else bytes.fromhex(nccl_id)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"NcclIdHolder.from_string: expected the text of NcclIdHolder.to_string(), got "
                             f"{text[:80]!r} ({type(e).__name__}: {e})") from None
        holder = cls.__new__(cls)
        holder.__setstate__({"shm_name": shm_name, "nccl_id": nccl_id, "nccl_error": state.get("nccl_error")})
        return holder

    def __repr__(self):
        return f"NcclIdHolder(shm_name={self.shm_name!r}, nccl_id={'set' if self.nccl_id else 'none'})"
