"""The straggler scenario (helpers/straggler_cases.py) as a script, for mpiexec and singa-run: rank SLOW (argv[1]) is
slow in PHASE (argv[2]: data or forward) for STEPS (argv[3]) steps; prints its report as one JSON line
("REPORT {...}") and "OK rank r". Options, from the environment: singa-run --report N (SINGA_LITE_REPORT)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

import straggler_cases  # noqa: E402

slow, phase = int(sys.argv[1]), sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else straggler_cases.STEPS
report = straggler_cases.train(None, slow, phase, steps)
rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", "0")))
print("REPORT " + json.dumps(report), flush=True)
print(f"OK rank {rank}", flush=True)
