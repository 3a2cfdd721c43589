"""Devices, with SINGA's names (``singa.device``).

A :class:`Device` wraps the C++ ``Device`` value (kind + index) and carries SINGA's methods
(``id()``, ``SetRandSeed``, ``Sync``...). One Python object exists per device, so devices compare
with ``is`` as well as ``==``.

CUDA devices need a CUDA build (``SINGA_LITE_CUDA=ON`` or nvcc found at install time) *and* a visible
GPU with a driver; without them the ``create_cuda_*`` functions (and the queries ``get_gpu_mem_size``,
``device_query``) raise :class:`singa_lite.CudaError` saying which piece is missing and how to get it.
SINGA's OpenCL functions exist but find nothing: singa_lite has no OpenCL backend.

Graph mode (``EnableGraph``, ``RunGraph``, ``ResetGraph``)
---------------------------------------------------------
SINGA buffers the operations of a training step while the device's graph is enabled and runs the buffer
at ``RunGraph``. singa_lite runs every operation eagerly, when it is called, in graph mode or not, so
results are identical either way (``tests/compat/test_device_compat.py`` checks it bit for bit):

- ``EnableGraph(flag)`` sets the flag ``graph_enabled()`` reports; nothing is buffered.
- ``RunGraph(sequential=False)`` ends one iteration: it waits for the device's queued work (``Sync``) and
  advances the iteration counter the profiler uses. ``Model`` calls it after each training step in graph
  mode, as SINGA does; the operations themselves have already run.
- ``ResetGraph()`` forgets the iterations counted and the times measured.

What graph mode costs or saves here is measured by ``bench/bench_graph.py`` (one ``Sync`` and a counter
per step: no measurable difference on the CPU).

Time profiling (``SetVerbosity``, ``SetSkipIteration``, ``PrintTimeProfiling``)
----------------------------------------------------------------------------
With verbosity > 0 every operator's forward and backward on this device is timed (wall clock; a CUDA
device is synchronised before and after, so the time is the kernel's) within an iteration, except during
the first ``SetSkipIteration(n)`` iterations (default 5, SINGA's) which warm up caches. An iteration is one
training step of a ``model.Model``, or, for code driving the device by hand, what runs between
``EnableGraph(True)`` and ``RunGraph()``. Operators outside (evaluation between steps) are not timed.
``PrintTimeProfiling()`` prints per iteration: verbosity 1 the forward, backward and remaining time
(optimizer update, communication, Python), verbosity 2 or more also each operator type's forward and
backward time and calls. ``time_profile()`` returns the same numbers as a dict. While no device has
verbosity > 0 the autograd engine pays one global test per operator call.
"""
from __future__ import annotations

import time

from . import _core
from ._core import CudaError

__all__ = [
    "Device", "get_default_device", "set_default_device", "create_cpu_device", "create_cuda_gpu",
    "create_cuda_gpu_on", "create_cuda_gpus", "create_cuda_gpus_on", "get_num_gpus", "cuda_is_available",
    "cuda_maybe_available", "cuda_absent_reason",
    "get_num_threads", "set_num_threads", "enable_lazy_alloc", "get_gpu_ids", "get_gpu_mem_size", "device_query",
    "get_num_opencl_platforms", "get_num_opencl_devices", "create_opencl_device",
]


