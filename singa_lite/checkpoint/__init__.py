"""Checkpoint and resume: the whole training state, saved so that a resumed run continues exactly as an
uninterrupted one would have (on CPU, bit for bit: same seed, same number of ranks).

    sampler = DistributedSampler(len(x), rank, world, seed=0)
    sgd = opt.DistOpt(opt.SGD(lr=opt.StepDecay(0.1, 100), momentum=0.9))
    model.set_optimizer(sgd); model.compile([tx], is_train=True)
    if os.path.exists("ckpt"):
        extra = checkpoint.load("ckpt", model, sgd, sampler)        # after compile: see below
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)                                    # keeps a resumed position
        for xb, yb in batches(x, y, sampler, 64):
            ...
            if step % 100 == 0:
                checkpoint.save("ckpt", model, sgd, sampler, extra={"step": step})

What is saved: the model's states (parameters and auxiliary states such as batch-norm running
statistics); the optimizer's states (per-parameter slots and the step counter, from which learning-rate
schedules are evaluated, so their position comes back with it); DistOpt's own state (partial-update
counter, skipped steps, the error-feedback residuals of sparse updates); the sampler's epoch and position
in the epoch; the random generator of every device (``Device.get_rng_state``) and, if given, a numpy
``Generator``; and ``extra``, the caller's JSON data and numpy arrays (rank 0's; numpy scalars, and 0-d
arrays, come back as Python numbers).

Layout. `path` is a directory::

    path/manifest.json                   the commit point: format, world size, and every file below
                                         with its size and SHA-256
    path/shared.<token>.slckpt           rank 0: the state every rank shares, and `extra`
    path/rank-00001.<token>.slckpt       one per rank: what differs by rank

A save writes new files under a fresh random token, waits for every rank, and only then replaces
``manifest.json`` (atomically); files of older tokens are removed after that. Until the new manifest is
in place the old one names the old files, which are untouched, so a process killed at any moment of a
save leaves the previous checkpoint loadable; files no manifest names (an interrupted save's) are never
read.

Concurrent saves to one directory (two jobs, or a job started twice) take turns: rank 0 holds an
exclusive ``flock`` on the directory (``<path>/.lock`` where the file system cannot lock a directory)
from before any file is written until the manifest is in place and old files are removed, and waits
`lock_timeout` seconds for it before a CheckpointError. So a save never removes files another save's
manifest names, and whatever the interleaving the last complete save is there. A reader takes no lock:
if a save replaces the checkpoint while it reads (its files vanish), it reads the new one, and it gives
up with a CheckpointError only if that keeps happening.

Whose checkpoint it is. The manifest records the job id of the job that wrote it (``job_id``:
``singa_lite.comm.auth.job_id()``, i.e. SINGA_LITE_JOB_ID, else torchrun's run id, else Slurm's
``job.step``, else ''), so that one job's save never silently replaces another job's checkpoint. Rank 0
decides, under the directory's lock, and every rank raises the same CheckpointError when it refuses:

- the same job (same id) saves again: allowed;
- a job with no id saving over a checkpoint written by a job with no id: allowed (they cannot be told
  apart; a manifest of an older singa_lite, which has no ``job_id``, counts as written with no id, and
  one that cannot be read, from which nothing can be loaded, may be replaced by any job);
- any other pair of ids ('' against an id included): refused, naming both ids, unless
  ``save(..., overwrite=True)``; or save into another directory;
- a job that loaded a checkpoint continues its run: after ``load(path, ...)`` succeeds, saves from this
  process into that directory are allowed as long as its manifest still names the job that was loaded
  (so a run relaunched under a new id, a fresh singa-run or torchrun, resumes and saves as before). A
  save records the saving job's id, so later saves of the same job need nothing more.

One directory rather than one file per rank so that a checkpoint can be moved, listed and deleted
as one thing, and rather than one file so that no rank sends its state to rank 0. With several hosts,
`path` must be on a file system every rank sees.

What differs by rank: the generators and the sampler (a rank's own, always in its file), the residuals,
and whatever else happens to: each rank hashes its model states and its optimizer states, and a rank
whose hash differs from rank 0's (batch-norm statistics of its own batches; parameters and momenta
between partial updates) keeps that part in its own file too. So loading on N ranks restores each rank.

ZeRO (``DistOpt(..., zero_stage=1|2)``): each rank's optimizer state is its shard, so every rank's file holds its
own; a load reads every rank's file and joins the shards into the whole state (parallel/zero.py,
``merge_optimizer_states``), which loads into a DistOpt of any stage on any number of ranks, or into a plain
optimizer; a sharded DistOpt keeps only its part once its shard plan is known (at its first step).

Buffers (batch norm's running statistics). The shared file holds one model whose buffers are what
``DistOpt.sync_buffers`` would give: rank 0's (``broadcast_buffers=True``, the default, and ``False``) or the
ranks' mean (``"average"``). Every rank whose buffers differ from those keeps its own in its file, so the
same job resumes bit for bit, while a resharded load (another number of ranks, one process included) gets
the one model. Saving changes no rank's live buffers.

Format: every file is written atomically (:func:`atomic_write`: a temporary file, fsync, rename, fsync of
the directory; owner-only permissions). A ``.slckpt`` is a zip of ``header.json`` (magic, format
version, rank, token), ``state.json`` (the state as JSON, arrays referenced as ``{"$array": k, "dtype":
"<f4", "shape": [..]}``; format 1 had only the number) and ``arrays/<k>.npy``, all stored (not
compressed). No pickle anywhere, so loading never runs code, and object arrays are refused on save and on
load. A file is untrusted: only the entries ``state.json`` references are read, each checked against its
declared dtype and shape before its data (:mod:`singa_lite.checkpoint_io`), so a load's memory stays
within about twice the declared data whatever the file holds. :func:`load` checks everything -- the
manifest, sizes and SHA-256 of the files this rank reads, headers, the world size, names, shapes and
dtypes against the model -- on every rank before it changes anything, and raises :class:`CheckpointError`
(a ValueError) naming the file and what is wrong; with a DistOpt, every rank raises when any rank fails.

Load after ``Model.compile`` (compile gives every rank rank 0's parameters, which would undo the per-rank
states just loaded).

Another number of ranks (``load(..., reshard=True)``; refused by name without it): a job saved on N ranks
resumes on M, e.g. after losing a host. Not a bitwise continuation: every rank starts from rank 0's model,
optimizer and DistOpt counters (as replicas do at a job's first step), DistOpt's residuals become the mean of
the N saved ones (so the pending, not yet sent, part of the averaged update is kept: sum over N ranks / N),
the sampler keeps its epoch and the fraction of it done (:meth:`DistributedSampler.resharded_state`), and the
random generators (devices' and `rng`) are left as the script seeded them, since N streams cannot become M.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import time

import numpy as np

from .. import _core, tensor
from ..checkpoint_io import (
    CheckpointError,
    DirectoryLock,
    atomic_write,
    read_json_file,
)
from ..tensor import Tensor
from .format import FORMAT_VERSION, MAGIC, check_header, digest, encode, pack, python_scalars, unpack

__all__ = ["FORMAT_VERSION", "CheckpointError", "ElasticState", "Resume", "atomic_write", "load", "save"]

MANIFEST = "manifest.json"
_OUR_FILE = re.compile(r"^(shared|rank-\d{5})\.[0-9a-f]+\.slckpt$")
_OUR_TEMP = re.compile(r"^\.(manifest\.json|(shared|rank-\d{5})\.[0-9a-f]+\.slckpt)\..*\.tmp$")  # atomic_write's
# realpath of a checkpoint directory -> the job id its manifest named when this process loaded it: saves
# there continue that job's run (see "Whose checkpoint it is" above)
_loaded_owners: dict = {}


# ---------------------------------------------------------------- what is saved
def _parts(optimizer):
    """(DistOpt or None, the plain Optimizer or None, the communicator or None)."""
    from ..parallel.dist_opt import DistOpt

    inner = getattr(optimizer, "dist_opt", None)  # ddp.DistributedOptimizer wraps a DistOpt
    if isinstance(inner, DistOpt):
        optimizer = inner
    if isinstance(optimizer, DistOpt):
        return optimizer, optimizer.opt, optimizer.communicator
    return None, optimizer, None


def _devices() -> list:
    from .. import device

    return [device.create_cpu_device()] + [device.as_device(f"cuda:{i}") for i in range(_core.cuda_device_count())]


def _replicated(model, dist_states, plain) -> dict:
    """The parts that are usually the same on every rank: {name: state}. dist_states: DistOpt.get_states()."""
    parts = {}
    if model is not None:
        parts["model"] = {k: tensor.to_numpy(v) for k, v in model.get_states().items()}
    if dist_states is not None:
        parts["optimizer"] = dist_states["opt"]
        parts["distopt"] = {"partial": int(dist_states["partial"]), "skipped_steps": int(dist_states["skipped_steps"]),
                            "synced": bool(dist_states["synced"]),
                            "zero_stage": int(dist_states.get("zero_stage", 0))}
    elif plain is not None:
        parts["optimizer"] = plain.get_states()
    return parts


def _averages_buffers(dist, comm) -> bool:
    """Does the checkpoint's one model take the mean of the ranks' buffers (DistOpt broadcast_buffers="average")
    rather than rank 0's (True) or, with False, rank 0's too (each rank keeps its own in its file anyway)?"""
    return dist is not None and comm is not None and comm.world_size > 1 and dist.broadcast_buffers == "average"


def _float_buffers(model, replicated) -> dict | None:
    """{name: array} of the model's floating-point buffers (batch norm's running statistics), as saved."""
    if model is None or "model" not in replicated:
        return None
    from ..parallel.buffers import named_buffers

    state = replicated["model"][0]
    names = [n for n, _ in named_buffers(model, "checkpoint.save")]
    # as JSON-able values: objects cross the communicator as JSON, never pickle
    return {n: {"dtype": state[n].dtype.str, "shape": list(state[n].shape), "data": state[n].tobytes()}
            for n in names if n in state and state[n].dtype.kind == "f"}


def _mean_buffers(per_rank: list) -> dict:
    """The ranks' mean of each buffer (as _float_buffers sent it), summed in rank order in float64: the same
    bits on every rank."""
    def array(b):
        return np.frombuffer(b["data"], np.dtype(b["dtype"])).reshape(b["shape"])

    first = per_rank[0] or {}
    return {n: (sum(array(b[n]).astype(np.float64) for b in per_rank) / len(per_rank)).astype(first[n]["dtype"])
            for n in first}


def _own(dist_states, sampler, rng, position) -> dict:
    """The parts that belong to one rank."""
    own = {"generators": {str(d): list(d.get_rng_state()) for d in _devices()}}
    if dist_states is not None:  # the sparse exchange's state, as it lays it out for a file
        from ..parallel.exchange import SparseExchange

        own["residuals"] = SparseExchange.entries(dist_states["residuals"])
    if sampler is not None:
        s = sampler.state_dict()
        if position is not None:
            s["position"] = position
            try:
                sampler.check_state(s)
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"checkpoint.save: position={position!r} does not fit the sampler: {e}") from None
        own["sampler"] = s
    if rng is not None:
        own["numpy_rng"] = rng.bit_generator.state
    return own


# ---------------------------------------------------------------- save
class _NamedTensors:
    """A dict of named tensors seen as a model (get_states / set_states / get_params, in place)."""

    def __init__(self, tensors: dict):
        bad = [k for k, v in tensors.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
        if bad:
            raise TypeError(f"checkpoint: model as a dict must map names (str) to tensor.Tensor; not so for {bad}")
        self.tensors = dict(tensors)

    def get_states(self) -> dict:
        return dict(self.tensors)

    def get_params(self) -> dict:
        return {k: v for k, v in self.tensors.items() if v.stores_grad}

    def set_states(self, states: dict) -> None:  # names, shapes and dtypes were checked by load
        for k, v in states.items():
            if isinstance(v, Tensor):
                self.tensors[k].copy_data(v)
            else:
                self.tensors[k].copy_from_numpy(v)  # no intermediate tensor: loading costs one copy of the data


def _as_model(model):
    return _NamedTensors(model) if isinstance(model, dict) else model


def save(path: str, model=None, optimizer=None, sampler=None, rng=None, extra=None, position=None,
         communicator=None, lock_timeout: float = 600.0, overwrite: bool = False) -> None:
    """Saves a checkpoint into the directory `path` (created if needed), replacing the one there atomically.

    model: a Layer/Model, or a dict of named tensors (the parameters of a model written in SINGA's plain
    autograd style, restored in place); optimizer: an Optimizer or a DistOpt (then the call is collective: every rank of
    its communicator calls it, and it returns once the checkpoint is complete); sampler: a
    DistributedSampler (its epoch and position; `position` overrides the latter); rng: a numpy Generator;
    extra: JSON data and numpy arrays (rank 0's are saved; numpy scalars come back as Python numbers);
    communicator: for a collective save without a DistOpt. lock_timeout: how long (s) to wait for another
    save to the same directory to finish (saves to one directory run one at a time, see the module's
    docstring); CheckpointError after that. overwrite: replace a checkpoint that another job wrote (without
    it that is a CheckpointError naming both jobs' ids; see "Whose checkpoint it is" in the module's
    docstring)."""
    with contextlib.ExitStack() as held:  # rank 0's lock on the directory, released however save ends
        _save(path, model, optimizer, sampler, rng, extra, position, communicator, lock_timeout, overwrite, held)


def _save(path, model, optimizer, sampler, rng, extra, position, communicator, lock_timeout, overwrite,
          held) -> None:
    model = _as_model(model)
    dist, plain, comm = _parts(optimizer)
    comm = communicator if communicator is not None else comm
    rank, world = (comm.rank, comm.world_size) if comm is not None else (0, 1)
    # Two local phases, each followed by one collective that every rank enters whatever happened, so a
    # rank that fails reports it instead of leaving the others waiting in a collective it never joins.
    first, error, job = None, None, None
    try:  # phase 1: the directory (rank 0), this rank's states and the hashes of its replicated parts
        if not isinstance(overwrite, bool):
            raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
        if rank == 0:
            from ..comm.auth import job_id

            job = job_id()
            os.makedirs(path, mode=0o700, exist_ok=True)
            held.enter_context(DirectoryLock(path, lock_timeout, f"checkpoint.save({path!r})"))
            if not overwrite:  # under the lock: the manifest read is the one this save replaces
                _check_owner(path, job)
        replicated = {}
        dist_states = dist.get_states() if dist is not None else None  # once: it copies the optimizer's slots
        for name, state in _replicated(model, dist_states, plain).items():
            arrays = []
            replicated[name] = (state, digest(encode(state, arrays, name), arrays))
        own = _own(dist_states, sampler, rng, position)
        first = {"token": secrets.token_hex(8), "digests": {k: d for k, (_, d) in replicated.items()},
                 "buffers": _float_buffers(model, replicated) if _averages_buffers(dist, comm) else None}
    except Exception as e:
        error = _failure(comm, e, "save", path)
    firsts = _gather(comm, first, error, "save", path)
    token, digests0 = firsts[0]["token"], firsts[0]["digests"]
    entry, mine = None, []
    try:  # phase 2: write this rank's files (rank 0: the shared one too), each atomically
        common = {k: state for k, (state, _) in replicated.items()}  # rank 0's: what the shared file holds
        if first["buffers"] is not None:  # the model with the ranks' mean buffers, the same on every rank
            common["model"] = {**replicated["model"][0], **_mean_buffers([f["buffers"] for f in firsts])}
            arrays = []
            digests0 = {**digests0, "model": digest(encode(common["model"], arrays, "model"), arrays)}
        differs = sorted(k for k, (_, d) in replicated.items() if d != digests0.get(k))
        own.update({f"own_{k}": replicated[k][0] for k in differs})
        files = []
        if rank == 0:
            shared = {**common, "extra": extra}
            files.append(("shared", f"shared.{token}.slckpt",
                          pack({"kind": "shared", "token": token, "world_size": world}, shared)))
        files.append(("rank", f"rank-{rank:05d}.{token}.slckpt",
                      pack({"kind": "rank", "rank": rank, "token": token, "world_size": world}, own)))
        entry = {}
        for kind, name, data in files:
            atomic_write(os.path.join(path, name), data)
            mine.append(name)
            entry[kind] = {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        entry["rank"]["own"] = differs
    except Exception as e:
        _remove(path, mine)
        error = _failure(comm, e, "save", path)
    try:
        entries = _gather(comm, entry, error, "save", path)
    except CheckpointError:
        _remove(path, mine)
        raise
    error = None
    if rank == 0:  # every rank's files are complete: commit them
        try:
            _commit(path, token, world, entries, job)
        except Exception as e:
            error = f"rank 0: {type(e).__name__}: {e}"
    if comm is not None:  # nobody goes on before the manifest is in place (or the save failed everywhere)
        error = comm.broadcast_object(error, 0)
    if error:
        _remove(path, mine)
        raise CheckpointError(f"checkpoint.save({path!r}) failed; the previous checkpoint is unchanged: {error}")


_FAILED = "$failed"


def _failure(comm, e: Exception, what: str, path: str) -> str:
    """Alone: raises at once. In a group: the error's text, which the next _gather gives every rank."""
    text = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
    if comm is None:
        if isinstance(e, CheckpointError):
            raise e
        raise CheckpointError(f"checkpoint.{what}({path!r}) failed: {text}") from e
    return text


def _gather(comm, value, error, what: str, path: str) -> list:
    """Every rank's value; CheckpointError on every rank, naming the ranks, if one of them failed (error:
    this rank's failure, or None)."""
    if comm is None:
        return [value]
    got = comm.all_gather_object({_FAILED: error} if error is not None else {"value": value})
    failed = {}  # message -> the ranks that report it (often all of them, for one bad file)
    for r, g in enumerate(got):
        if _FAILED in g:
            failed.setdefault(g[_FAILED], []).append(str(r))
    if failed:
        raise CheckpointError(f"checkpoint.{what}({path!r}) failed" + (
            "; the previous checkpoint is unchanged" if what == "save" else ", nothing was changed") + ": "
            + "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}: {msg}" for msg, rs in failed.items()))
    return [g["value"] for g in got]


