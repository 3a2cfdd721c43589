"""One rank of a job launched with torchrun-style or Slurm variables, for tests/multiproc/test_trust.py:
``python trust_job.py STEPS [raise|exit] [hierarchical]`` joins through dist.init() (hierarchical: and makes the
hierarchical form of that communicator), makes STEPS all-reduces of rank-dependent values (each checked against the
closed form), then exits normally, or ("raise") with an uncaught exception. Prints one JSON report: {"rank",
"world", "backend", "sums"}, or {"error": ...} with exit code 3 when a call fails. Also used on the simulated
hosts of tests/multihost/test_trust_hosts.py."""
import json
import sys

import numpy as np

from singa_lite import dist, tensor

steps = int(sys.argv[1])
try:
    comm = dist.init()
    if "hierarchical" in sys.argv[2:]:
        from singa_lite.comm import hierarchical
        comm = hierarchical.create(comm)
    n = comm.world_size
    for step in range(steps):
        t = tensor.from_numpy(np.full(4, comm.rank + 1 + step, np.float32))
        comm.all_reduce(t, "sum")
        want = n * (n + 1) / 2 + n * step
        assert np.array_equal(tensor.to_numpy(t), np.full(4, want)), (tensor.to_numpy(t), want)
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
    sys.exit(3)
print(json.dumps({"rank": comm.rank, "world": n, "backend": comm.backend, "sums": steps}), flush=True)
if "raise" in sys.argv[2:]:
    raise RuntimeError("the script's own error, after its collectives")