class Device:
    """A compute device. Create through the module functions, not directly."""

    __slots__ = ("core", "_graph_enabled", "_verbosity", "_skip_iteration", "_profile")

    def __init__(self, core: _core.Device):
        self.core = core
        self._graph_enabled = False
        self._verbosity = 0
        self._skip_iteration = 5  # SINGA's default
        self._profile = _Profile()

    # ----- SINGA's spelling
    def id(self) -> int:
        """SINGA's device id: -1 for the CPU, the GPU index for CUDA."""
        return -1 if self.core.is_cpu() else self.core.index

    def lang(self) -> str:
        return "cpp" if self.core.is_cpu() else "cuda"

    def SetRandSeed(self, seed: int) -> None:
        """Seeds this device's random generator (and restarts its stream)."""
        _core.manual_seed(self.core, int(seed))

    set_rand_seed = SetRandSeed

    def get_rng_state(self) -> tuple[int, int]:
        """This device's generator state, ``(seed, counter)``: a Philox generator whose next draw starts at
        ``counter``. Two ints, so a checkpoint stores it as plain data (``singa_lite.checkpoint`` does)."""
        seed, counter = _core.generator_state(self.core)
        return int(seed), int(counter)

    def set_rng_state(self, state) -> None:
        """Restores what :meth:`get_rng_state` returned: later draws repeat those made after that call."""
        try:
            seed, counter = (int(v) for v in state)
        except (TypeError, ValueError):
            raise TypeError(f"set_rng_state: expected (seed, counter), two ints, got {state!r}") from None
        for name, v in (("seed", seed), ("counter", counter)):
            if not 0 <= v < 1 << 64:
                raise ValueError(f"set_rng_state: {name} must be in [0, 2**64), got {v}")
        _core.set_generator_state(self.core, seed, counter)

    def Sync(self) -> None:
        """Waits for queued work: a GPU's kernels run asynchronously on its compute stream (reading a value
        on the host waits by itself; timing needs Sync). CPU kernels are synchronous: returns at once."""
        if self.core.is_cuda():
            _core.cuda_sync(self.core.index)

    sync = Sync

    # ----- graph mode (eager here: see the module docstring)
    def EnableGraph(self, enable: bool = True) -> None:
        """Sets the graph flag (``graph_enabled()``). Operations still run when called: results are the same."""
        self._graph_enabled = _as_bool(enable, "EnableGraph")

    def graph_enabled(self) -> bool:
        return self._graph_enabled

    def RunGraph(self, sequential: bool = False) -> None:
        """Ends one iteration: waits for queued work and advances the profiler's iteration counter. The
        operations of the step already ran (eagerly), so there is nothing left to execute; `sequential`
        (SINGA: run the buffered operations in submission order) is accepted and checked, and the eager order
        is sequential anyway."""
        _as_bool(sequential, "RunGraph(sequential)")
        self.Sync()
        self._end_iteration()

    def ResetGraph(self) -> None:
        """Forgets the iterations counted and the times measured (SINGA drops its buffered graph, with the
        times stored in it)."""
        self._profile = _Profile()

    def Reset(self) -> None:
        """SINGA's Device::Reset: graph off, queued work finished, graph and profile forgotten, verbosity 0 and
        the skip count back to 5. The random generator keeps its state (SINGA's keeps it too)."""
        self._graph_enabled = False
        self.Sync()
        self.ResetGraph()
        self._skip_iteration = 5
        self.SetVerbosity(0)

    def host(self) -> Device:
        """The host (CPU) device that this device copies through."""
        return create_cpu_device()

    @staticmethod
    def EnableLazyAlloc(enable: bool) -> None:  # SINGA: a static method of Device
        enable_lazy_alloc(enable)

    # ----- time profiling
    def SetVerbosity(self, verbosity: int) -> None:
        """0: no profiling (default); 1: forward / backward / other time per iteration; 2 or more: also
        per operator type. Takes effect for the operators called from now on."""
        self._verbosity = _as_count(verbosity, "SetVerbosity")
        refresh_op_hook()

    def verbosity(self) -> int:
        return self._verbosity

    def SetSkipIteration(self, skip_iteration: int) -> None:
        """The number of first iterations left out of the profile (default 5)."""
        self._skip_iteration = _as_count(skip_iteration, "SetSkipIteration")

    def skip_iteration(self) -> int:
        return self._skip_iteration

    def _profiling(self) -> bool:
        """verbosity > 0 and the warm-up iterations are over."""
        return self._verbosity > 0 and self._profile.iteration >= self._skip_iteration

    def _timing(self) -> bool:
        """True while operators on this device are timed: profiling, and inside an iteration, i.e. a model's
        training step or, as in SINGA where only buffered operations are timed, while the graph is enabled
        (evaluation forwards between steps are left out)."""
        return self._profiling() and (self._profile.step_start is not None or self._graph_enabled)

    def _start_iteration(self) -> None:
        if self._profiling():
            self.Sync()
            self._profile.step_start = time.perf_counter()

    def _end_iteration(self) -> None:
        prof = self._profile
        if self._profiling() and prof.step_start is not None:
            self.Sync()
            prof.step_time += time.perf_counter() - prof.step_start
            prof.measured += 1
        prof.step_start = None
        prof.iteration += 1

    def time_profile(self) -> dict:
        """What PrintTimeProfiling prints, as numbers: seconds per measured iteration.

        ``{"iterations": counted, "measured": timed, "skipped": skip_iteration, "forward": s, "backward": s,
        "other": s, "ops": {name: {"forward": s, "backward": s, "forward_calls": n, "backward_calls": n}}}``
        where calls are per iteration as well. All zero while nothing was measured."""
        prof = self._profile
        n = prof.measured or 1  # an unfinished iteration's op times are counted with the finished ones
        ops = {}
        for phase, table in (("forward", prof.forward), ("backward", prof.backward)):
            for name, (seconds, calls) in table.items():
                row = ops.setdefault(name, {"forward": 0.0, "backward": 0.0, "forward_calls": 0.0,
                                            "backward_calls": 0.0})
                row[phase] = seconds / n
                row[phase + "_calls"] = calls / n
        fwd = sum(r["forward"] for r in ops.values())
        bwd = sum(r["backward"] for r in ops.values())
        other = max(prof.step_time / n - fwd - bwd, 0.0) if prof.measured else 0.0
        return {"iterations": prof.iteration, "measured": prof.measured, "skipped": self._skip_iteration,
                "forward": fwd, "backward": bwd, "other": other, "ops": ops}

    def PrintTimeProfiling(self) -> None:
        """Prints the measured times (see the module docstring); nothing at verbosity 0, as SINGA."""
        if self._verbosity == 0:
            return
        p = self.time_profile()
        lines = ["", f"Time Profiling ({self}): {p['measured']} iteration(s) measured of {p['iterations']}, "
                     f"the first {p['skipped']} skipped; seconds per iteration"]
        if not p["ops"]:
            lines.append("nothing measured yet: run more iterations than SetSkipIteration's count")
        else:
            lines += [f"Forward Propagation Time : {p['forward']:.6f} sec",
                      f"Backward Propagation Time : {p['backward']:.6f} sec",
                      f"Other Time (optimizer, communication, Python) : {p['other']:.6f} sec"]
            if self._verbosity >= 2:
                width = max(len(k) for k in p["ops"])
                for name, r in sorted(p["ops"].items(), key=lambda kv: -(kv[1]["forward"] + kv[1]["backward"])):
                    lines.append(f"OP {name:<{width}} : forward {r['forward']:.6f} sec ({r['forward_calls']:g} "
                                 f"calls), backward {r['backward']:.6f} sec ({r['backward_calls']:g} calls)")
        print("\n".join(lines), flush=True)

    # ----- GPU memory (the caching allocator; the CPU has its own block cache, see empty_cache)
    def memory_stats(self) -> dict:
        """GPU: bytes held by live tensors (``in_use``), its peak since the last ``reset_peak_memory``
        (``peak_in_use``), bytes kept for reuse (``cached``), cudaMalloc calls (``device_allocs``), and the
        cap on ``cached`` and the limit on ``in_use`` (``cache_limit``, ``memory_limit``; None: none; set with
        ``_core.cuda_set_cache_limit`` / ``cuda_set_memory_limit``, or SINGA_LITE_CUDA_CACHE_LIMIT).
        CPU: ``cached``, the bytes of released blocks kept for reuse."""
        if self.core.is_cuda():
            return dict(_core.cuda_memory_stats(self.core.index))
        return {"cached": _core.cpu_cache_bytes()}

    def reset_peak_memory(self) -> None:
        if self.core.is_cuda():
            _core.cuda_reset_peak(self.core.index)

    def empty_cache(self) -> None:
        """Returns cached blocks to the driver (GPU) or the system (CPU); live tensors are untouched."""
        if self.core.is_cuda():
            _core.cuda_empty_cache(self.core.index)
        else:
            _core.empty_cache()

    # ----- plain Python
    @property
    def kind(self) -> str:
        return self.core.kind

    @property
    def index(self) -> int:
        return self.core.index

    def is_cpu(self) -> bool:
        return self.core.is_cpu()

    def is_cuda(self) -> bool:
        return self.core.is_cuda()

    def __eq__(self, other):
        return isinstance(other, Device) and self.core == other.core

    def __hash__(self):
        return hash(self.core)

    def __repr__(self):
        return f"Device('{self.core}')"

    def __str__(self):
        return str(self.core)

    def __reduce__(self):  # pickles by name, unpickles to the process's own instance
        return (_from_name, (str(self.core),))


