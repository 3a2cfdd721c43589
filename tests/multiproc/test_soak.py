"""A short run of bench/soak_distopt.py (the 10,000-step soak of docs/reliability.md, "Long runs"): 2 ranks on
the shm backend cycling every DistOpt mode; each rank's open fds and shared-memory segments must stay the
same and the job must leave nothing in /dev/shm. Resident memory is not judged on so few steps."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "soak_distopt.py")


def test_short_soak_keeps_fds_and_segments_constant():
    cmd = [sys.executable, SCRIPT, "--backend", "shm", "--mode", "all", "--steps", "300", "--warmup", "100",
           "--every", "20", "--max-growth", "1000"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count(" ok") == 2, out  # one row per rank
    assert "segments left in /dev/shm: none" in out, out
