"""A rank that skips a layer under ``mpiexec -n 2`` on the mpi backend, for tests/multiproc/test_mismatch_names.py:
``python mismatch_names_job.py <skip_rank> <skip_step> <synced_first 0|1> <style> <threshold>``. Each rank prints
``RESULT <rank> <json [error text, line]>``."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

from singa_lite import dist  # noqa: E402

from mismatch_names_cases import train_skipping  # noqa: E402


def main(skip_rank: str, skip_step: str, synced: str, style: str, threshold: str) -> None:
    comm = dist.init(backend="mpi", timeout=30)
    result = train_skipping(comm, int(skip_rank), int(skip_step), synced == "1", style, int(threshold))
    print(f"RESULT {comm.rank} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
