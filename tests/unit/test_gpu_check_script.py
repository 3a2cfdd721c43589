"""tools/gpu_check.sh, the one-call GPU run, works where it can be tried without a GPU: steps run with their
logs written, the summary table comes last, an unknown step is refused, a failing step makes the exit status 1, a
deadline skips what it cannot fit, and the GPU test step fails without a GPU instead of passing on skips. The
offline build from the wheel folder is proven as docs/gpu.md ("Running the GPU checks") records."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_deadline_skips_the_steps_it_cannot_fit(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "DEADLINE": "5"}
    p = subprocess.run(["bash", str(SCRIPT), "info", "report"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    rows = p.stdout.strip().splitlines()[-2:]
    assert all("skipped" in r and "out of time (DEADLINE=5 s)" in r for r in rows), rows


def test_the_gpu_test_step_fails_loudly_without_a_gpu(tmp_path):
    # tools/gpu_check.sh's test step sets SINGA_LITE_REQUIRE_GPU=1: no GPU is a failure naming why, not a green
    # run of skipped tests (tests/gpu/conftest.py)
    from singa_lite import device
    if device.cuda_is_available():
        pytest.skip("a GPU is usable here: the guard lets the suite run")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "gpu")],
                       env={**os.environ, "SINGA_LITE_REQUIRE_GPU": "1"}, capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 4, p.stdout[-2000:] + p.stderr[-2000:]
    assert "SINGA_LITE_REQUIRE_GPU=1 but no GPU is usable" in p.stdout + p.stderr
    assert device.cuda_absent_reason() in p.stdout + p.stderr or "driver" in p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "gpu")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0 and "skipped" in p.stdout  # without the flag: skipped, as in CI


def test_the_wheel_helper_refuses_unknown_commands_and_missing_folders(tmp_path):
    helper = ROOT / "tools" / "gpu_wheels.sh"
    p = subprocess.run(["bash", str(helper), "nonsense"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "usage: tools/gpu_wheels.sh prepare|install" in p.stderr
    p = subprocess.run(["bash", str(helper), "install", str(tmp_path / "none")], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 1 and "no wheel folder" in p.stderr