def _job_name(job: str) -> str:
    return repr(job) if job else "none (no SINGA_LITE_JOB_ID, torchrun run id or Slurm job id)"


def _owner(manifest) -> str:
    """The job id a manifest records ('' when it records none, as an older singa_lite's)."""
    job = manifest.get("job_id", "") if isinstance(manifest, dict) else ""
    return job if isinstance(job, str) else ""


def _check_owner(path: str, job: str) -> None:
    """Rank 0 of a save by job `job`, holding the directory's lock: CheckpointError when the checkpoint in
    `path` belongs to another job that this process did not load it from (see "Whose checkpoint it is")."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.exists(mpath):
        return
    try:
        owner = _owner(read_json_file(mpath, limit=16 << 20))
    except (CheckpointError, OSError):
        return  # an unreadable manifest: no checkpoint there can be loaded, so replacing it loses none
    if owner == job or owner == _loaded_owners.get(os.path.realpath(path)):
        return
    raise CheckpointError(
        f"{path} holds the checkpoint of another job (job id {_job_name(owner)}; this job's: {_job_name(job)}), "
        f"which this save would replace. To continue that run, load it first (checkpoint.load, after which "
        f"this process may save there); to replace it, pass overwrite=True to checkpoint.save; or save into "
        f"another directory")


def _commit(path: str, token: str, world: int, entries: list, job: str) -> None:
    """Writes the manifest (the commit point), then removes every file no longer named by it. Rank 0
    holds the directory's lock: no other save is writing files here, so none of these is another's."""
    from .._version import __version__

    manifest = {"magic": MAGIC, "format_version": FORMAT_VERSION, "singa_lite_version": __version__,
                "job_id": job, "world_size": world, "token": token, "shared": entries[0]["shared"],
                "ranks": [e["rank"] for e in entries]}
    atomic_write(os.path.join(path, MANIFEST), json.dumps(manifest, indent=1).encode())
    keep = {manifest["shared"]["name"], *(e["name"] for e in manifest["ranks"])}
    for name in os.listdir(path):  # older saves' files, and what interrupted saves left
        if (_OUR_FILE.match(name) and name not in keep) or _OUR_TEMP.match(name):
            _remove(path, [name])


def _remove(path: str, names) -> None:
    for name in names:
        try:
            os.remove(os.path.join(path, name))
        except OSError:
            pass


# ---------------------------------------------------------------- load
def load(path: str, model=None, optimizer=None, sampler=None, rng=None, communicator=None, reshard=False):
    """Restores what :func:`save` wrote into the given objects and returns `extra`. Collective with a
    DistOpt (or a communicator). Everything is checked first, on every rank; a CheckpointError leaves the
    objects as they were. reshard: allow a checkpoint saved by another number of ranks (the module's
    docstring says what carries over); without it that is a CheckpointError. A successful load lets this
    process save into `path` later even under another job id (it continues that run; see "Whose
    checkpoint it is" in the module's docstring)."""
    model = _as_model(model)
    dist, plain, comm = _parts(optimizer)
    comm = communicator if communicator is not None else comm
    rank, world = (comm.rank, comm.world_size) if comm is not None else (0, 1)
    staged, error = None, None
    try:
        staged = _read_settled(path, rank, world, model, dist, plain, sampler, rng, bool(reshard))
    except (CheckpointError, OSError) as e:
        error = _failure(comm, e, "load", path)
    _gather(comm, None, error, "load", path)
    _apply(staged, model, dist, plain, sampler, rng, comm, path)
    _loaded_owners[os.path.realpath(path)] = staged["owner"]
    return python_scalars(staged["extra"])


_READ_ATTEMPTS = 5


def _read_settled(path: str, *args) -> dict:
    """_read, again when it failed because a save replaced the checkpoint while it was being read (the
    manifest changed meanwhile: its old files may be gone); a reader never waits for the writers' lock."""
    mpath = os.path.join(path, MANIFEST)
    for attempt in range(_READ_ATTEMPTS):
        before = _manifest_bytes(mpath)
        try:
            return _read(path, *args)
        except CheckpointError:
            if attempt == _READ_ATTEMPTS - 1 or _manifest_bytes(mpath) == before:
                raise
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")


def _manifest_bytes(mpath: str):
    try:
        with open(mpath, "rb") as f:
            return f.read(min(os.fstat(f.fileno()).st_size, 1 << 20))
    except OSError:
        return None


def _read(path: str, rank: int, world: int, model, dist, plain, sampler, rng, reshard: bool) -> dict:
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: no such checkpoint directory" if not os.path.exists(path) else
                              f"{path}: not a checkpoint directory (checkpoint.save writes a directory; "
                              f"Model.save_states files are read with Model.load_states)")
    if not os.path.isfile(mpath):
        raise CheckpointError(f"{mpath}: missing; {path} holds no complete checkpoint")
    manifest = read_json_file(mpath, limit=16 << 20)  # about 150 bytes per rank
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{mpath}: not a singa_lite checkpoint manifest")
    check_header(mpath, manifest, {})
    saved = manifest.get("world_size")
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
        raise CheckpointError(f"{mpath}: bad world size {saved!r}")
    resharded = saved != world
    if resharded and not reshard:
        raise CheckpointError(f"{mpath}: saved by {saved} rank(s), loaded by {world}; resume with {saved} ranks, or "
                              f"pass reshard=True to start every rank from rank 0's state (see checkpoint's "
                              f"docs for what carries over)")
    ranks = manifest.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != saved or not isinstance(manifest.get("shared"), dict):
        raise CheckpointError(f"{mpath}: does not list one shared file and {saved} rank file(s)")
    for r, e in enumerate(ranks):  # every rank checks that every shard is there: all fail alike
        _stat(path, e, f"rank {r}'s file")
    token = manifest.get("token")
    shared = unpack(*_verified(path, manifest["shared"], "the shared file"),
                     {"kind": "shared", "token": token, "world_size": saved})

    def rank_file(r):
        return unpack(*_verified(path, ranks[r], f"rank {r}'s file"),
                       {"kind": "rank", "rank": r, "token": token, "world_size": saved})
    if resharded:
        where = os.path.join(path, ranks[0]["name"])
        own = _resharded_own(rank_file, saved, dist, sampler, where)
        state = {name: shared.get(name) for name in ("model", "optimizer", "distopt")}
    else:
        where = os.path.join(path, ranks[rank]["name"])
        own = rank_file(rank)
        state = {name: own.get(f"own_{name}", shared.get(name)) for name in ("model", "optimizer", "distopt")}
    if isinstance(state["distopt"], dict) and state["distopt"].get("zero_stage", 0):
        # ZeRO: each rank saved the optimizer state of its shard; the whole state is their union, which loads
        # into any stage on any number of ranks (a sharded DistOpt keeps its part)
        state["optimizer"] = _merged_optimizer(path, shared, rank_file, saved, rank if not resharded else None, own)
    staged = {"extra": shared.get("extra"), "state": state, "own": own, "resharded": resharded,
              "owner": _owner(manifest)}
    _check_against(path, where, staged, model, dist, plain, sampler, rng)
    return staged


