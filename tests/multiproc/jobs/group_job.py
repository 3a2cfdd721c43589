"""Runs one scenario of helpers/group_cases.py under mpiexec with the mpi backend, for
tests/multiproc/test_collective_mismatch.py and tests/multiproc/test_groups.py:
``python group_job.py <scenario> [json arguments]``. Each rank prints ``RESULT <rank> <json>``."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

import group_cases  # noqa: E402

from singa_lite import dist  # noqa: E402


def main(scenario: str, args: list) -> None:
    comm = dist.init(backend="mpi", timeout=float(os.environ.get("GROUP_JOB_TIMEOUT", "30")))
    result = getattr(group_cases, scenario)(comm, *args)
    print(f"RESULT {comm.rank} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else [])
