"""The straggler scenario (helpers/straggler_cases.py) as a script, for mpiexec and singa-run: rank SLOW (argv[1]) is
slow in PHASE (argv[2]: data or forward) for STEPS (argv[3]) steps; writes its report (DistOpt.stats() as JSON) to
$STRAGGLER_OUT/report.<rank>.json when that is set, and prints "OK rank r". singa-run --report N (SINGA_LITE_REPORT)
adds the reports every N steps."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

import straggler_cases  # noqa: E402

slow, phase = int(sys.argv[1]), sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else straggler_cases.STEPS
report = straggler_cases.train(None, slow, phase, steps)
rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", "0")))
if os.environ.get("STRAGGLER_OUT"):  # a file per rank: mpiexec may interleave the ranks' long lines
    with open(os.path.join(os.environ["STRAGGLER_OUT"], f"report.{rank}.json"), "w") as f:
        json.dump(report, f)
print(f"OK rank {rank}", flush=True)