def _merged_optimizer(path: str, shared: dict, rank_file, saved: int, mine, own) -> dict:
    """The union of the optimizer shards saved by `saved` ranks (a rank whose shard equalled rank 0's left it in
    the shared file). mine, own: this rank's number and its file already read (None: not read)."""
    from ..parallel.zero import merge_optimizer_states

    shards = []
    for r in range(saved):
        f = own if r == mine else rank_file(r)
        shards.append(f.get("own_optimizer", shared.get("optimizer")))
    try:
        return merge_optimizer_states(shards)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _resharded_own(rank_file, saved: int, dist, sampler, where: str) -> dict:
    """A rank's own part when the checkpoint was saved by `saved` ranks and is loaded by another number:
    residuals averaged over the saved ranks, the sampler's state rescaled, no generator states."""
    first = rank_file(0)
    own = {}
    if sampler is not None and isinstance(first.get("sampler"), dict):
        try:
            own["sampler"] = sampler.resharded_state(first["sampler"])
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: {e}") from None
    if dist is not None:
        from ..parallel.exchange import SparseExchange

        per_rank = []
        for r in range(saved):
            entries = (first if r == 0 else rank_file(r)).get("residuals", [])
            if not SparseExchange.check_entries(entries):
                raise CheckpointError(f"{where}: malformed residuals entry (rank {r})")
            per_rank.append(entries)
        try:
            own["residuals"] = SparseExchange.merge_entries(per_rank)
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None
    return own