class _Profile:
    """One device's measurements: seconds and calls per operator type and phase, iteration counters."""

    __slots__ = ("forward", "backward", "iteration", "measured", "step_time", "step_start")

    def __init__(self):
        self.forward: dict[str, list] = {}   # op type -> [seconds, calls]
        self.backward: dict[str, list] = {}
        self.iteration = 0      # iterations ended (RunGraph / model steps) since the last ResetGraph
        self.measured = 0       # of those, the ones timed from start to end
        self.step_time = 0.0    # their wall time, summed
        self.step_start = None  # perf_counter() at the start of the iteration being timed


def _op_type(op) -> str:
    return type(op).__name__.lstrip("_")


class _Timer:
    """The operator hook while some device has verbosity > 0 (see on_op_hook): the engine calls it instead of
    ``op.forward`` / ``op.backward`` and it times the call when the op's device is profiling."""

    @staticmethod
    def forward(op, raw):
        dev = _from_core(raw[0].device) if raw else None
        if dev is None or not dev._timing():
            return op.forward(*raw)
        return _timed(dev, dev._profile.forward, op, op.forward, raw)

    @staticmethod
    def backward(op, dys):
        dev = _from_core(dys[0].device) if dys else None
        if dev is None or not dev._timing():
            return op.backward(*dys)
        return _timed(dev, dev._profile.backward, op, op.backward, dys)


