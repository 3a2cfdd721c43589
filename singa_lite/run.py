"""`python -m singa_lite.run` = `singa-run`: starts N ranks of a script on this host (singa_lite/comm/launcher.py)."""
import sys

from .comm.launcher import main

if __name__ == "__main__":
    sys.exit(main())