def _stat(path: str, entry, what: str) -> str:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not _OUR_FILE.match(entry["name"]):
        raise CheckpointError(f"{os.path.join(path, MANIFEST)}: bad entry for {what}: {entry!r}")
    fpath = os.path.join(path, entry["name"])
    if not os.path.isfile(fpath):
        raise CheckpointError(f"{fpath}: missing ({what}, listed in the manifest)")
    size = os.path.getsize(fpath)
    if size != entry.get("size"):
        raise CheckpointError(f"{fpath}: {size} bytes, the manifest says {entry.get('size')}: truncated or "
                              f"replaced ({what})")
    return fpath


def _verified(path: str, entry, what: str) -> tuple:
    """(path, the file open at its start) once its SHA-256 matches the manifest's. Hashed in chunks and
    read through the same open file, so memory holds only the arrays read from it, and what is read is
    what was hashed (save never rewrites a file in place)."""
    fpath = _stat(path, entry, what)
    try:
        f = open(fpath, "rb")  # noqa: SIM115 (closed by unpack, or below)
    except FileNotFoundError:  # removed since _stat: a save replaced the checkpoint (load reads it again)
        raise CheckpointError(f"{fpath}: missing ({what}, listed in the manifest)") from None
    try:
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
        if h.hexdigest() != entry.get("sha256"):
            raise CheckpointError(f"{fpath}: SHA-256 differs from the manifest's: the file is corrupt ({what})")
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return fpath, f


