"""Where the parts of tests/multiproc live: the tests in tests/multiproc itself, the modules they (and the
processes they start) import in tests/multiproc/helpers (on sys.path through tests/multiproc/conftest.py), the
scripts they launch as jobs in tests/multiproc/jobs."""
import os

DIST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPERS = os.path.join(DIST, "helpers")
JOBS = os.path.join(DIST, "jobs")


def job(name: str) -> str:
    """The path of the job script `name` (e.g. "mpi_job.py"), checked to exist so a moved or misspelt job fails
    here rather than as an interpreter error inside an MPI job."""
    path = os.path.join(JOBS, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no job script {name!r} in {JOBS}: the jobs there are "
                                f"{sorted(f for f in os.listdir(JOBS) if f.endswith('.py'))}")
    return path
