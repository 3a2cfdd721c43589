"""tests/multiproc keeps its tests here, the modules they import in helpers/ and the scripts they launch in jobs/
(helpers/paths.py). The helpers go on sys.path for the tests and for the processes they spawn (multiprocessing
passes sys.path on)."""
import os
import sys

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
sys.path.insert(0, HELPERS)