def _check_against(path, where, staged, model, dist, plain, sampler, rng) -> None:
    """Raises CheckpointError when the checkpoint does not fit the objects (nothing is changed here)."""
    state, own = staged["state"], staged["own"]
    for name, obj in (("model", model), ("optimizer", plain), ("distopt", dist)):
        if obj is not None and not isinstance(state[name], dict):
            raise CheckpointError(f"{path}: holds no {name} state, but a {name} was given to load")
    if model is not None:
        saved, want = state["model"], model.get_states()
        if sorted(saved) != sorted(want):
            missing, unknown = sorted(set(want) - set(saved)), sorted(set(saved) - set(want))
            raise CheckpointError(f"{path}: the model's states do not match: missing {missing}, unknown "
                                  f"{unknown}; was it saved from another model?")
        for k, t in want.items():
            a = saved[k]
            stored = np.float32 if t.dtype == tensor.bfloat16 else t.dtype.name  # bfloat16 is saved as float32
            if not isinstance(a, np.ndarray) or tuple(a.shape) != tuple(t.shape) or a.dtype != np.dtype(stored):
                got = f"{a.dtype} {tuple(a.shape)}" if isinstance(a, np.ndarray) else repr(a)
                raise CheckpointError(f"{path}: model state {k!r} is {got} in the checkpoint, "
                                      f"{t.dtype.name} {tuple(t.shape)} in the model")
    if plain is not None and model is not None:  # optimizer slots are keyed by parameter names
        # slots are keyed by the parameters' names: a Model's keys, a dict model's keys or the tensors' names
        params = {**{p.name: p for p in model.get_params().values() if p.name}, **model.get_params()}
        for slot, entries in state["optimizer"].items():
            for k, a in (entries.items() if isinstance(entries, dict) else ()):
                if k not in params:
                    raise CheckpointError(f"{path}: optimizer state {slot}[{k!r}] is for a parameter the model "
                                          f"does not have (its parameters: {sorted(params)}); was it saved "
                                          f"from another model?")
                if isinstance(a, np.ndarray) and tuple(a.shape) != tuple(params[k].shape):
                    raise CheckpointError(f"{path}: optimizer state {slot}[{k!r}] has shape {tuple(a.shape)}, "
                                          f"the parameter {tuple(params[k].shape)}")
    if dist is not None:
        from ..parallel.exchange import SparseExchange

        if not SparseExchange.check_entries(own.get("residuals", [])):
            raise CheckpointError(f"{where}: malformed residuals entry")
    if sampler is not None:
        if not isinstance(own.get("sampler"), dict):
            raise CheckpointError(f"{where}: holds no sampler state, but a sampler was given to load")
        try:
            sampler.check_state(own["sampler"])
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: {e}") from None
    if rng is not None and not staged.get("resharded"):
        saved = own.get("numpy_rng")
        kind = type(rng.bit_generator).__name__
        if not isinstance(saved, dict) or saved.get("bit_generator") != kind:
            raise CheckpointError(f"{where}: holds no {kind} state for rng (it has "
                                  f"{saved.get('bit_generator') if isinstance(saved, dict) else None!r})")
    if staged.get("resharded"):
        return  # generators are not restored across a change of the number of ranks
    gens = own.get("generators")
    if not isinstance(gens, dict):
        raise CheckpointError(f"{where}: holds no generator states")
    here = {str(d) for d in _devices()}
    for name, st in gens.items():
        if name not in here:
            raise CheckpointError(f"{where}: has the random state of {name}, which this process does not see")
        if not (isinstance(st, list) and len(st) == 2 and all(isinstance(v, int) and 0 <= v < 1 << 64 for v in st)):
            raise CheckpointError(f"{where}: bad generator state for {name}: {st!r}")


