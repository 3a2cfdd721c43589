"""Devices, with SINGA's names (``singa.device``).

A :class:`Device` wraps the C++ ``Device`` value (kind + index) and carries SINGA's methods
(``id()``, ``SetRandSeed``, ``Sync``...). One Python object exists per device, so devices compare
with ``is`` as well as ``==``.

CUDA devices need a CUDA build (``SINGA_LITE_CUDA=ON`` or nvcc found at install time) *and* a visible
GPU with a driver; without them the ``create_cuda_*`` functions raise :class:`singa_lite.CudaError`
saying which piece is missing and how to get it.
"""
from __future__ import annotations

from . import _core
from ._core import CudaError

__all__ = [
    "Device", "get_default_device", "set_default_device", "create_cpu_device", "create_cuda_gpu",
    "create_cuda_gpu_on", "create_cuda_gpus", "create_cuda_gpus_on", "get_num_gpus", "cuda_is_available",
    "get_num_threads", "set_num_threads",
]


class Device:
    """A compute device. Create through the module functions, not directly."""

    __slots__ = ("core",)

    def __init__(self, core: _core.Device):
        self.core = core

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

    # ----- GPU memory (the caching allocator; the CPU has its own block cache, see empty_cache)
    def memory_stats(self) -> dict:
        """GPU: bytes held by live tensors (``in_use``), its peak since the last ``reset_peak_memory``
        (``peak_in_use``), bytes kept for reuse (``cached``) and cudaMalloc calls (``device_allocs``).
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
    """True when this build has CUDA and at least one GPU is usable."""
    return _core.cuda_device_count() > 0


def get_num_gpus() -> int:
    return _core.cuda_device_count()


def _require_gpu(device_id: int) -> None:
    if not _core.cuda_compiled() or _core.cuda_device_count() == 0:
        raise CudaError(f"cannot create cuda:{device_id}: {_core.cuda_unavailable_reason()}")
    n = _core.cuda_device_count()
    if not 0 <= device_id < n:
        raise CudaError(f"cannot create cuda:{device_id}: this machine has {n} GPU(s), ids 0 to {n - 1}")


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
