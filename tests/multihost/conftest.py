"""tests/multihost: jobs that cross a host boundary, on hosts simulated with Linux network and UTS namespaces
(helpers/sim_hosts.py, helpers/netns_rsh). The helpers of this folder and of tests/multiproc go on sys.path (the
jobs of tests/multiproc are reused here). Without root, `ip`, namespaces or mpiexec the tests are skipped with
the reason."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "helpers"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "multiproc", "helpers"))

import sim_hosts  # noqa: E402

_why_not = []  # computed once per session


def skip_reason() -> str | None:
    if not _why_not:
        reason = sim_hosts.why_not()
        if reason is None:
            try:
                import mpi4py  # noqa: F401
            except ImportError:
                reason = "the multihost tests run MPI jobs: pip install 'singa_lite[mpi]' (mpi4py + the MPICH wheel)"
        if reason is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec")):
            reason = "no mpiexec next to this interpreter: pip install 'singa_lite[mpi]' (the MPICH wheel's hydra)"
        _why_not.append(reason)
    return _why_not[0]


@pytest.fixture
def cluster():
    """Two simulated hosts, h0 and h1 (and the launcher host), removed with their processes at the end."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    sim_hosts.remove_stale()
    with sim_hosts.SimCluster(2) as made:
        yield made