def _apply(staged, model, dist, plain, sampler, rng, comm, path) -> None:
    """Writes the checked state into the objects. The optimizer goes first: its set_states is the one
    step that checks more than _check_against did, and changes nothing when it raises; if it raises on
    any rank, every rank puts its previous optimizer state back and raises."""
    from .. import device

    state, own = staged["state"], staged["own"]
    if plain is not None or dist is not None:
        before = dist.get_states() if dist is not None else plain.get_states()
        error = None
        try:
            if dist is not None:
                from ..parallel.exchange import SparseExchange

                residuals = SparseExchange.from_entries(own.get("residuals", []))
                # synced as saved: resumed replicas start as they were, since broadcasting rank 0's parameters at
                # the first step would undo per-rank states (partial updates) the uninterrupted run keeps.
                dist.set_states({"opt": state["optimizer"], "partial": state["distopt"]["partial"],
                                 "skipped_steps": state["distopt"]["skipped_steps"], "residuals": residuals,
                                 "synced": bool(state["distopt"].get("synced", False))})
            else:
                plain.set_states(state["optimizer"])
        except (TypeError, ValueError, KeyError) as e:
            error = _failure(comm, CheckpointError(f"{path}: the optimizer refused the saved states: {e}"),
                             "load", path)
        try:
            _gather(comm, None, error, "load", path)
        except CheckpointError:
            if error is None:  # another rank's optimizer refused: put this one's back as it was
                (dist or plain).set_states(before)
            raise
    if model is not None:
        model.set_states(state["model"])
    if sampler is not None:
        sampler.load_state_dict(own["sampler"])
    if rng is not None and "numpy_rng" in own:
        rng.bit_generator.state = own["numpy_rng"]
    for name, st in own.get("generators", {}).items():
        device.as_device(name).set_rng_state(st)


# elastic.py builds on save and load above (it imports them when called, so no import circle).
from .elastic import ElasticState, Resume  # noqa: E402
