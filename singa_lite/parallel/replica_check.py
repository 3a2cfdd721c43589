"""A replica check cheap enough to leave on: every N steps the ranks compare a hash of their parameters and
optimizer state, and on a mismatch every rank raises :class:`ReplicaMismatch` naming the ranks that differ
and the first parameter (or optimizer state) that does.

Data parallelism keeps the replicas bitwise identical (every rank applies the same averaged gradients, which
every backend delivers as the same bits on every rank), so the comparison is bitwise: any difference is a
bug worth stopping for (a rank-dependent seed, a rank that skipped an exchange, a non-deterministic kernel,
memory corruption). Modes whose replicas legitimately differ between synchronisations (DistOpt's partial
and sparse updates) must not be checked.

Cost: each rank hashes the host bytes of its tensors (no copy for contiguous CPU tensors, one
device-to-host copy for GPU ones) and all-gathers one 16-byte digest (blake2b of the per-tensor digests,
names, shapes and dtypes); the per-tensor digests travel only when those differ. The per-tensor hash is
SHA-256 (truncated to 16 bytes) rather than blake2b: CPUs with SHA extensions (x86 since Zen / Ice Lake,
ARMv8) run it in hardware, several times faster, and the hash is most of the check's cost
(docs/benchmarks/replica_check.md, measured with ``bench/bench_replica_check.py`` against a training step).

    check = ReplicaCheck(comm, every=100)
    for step in range(1, steps + 1):
        ...                                              # one training step
        check.after_step(step, model, optimizer)         # every rank, the same step numbers

Every rank must call with the same step numbers: the check is a collective, bounded by the communicator's
timeout like any other.
"""
from __future__ import annotations

import hashlib
import json
import numbers
import time

import numpy as np

from .. import _core, tensor
from ..tensor import Tensor
from ..optim.optimizer import Optimizer
from . import replicas

__all__ = ["ReplicaMismatch", "ReplicaCheck", "check_replicas", "replica_digests"]

DIGEST_BYTES = 16  # digests of 128 bits: collisions out of reach for a consistency check


class ReplicaMismatch(RuntimeError):
    """The ranks' replicas differ. Raised on every rank with the same message.

    step: the step checked (None for a direct check_replicas call). reference: the ranks taken as the reference
    (the largest group of identical replicas; rank 0's on a tie). differing: {rank: (kind, name)} for each rank
    outside it: kind "parameter" or "optimizer state", name the first tensor (in the given order) that differs
    from the reference, e.g. ("parameter", "fc1.W") or ("optimizer state", "moments of fc1.W"). first: the
    first differing rank's (kind, name)."""

    def __init__(self, message: str, step, reference: list, differing: dict):
        super().__init__(message)
        self.step, self.reference, self.differing = step, reference, differing
        self.first = differing[min(differing)] if differing else None


class ReplicaCheck:
    """Checks the replicas every `every` steps (see the module docstring); :meth:`after_step` is a modulo
    otherwise. Counters: ``checks`` (comparisons made), ``seconds`` (their total time on this rank)."""

    def __init__(self, communicator, every: int):
        _check_communicator(communicator, "ReplicaCheck")
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
            raise ValueError(f"ReplicaCheck: every must be a positive int (check the replicas every `every` "
                             f"steps, e.g. 100), got {every!r}")
        self.communicator, self.every = communicator, int(every)
        self.checks, self.seconds, self.last_step = 0, 0.0, None

    def after_step(self, step_number: int, named_params, optimizer_states=None) -> bool:
        """Call after every step (every rank, the same numbers); compares the replicas when step_number is a
        multiple of `every` and returns True then (False otherwise). named_params: [(name, tensor)], a dict,
        or a model (anything DistOpt accepts as one); optimizer_states: an Optimizer (or an object with one
        as ``.opt``, such as DistOpt), the dict its get_states() returns, or None. Raises ReplicaMismatch."""
        if isinstance(step_number, bool) or not isinstance(step_number, numbers.Integral):
            raise TypeError(f"ReplicaCheck.after_step: step_number must be an int (the steps taken so far), "
                            f"got {step_number!r}")
        if step_number % self.every:
            return False
        start = time.perf_counter()
        try:
            check_replicas(self.communicator, named_params, optimizer_states, step=int(step_number))
        finally:
            self.seconds += time.perf_counter() - start
            self.checks += 1
            self.last_step = int(step_number)
        return True

    def __repr__(self):
        return f"ReplicaCheck(every={self.every}, checks={self.checks}, seconds={self.seconds:.4f})"


