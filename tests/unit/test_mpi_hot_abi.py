"""When the mpi backend may run its C++ hot path (singa_lite/comm/mpi_hot.py, mpich_abi_library): only when mpi4py
talks to the MPI library through the MPICH ABI, whose 4-byte handles the C++ side passes on as they are. Any
other ABI (Open MPI's pointer handles, the MPI-5 standard ABI), or an mpi4py without the introspection, must
keep the Python path. Stub MPI modules: no MPI library is needed."""
import pytest

from singa_lite import _core
from singa_lite.comm import mpi_hot


class MpichLike:
    Comm, Request, Win, Datatype, Op = (type(n, (), {}) for n in ("Comm", "Request", "Win", "Datatype", "Op"))
    COMM_WORLD, REQUEST_NULL, FLOAT = object(), object(), object()
    handle_size = 4
    handles = {"COMM_WORLD": 0x44000000, "REQUEST_NULL": 0x2C000000, "FLOAT": 0x4C00040A}

    @classmethod
    def _sizeof(cls, kind):
        return cls.handle_size

    @classmethod
    def _handleof(cls, obj):
        name = next(n for n in ("COMM_WORLD", "REQUEST_NULL", "FLOAT") if getattr(cls, n) is obj)
        return cls.handles[name]


class PointerHandles(MpichLike):  # Open MPI, the standard ABI: handles are pointers
    handle_size = 8


class OtherValues(MpichLike):  # 4-byte handles, but not MPICH's values
    handles = {"COMM_WORLD": 1, "REQUEST_NULL": 0, "FLOAT": 7}


class NoIntrospection:  # an mpi4py without _sizeof / _handleof
    pass


@pytest.mark.parametrize("stub", [PointerHandles, OtherValues, NoIntrospection])
def test_other_abis_keep_the_python_path(stub):
    assert mpi_hot.mpich_abi_library(stub) is None


def test_the_mpich_abi_needs_its_library_loaded(monkeypatch):
    # MPICH's handles, but no libmpi.so.12 in this process's maps: nothing for dlopen(RTLD_NOLOAD) to find.
    import builtins
    real_open = builtins.open

    def maps_without_mpi(path, *args, **kwargs):
        if path == "/proc/self/maps":
            import io
            return io.StringIO("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", maps_without_mpi)
    assert mpi_hot.mpich_abi_library(MpichLike) is None


def test_the_mpich_abi_with_its_library_gives_its_path(monkeypatch):
    import builtins
    import io
    real_open = builtins.open
    maps = "7f00-7f01 r-xp 00000000 08:01 1 /opt/venv/lib/libmpi.so.12.5.0\n" \
           "7f01-7f02 r--p 00001000 08:01 1 /opt/venv/lib/libmpi.so.12.5.0\n"
    monkeypatch.setattr(builtins, "open",
                        lambda p, *a, **k: io.StringIO(maps) if p == "/proc/self/maps" else real_open(p, *a, **k))
    assert mpi_hot.mpich_abi_library(MpichLike) == "/opt/venv/lib/libmpi.so.12.5.0"


def test_the_hot_path_refuses_a_library_that_is_not_loaded():
    # RTLD_NOLOAD: never a second copy of an MPI library next to mpi4py's (it would not be initialised).
    with pytest.raises(ValueError, match="is not loaded in this process"):
        _core.MpiHotPath(library="/nonexistent/libmpi.so.12", comm=0, win=0, check_request=0, slot=8, slots=8,
                         slot_bytes=4144, world_size=2, entered=8, progress=0, dtype_codes=[], mpi_types=[],
                         mpi_ops=[], all_reduce_kind=0, avg_op=1, max_op=2, min_op=3, request_null=0, spin_ns=0,
                         yield_ns=0)
