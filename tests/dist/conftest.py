"""tests/dist keeps its tests here, the modules they import in helpers/ and the scripts they launch in jobs/
(helpers/paths.py). The helpers go on sys.path for the tests and for the processes they spawn (multiprocessing
passes sys.path on)."""
import os
import sys

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
sys.path.insert(0, HELPERS)
# amp_cases.py and amp_mpi_job.py (still in tests/dist while being worked on) import distopt_cases from the
# helpers in a job run under mpiexec, which gets no sys.path from here: PYTHONPATH carries it to such jobs.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HELPERS, os.environ.get("PYTHONPATH")) if p)