def check_replicas(communicator, named_params, optimizer_states=None, step=None) -> None:
    """Compares every rank's parameters and optimizer state bitwise (a collective: every rank calls it);
    returns None when they agree, raises ReplicaMismatch on every rank otherwise. Arguments as
    ReplicaCheck.after_step; step: only for the message."""
    _check_communicator(communicator, "check_replicas")
    entries = replica_digests(named_params, optimizer_states)
    overall = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for kind, name, dtype, shape, digest in entries:
        overall.update(json.dumps([kind, name, dtype, shape]).encode())
        overall.update(digest)
    mine = np.frombuffer(overall.digest(), np.int32).copy()
    rows = tensor.to_numpy(communicator.all_gather(tensor.from_numpy(mine)))  # (world_size, 4)
    keys = [row.tobytes() for row in rows]
    if all(k == keys[0] for k in keys):
        return
    # Only now, after a mismatch: every rank's per-tensor digests, to name the first difference.
    every = communicator.all_gather_object([[k, n, d, s, g.hex()] for k, n, d, s, g in entries])
    groups = {}
    for r, k in enumerate(keys):
        groups.setdefault(k, []).append(r)
    # The reference: the largest group of identical replicas; on a tie, the one holding rank 0 (the rank
    # whose parameters DistOpt broadcast at the start), else the one with the lowest rank.
    reference = max(groups.values(), key=lambda g: (len(g), 0 in g, -g[0]))
    ref = every[reference[0]]
    differing, lines = {}, []
    for r in range(len(keys)):
        if r in reference:
            continue
        kind, name, detail = _first_difference(ref, every[r], reference[0], r)
        differing[r] = (kind, name)
        lines.append(f"rank {r} first differs at {kind} {name!r}{detail}")
    where = f" at step {step}" if step is not None else ""
    ref_text = (f"ranks {', '.join(map(str, reference))} agree" if len(reference) > 1
                else f"rank {reference[0]} is the reference")
    raise ReplicaMismatch(
        f"replica check{where}: the replicas differ bitwise ({ref_text}): " + "; ".join(lines)
        + ". Data-parallel replicas stay identical unless a rank applied another update: look for a "
          "rank-dependent seed or input to the model's parameters, a step one rank skipped or took alone, "
          "or a non-deterministic kernel", step, reference, differing)


def replica_digests(named_params, optimizer_states=None) -> list:
    """[(kind, name, dtype, shape, 16-byte digest)] of this rank's parameters (in their given order) then its
    optimizer state (per slot, parameters in the same order, then any other names sorted; the step counter
    and per-parameter numbers last)."""
    named = _named(named_params)
    entries = [("parameter", name, *_digest(t)) for name, t in named]
    if optimizer_states is not None:
        order = {name: i for i, (name, _) in enumerate(named)}
        entries += _state_entries(optimizer_states, order)
    return entries


# ----------------------------------------------------------------------------------------- helpers
def _named(params) -> list:
    """[(name, tensor)]: pairs as given, else whatever DistOpt accepts as a model (replicas.named_parameters)."""
    if isinstance(params, (list, tuple)) and params and all(
            isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in params):
        for name, t in params:
            if not isinstance(t, (Tensor, _core.Tensor)):
                raise TypeError(f"check_replicas: expected (name, tensor) pairs, got {type(t).__name__} for "
                                f"{name!r}")
        return list(params)
    return replicas.named_parameters(params, "check_replicas")


