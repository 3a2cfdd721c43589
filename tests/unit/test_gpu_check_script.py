"""tools/gpu_check.sh, the one-call GPU run, works where it can be tried without a GPU: steps run with their
logs written, the summary table comes last, an unknown step is refused, a failing step makes the exit status 1."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.sh"


def run(tmp_path, *steps):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "STEP_LIMIT": "120"}
    return subprocess.run(["bash", str(SCRIPT), *steps], env=env, capture_output=True, text=True, timeout=300)


def test_steps_write_logs_and_a_table_last(tmp_path):
    p = run(tmp_path, "info", "report")  # not "test": on a GPU machine that would run the GPU suite here
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[-2].startswith("info ") and "rc=0" in lines[-2]
    assert lines[-1].startswith("report ") and "rc=0" in lines[-1]
    assert "cuda" in (tmp_path / "report.log").read_text()
    assert "python" in (tmp_path / "info.log").read_text()


def test_unknown_step_is_refused_and_failures_set_the_status(tmp_path):
    p = run(tmp_path, "nonsense")
    assert p.returncode == 2 and "unknown step 'nonsense'" in p.stderr
    p = subprocess.run(["bash", str(SCRIPT), "report"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable + "-does-not-exist"})
    assert p.returncode == 1 and "rc=127" in p.stdout