def _timed(dev: Device, table: dict, op, fn, args):
    prof = dev._profile
    if prof.step_start is None:  # graph enabled by hand: the iteration starts with its first operator
        prof.step_start = time.perf_counter()
    dev.Sync()  # for a GPU: time this op's kernels, not the queue before it
    t0 = time.perf_counter()
    out = fn(*args)
    dev.Sync()
    dt = time.perf_counter() - t0
    row = table.get(_op_type(op))
    if row is None:
        row = table[_op_type(op)] = [0.0, 0]
    row[0] += dt
    row[1] += 1
    return out


_TIMER = _Timer()


# ---------------------------------------------------------------- the operator hook
# The engine calls hook.forward(op, raw_inputs) / hook.backward(op, dys) in place of op.forward / op.backward
# while a hook is set. Two tools want it: the time profiler here (SetVerbosity) and the timeline (timeline.py),
# which times around the profiler. Both sit below or beside the engine, so neither may import it: the engine
# registers where the hook goes (on_op_hook), the timeline registers how it wraps the profiler
# (wrap_op_hook), and this one function decides the hook whenever either tool changes state.
_hook_sinks: list = []
_hook_wrapper = None


def on_op_hook(sink) -> None:
    """Registers sink(hook): called now and whenever the operator hook changes (hook None: no hook)."""
    _hook_sinks.append(sink)
    sink(_op_hook())


def wrap_op_hook(wrapper) -> None:
    """Registers wrapper(profiler) -> hook, which puts a hook around the profiler's (None when no device
    profiles); the one registered last is used."""
    global _hook_wrapper
    _hook_wrapper = wrapper
    refresh_op_hook()


def refresh_op_hook() -> None:
    """Decides the operator hook again and hands it to every sink (after a tool started or stopped)."""
    hook = _op_hook()
    for sink in _hook_sinks:
        sink(hook)


def _op_hook():
    profiler = _TIMER if any(d._verbosity > 0 for d in _instances.values()) else None
    return profiler if _hook_wrapper is None else _hook_wrapper(profiler)


def _as_bool(v, what: str) -> bool:
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise TypeError(f"{what}: expected True or False, got {v!r} ({type(v).__name__})")


def _as_count(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what}: expected an int >= 0, got {v!r}")
    return v


_instances: dict[str, Device] = {}


def _from_core(core: _core.Device) -> Device:
    name = str(core)
    dev = _instances.get(name)
    if dev is None:
        dev = _instances[name] = Device(core)
    return dev


def _from_name(name: str) -> Device:
    return _from_core(_core.Device(name))


def as_device(dev) -> Device:
    """Accepts a Device, a name ('cpu', 'cuda:1') or None (the default device)."""
    if dev is None:
        return get_default_device()
    if isinstance(dev, Device):
        return dev
    if isinstance(dev, str):
        return _from_name(dev)
    if isinstance(dev, _core.Device):
        return _from_core(dev)
    raise TypeError(f"expected a singa_lite Device, a device name such as 'cpu' or 'cuda:0', or None; "
                    f"got {type(dev).__name__}")


_default: Device | None = None


def get_default_device() -> Device:
    """The device new tensors go to when none is given: the CPU unless changed."""
    global _default
    if _default is None:
        _default = create_cpu_device()
    return _default


def set_default_device(dev) -> None:
    global _default
    _default = as_device(dev)


def create_cpu_device() -> Device:
    return _from_core(_core.Device("cpu"))


def cuda_is_available() -> bool:
    """True when this build has CUDA and at least one GPU is usable. Asks the CUDA driver, which initialises
    CUDA in this process: a process that has done so cannot fork children that use the GPU (every CUDA call
    there fails with "initialization error"). Before forking, ask :func:`cuda_maybe_available` instead."""
    return _core.cuda_device_count() > 0


