"""The straggler report (comm/straggler.py, parallel/step_stats.py) on every CPU backend: a rank made slow on
purpose, in its data loading or its forward pass (helpers/straggler_cases.py), is named with that phase by every
rank's DistOpt.stats(), the reports agree and add up; singa-run --report prints the table every N steps and the
whole job's at the end, and the timeline marks the straggler. Slowdowns are large next to a step: the tests ask
who and where, never how long."""
import json
import os
import subprocess
import sys

import pytest

import straggler_cases
from dist_cases import run_ranks
from paths import job
from test_dist_mpi import mpiexec
from test_launcher import CLEAN
from test_tcp_backend import run_tcp


def _reports(out: dict) -> dict:
    bad = {r: v for r, v in out.items() if v[0] != "ok"}
    assert not bad, bad
    return {r: v[1] for r, v in out.items()}


def _train(comm, slow, phase):
    return straggler_cases.train(comm, slow, phase)


@pytest.mark.parametrize("world,slow,phase", [(2, 1, "data"), (3, 2, "forward"), (3, 0, "data")])
def test_shm_names_the_slow_rank_and_its_phase(world, slow, phase):
    out, _, _ = run_ranks(_train, world, timeout=180, comm_timeout=60, args=(slow, phase))
    assert len(out) == world, out
    straggler_cases.check(_reports(out), slow, phase)


def test_tcp_names_the_slow_rank_and_its_phase():
    out, _ = run_tcp(_train, 2, timeout=180, comm_timeout=60, args=(0, "forward"))
    straggler_cases.check(_reports(out), 0, "forward")


def _hierarchical(world, slow, phase):
    import importlib.util

    spec = importlib.util.spec_from_file_location("hierarchical_job", job("hierarchical_job.py"))
    hierarchical_job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hierarchical_job)
    comm = hierarchical_job.two_hosts(world, sharded=False)
    return straggler_cases.train(comm, slow, phase)


def test_hierarchical_names_the_slow_rank_and_its_phase():
    # ranks 0-1 and 2-3 play two hosts over a tcp world; the report compares the hierarchical all-reduces
    out, _ = run_tcp(_hierarchical, 4, timeout=240, comm_timeout=60, args=(3, "data"))
    reports = _reports(out)
    straggler_cases.check(reports, 3, "data")
    assert reports[0]["backend"] == "hierarchical"


def test_mpi_names_the_slow_rank_and_its_phase(tmp_path):
    pytest.importorskip("mpi4py")
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, job("straggler_job.py"), "1", "forward"],
                          capture_output=True, text=True, timeout=180, env=dict(CLEAN, STRAGGLER_OUT=str(tmp_path)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    reports = []
    for r in range(2):
        with open(tmp_path / f"report.{r}.json") as f:
            reports.append(json.load(f))
    straggler_cases.check(dict(enumerate(reports)), 1, "forward")
    assert reports[0]["backend"] == "mpi"


def test_singa_run_report_prints_the_table_and_the_timeline_marks_the_straggler(tmp_path):
    steps, every = 8, 3
    tl = tmp_path / "tl"
    r = subprocess.run([sys.executable, "-m", "singa_lite.run", "-np", "2", "--backend", "shm", "--timeout", "60",
                        "--report", str(every), "--timeline", str(tl), job("straggler_job.py"), "1", "data",
                        str(steps)], capture_output=True, text=True, timeout=240, env=CLEAN)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # every N steps rank 0 prints the period's table (steps 3 and 6 of 8; the first step is left out)
    periods = [line for line in r.stderr.splitlines() if line.startswith("[rank 0] singa_lite: straggler report:")]
    assert len(periods) == steps // every, out
    assert "[rank 0] rank  step  data  forward  backward  update  wait  waited  caused  last in" in r.stderr, out
    assert r.stderr.count("[rank 0] rank 1 is the straggler") == steps // every, out
    assert not [line for line in r.stderr.splitlines() if line.startswith("[rank 1] singa_lite: straggler")], out
    # at the end, the whole job's table from the figures the ranks left
    end = r.stderr[r.stderr.index("singa-run: the whole job's straggler report: 2 ranks, "):]
    assert end.startswith(f"singa-run: the whole job's straggler report: 2 ranks, {steps - 1} steps, "), out
    assert "rank 1 is the straggler" in end and "mostly in data loading" in end, out
    # the timeline: the verdicts as instant events on both ranks, the straggler's process named
    with open(tl / "timeline.json") as f:
        events = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[0] == "rank 0" and names[1].startswith("rank 1 (straggler: last in "), names
    assert "data loading" in names[1], names
    marks = [e for e in events if e["ph"] == "i"]
    # on both ranks: each period's report, and the one of the script's own stats() at the end
    assert sorted(e["pid"] for e in marks) == sorted([0, 1] * (steps // every + 1)), marks
    assert all(e["name"] == "straggler: rank 1" and e["cat"] == "mark" for e in marks), marks
    assert not os.path.exists(os.path.join(str(tmp_path), "report.rank0.json"))