def _state_entries(states, order: dict) -> list:
    opt = states if isinstance(states, Optimizer) else getattr(states, "opt", None)
    if isinstance(opt, Optimizer):  # the live state: no get_states() copy of every tensor
        tensors = opt.state_tensors()
        numbers_ = opt.state_scalars()
        counter = opt.step_counter
    elif isinstance(states, dict) and "step_counter" in states:  # what get_states() returned
        tensors = {k: v for k, v in states.items() if isinstance(v, dict) and
                   all(isinstance(x, (np.ndarray, Tensor)) for x in v.values())}
        numbers_ = {k: v for k, v in states.items() if isinstance(v, dict) and k not in tensors}
        counter = states["step_counter"]
    else:
        raise TypeError(f"check_replicas: optimizer_states must be an Optimizer, an object holding one as .opt "
                        f"(DistOpt), the dict an optimizer's get_states() returns, or None; got "
                        f"{type(states).__name__}")

    def ordered(d: dict) -> list:
        return sorted(d, key=lambda n: (0, order[n], "") if n in order else (1, 0, str(n)))

    entries = []
    for slot, d in tensors.items():
        entries += [("optimizer state", f"{slot} of {n}", *_digest(d[n])) for n in ordered(d)]
    scalars = [[slot, str(n), repr(d[n])] for slot, d in numbers_.items() for n in ordered(d)]
    for (slot, n, value) in scalars:
        entries.append(("optimizer state", f"{slot} of {n}", "number", [], _hash(value.encode())))
    entries.append(("optimizer state", "step_counter", "number", [], _hash(repr(int(counter)).encode())))
    return entries


def _digest(t) -> tuple:
    """(dtype name, shape, digest of the values' bytes) of a Tensor, raw tensor or numpy array."""
    if isinstance(t, Tensor):
        t = t.data
    if isinstance(t, _core.Tensor):
        dtype, shape = t.dtype.name, list(t.shape)
        if not t.device.is_cpu():
            t = t.to(_core.Device("cpu"))  # one copy to the host; hashing needs the bytes there
        arr = np.asarray(t.cast(tensor.float32) if t.dtype == tensor.bfloat16 else t)  # bf16: exact in f32
    else:
        arr = np.asarray(t)
        dtype, shape = str(arr.dtype), list(arr.shape)
    return dtype, shape, _hash(np.ascontiguousarray(arr).view(np.uint8).reshape(-1))


def _hash(data) -> bytes:
    # SHA-256 for the bulk of the bytes (hardware-accelerated where the CPU has SHA extensions, see the module
    # docstring), 16 bytes of it kept: collisions stay out of reach for a consistency check.
    return hashlib.sha256(data).digest()[:DIGEST_BYTES]


def _first_difference(ref: list, other: list, ref_rank: int, rank: int) -> tuple:
    """(kind, name, detail) of the first entry of `other` that differs from `ref`."""
    for i in range(max(len(ref), len(other))):
        if i >= len(ref) or i >= len(other):
            extra = (other if i < len(other) else ref)[i]
            who = rank if i < len(other) else ref_rank
            return extra[0], extra[1], f" (only rank {who} has it: rank {ref_rank} has {len(ref)} entries, " \
                                       f"rank {rank} has {len(other)})"
        a, b = ref[i], other[i]
        if a == b:
            continue
        if a[:2] != b[:2]:
            return b[0], b[1], f" (rank {ref_rank} has {a[0]} {a[1]!r} in that place: the models differ)"
        if a[2:4] != b[2:4]:
            return b[0], b[1], (f" (rank {ref_rank}: {a[2]} {tuple(a[3])}, rank {rank}: {b[2]} {tuple(b[3])})")
        shape = f" {b[2]} {tuple(b[3])}" if b[2] != "number" else " a number"
        return b[0], b[1], f" (its values;{shape})"
    return "replica", "?", ""  # equal entries, different overall digests: cannot happen with one hash function


def _check_communicator(comm, who: str) -> None:
    if not (callable(getattr(comm, "all_gather", None)) and callable(getattr(comm, "all_gather_object", None))):
        raise TypeError(f"{who}: expected a Communicator (singa_lite.comm.init(), or DistOpt's .communicator), "
                        f"got {type(comm).__name__}")