def cuda_maybe_available() -> bool:
    """False when this process can certainly use no GPU (a CPU-only build, CUDA_VISIBLE_DEVICES hiding every
    GPU, no NVIDIA device file); True when it may. Decided without initialising CUDA or loading the driver, so
    a parent may ask before it forks children that use the GPU; a True can still meet a driver the children
    find unusable, and they say why. :func:`cuda_absent_reason` gives the reason of a False."""
    return _core.cuda_absent_reason() == ""


def cuda_absent_reason() -> str:
    """Why :func:`cuda_maybe_available` is False, or "" (decided without initialising CUDA)."""
    return _core.cuda_absent_reason()


def get_num_gpus() -> int:
    return _core.cuda_device_count()


def get_gpu_ids() -> list[int]:
    return list(range(_core.cuda_device_count()))


def enable_lazy_alloc(enable: bool) -> None:
    """SINGA's switch for allocating a tensor's memory on first write. singa_lite allocates when a tensor is
    created and reuses freed blocks from a cache, so there is nothing to switch; the value is checked."""
    _as_bool(enable, "enable_lazy_alloc")


def _require_gpu(device_id: int, action: str = "create") -> None:
    if not _core.cuda_compiled() or _core.cuda_device_count() == 0:
        raise CudaError(f"cannot {action} cuda:{device_id}: {_core.cuda_unavailable_reason()}")
    n = _core.cuda_device_count()
    if not 0 <= device_id < n:
        raise CudaError(f"cannot {action} cuda:{device_id}: this machine has {n} GPU(s), ids 0 to {n - 1}")


def _gpu_index(id, fn: str) -> int:  # noqa: A002 - SINGA's argument name
    if not isinstance(id, int) or isinstance(id, bool):
        raise TypeError(f"{fn}: id must be an int (a GPU index), got {type(id).__name__}")
    _require_gpu(id, "query")
    return id


def get_gpu_mem_size(id) -> tuple[int, int]:  # noqa: A002
    """``(free, total)`` bytes of GPU ``id``, as SINGA (cudaMemGetInfo: free counts what singa_lite's caching
    allocator holds as used). Read from the CUDA driver, see cuda_query."""
    from ._runtime import cuda_query
    return cuda_query.mem_info(_gpu_index(id, "get_gpu_mem_size"))


def device_query(id, verbose: bool = False) -> str:  # noqa: A002
    """A text description of GPU ``id``, one "label: value" line each (memory, block and grid limits; with
    ``verbose`` also name, compute capability, registers, warp size, multiprocessors...), as SINGA's."""
    from ._runtime import cuda_query
    rows = cuda_query.properties(_gpu_index(id, "device_query"), _as_bool(verbose, "device_query: verbose"))
    return "".join(f"{label + ':':<31}{value}\n" for label, value in rows)


# OpenCL: different on purpose. singa_lite has no OpenCL backend (SINGA's is optional, via ViennaCL), so
# there are no OpenCL platforms or devices to count, and none can be created.
def get_num_opencl_platforms() -> int:
    return 0


def get_num_opencl_devices() -> int:
    return 0


def create_opencl_device():
    raise RuntimeError("create_opencl_device: singa_lite has no OpenCL backend; use create_cpu_device() or, "
                       "with an NVIDIA GPU, create_cuda_gpu()")


def create_cuda_gpu_on(device_id: int, set_default: bool = False) -> Device:
    """The CUDA device with this index (SINGA: ``device.create_cuda_gpu_on(rank_in_local)``)."""
    if not isinstance(device_id, int) or isinstance(device_id, bool):
        raise TypeError(f"create_cuda_gpu_on: device_id must be an int, got {type(device_id).__name__}")
    _require_gpu(device_id)
    dev = _from_core(_core.Device(f"cuda:{device_id}"))
    if set_default:
        set_default_device(dev)
    return dev


def create_cuda_gpu(set_default: bool = False) -> Device:
    return create_cuda_gpu_on(0, set_default)


def create_cuda_gpus(num: int) -> list[Device]:
    return [create_cuda_gpu_on(i) for i in range(num)]


def create_cuda_gpus_on(device_ids) -> list[Device]:
    return [create_cuda_gpu_on(i) for i in device_ids]


def get_num_threads() -> int:
    """Threads used by the CPU kernels (OpenMP) and OpenBLAS."""
    return _core.get_num_threads()


def set_num_threads(n: int) -> None:
    _core.set_num_threads(int(n))


def __getattr__(name):
    # SINGA's module attribute ``device.default_device``: read through, so set_default_device shows.
    if name == "default_device":
        return get_default_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
