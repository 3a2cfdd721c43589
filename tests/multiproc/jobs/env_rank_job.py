"""One rank of a launch without MPI (comm/env.py), run by tests/multiproc/test_env_launch.py:
``python env_rank_job.py <helpers dir> <mode>`` joins the others through dist.init(), all-reduces, and
(mode "full") trains with DistOpt as one process does.
Prints one JSON report (or {"error": ...} and exit code 3 when init fails)."""
import json
import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
from singa_lite import dist, opt, tensor  # noqa: E402

mode = sys.argv[2]
start = time.monotonic()
try:
    comm = dist.init(init_method="env") if mode == "explicit" else dist.init()
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - start}), flush=True)
    sys.exit(3)
n = comm.world_size
t = tensor.from_numpy(np.arange(4, dtype=np.float32) * (comm.rank + 1))
comm.all_reduce(t, "sum")
assert np.array_equal(tensor.to_numpy(t), np.arange(4) * n * (n + 1) / 2), tensor.to_numpy(t)
report = {"rank": comm.rank, "world": n, "local": [comm.local_rank, comm.local_size], "backend": comm.backend}
if mode != "quick":
    from distopt_cases import make_params, reference, train
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))  # no arguments: the rank's one communicator
    assert sgd.communicator is comm and dist.init() is comm
    got = train(make_params(0), sgd, 4, shard=(comm.rank, n))
    want = reference("sgd", 4)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    report["distopt"] = "same as one process"
print(json.dumps(report), flush=True)
