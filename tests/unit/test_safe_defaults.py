"""Safe defaults (issue 8): nothing in the package loads a pickle from disk or network (except the CIFAR-10
reader's restricted unpickler, which builds only plain data), the holder keeps NCCL's bootstrap on loopback,
and nothing listens on a network socket except the two modules of a launch without MPI (comm/store.py, the
rendezvous at MASTER_ADDR:MASTER_PORT, and comm/tcp_mesh.py, the tcp backend's mesh), used only when the user starts
ranks that way: singa-run on one host and the holder's ranks find each other through an owner-only
shared-memory segment (tests/multiproc/test_shm_core.py), the mpiexec watcher on an abstract Unix socket."""
import ast
import os
import pathlib

import pytest

import singa_lite
from singa_lite import dist
from singa_lite.comm import holder as holder_module

PACKAGE = pathlib.Path(singa_lite.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))


def calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            yield node, owner, name


def test_the_sources_were_found():
    assert len(SOURCES) > 20 and PACKAGE / "comm" / "launcher.py" in SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_unrestricted_unpickling_and_no_listening_socket(path):
    tree = ast.parse(path.read_text(), str(path))
    for node, owner, name in calls(tree):
        where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
        assert not (owner in ("pickle", "cPickle", "marshal", "shelve", "dill", "joblib") and
                    name in ("load", "loads", "open", "Unpickler")), f"{where}: {owner}.{name} runs pickled code"
        if owner in ("np", "numpy") and name == "load":
            keywords = {k.arg: k.value for k in node.keywords}
            assert "allow_pickle" in keywords and isinstance(keywords["allow_pickle"], ast.Constant) and \
                keywords["allow_pickle"].value is False, f"{where}: np.load without allow_pickle=False"
        module = path.relative_to(PACKAGE).as_posix()
        listens = module in ("comm/watch.py", "comm/store.py", "comm/tcp_mesh.py")
        assert name != "listen" or listens, f"{where}: a listening socket"
        # singa-run --hostfile binds (never listens) to find a free port for the rendezvous, then closes it
        assert name != "bind" or listens or module == "comm/launch_args.py", f"{where}: a bound socket"
    for node in ast.walk(tree):  # the one unpickler is the restricted one, whose every global is vetted
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            if any("Unpickler" in b for b in bases):
                assert (path.name, node.name) == ("cifar10.py", "SafeUnpickler"), f"{path}: {node.name}({bases})"


def test_the_watcher_socket_is_abstract():
    # watch.py binds a datagram socket in Linux's abstract namespace: no file, nothing reachable off the host
    from singa_lite.comm import watch
    assert watch.socket_name(123).startswith(b"\0")


def test_holder_keeps_nccl_bootstrap_on_loopback(monkeypatch):
    monkeypatch.setenv(holder_module.NCCL_IFNAME_VAR, "x")  # so that the value before the test is restored
    monkeypatch.delenv(holder_module.NCCL_IFNAME_VAR)
    dist.NcclIdHolder()
    assert os.environ[holder_module.NCCL_IFNAME_VAR] == "lo"
    monkeypatch.setenv(holder_module.NCCL_IFNAME_VAR, "eth3")  # the user's choice stands
    dist.NcclIdHolder()
    assert os.environ[holder_module.NCCL_IFNAME_VAR] == "eth3"


def test_the_package_knows_mpiexecs_variables_as_the_mpi_backend_does():
    """`import singa_lite` under mpiexec installs the bounded MPI_Init of a script's own mpi4py import; it tells
    an MPI rank by the same variables as comm.mpi_setup."""
    import singa_lite
    from singa_lite.comm import mpi_setup

    assert singa_lite._MPI_LAUNCH_VARS == mpi_setup.MPI_LAUNCH_VARS
