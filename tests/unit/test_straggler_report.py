"""The straggler report's single-process parts: the comparison of the ranks' figures (comm/straggler.py) on figures
made up here, so every count and sum is known; the log of collective durations (comm/arrivals.py) and a
communicator that keeps one; data loading counted by the readers (data/timing.py); a one-rank DistOpt's clock
(parallel/step_stats.py), whose phases add up to its steps; argument checks; singa-run's --report and the
timeline's marks. Several ranks, each backend: tests/multiproc/test_straggler.py."""
import atexit
import json
import time

import numpy as np
import pytest

from singa_lite import autograd, data, dist, layer, opt, tensor, timeline
from singa_lite.comm import arrivals, launch_args, straggler
from singa_lite.comm.straggler import PHASES, Totals, analyze, final_report, report, write_figures


def payload(steps=4, phases=(0.0, 0.004, 0.008, 0.002, 0.0), waits=None, first=1, durations=()):
    phases = list(phases)
    return {"steps": steps, "phases": phases, "time": sum(phases), "waits": list(waits or [0.0] * steps),
            "first": first, "durations": list(durations)}


def slow_in(phase: str, ms: float = 50.0, steps: int = 4) -> tuple:
    """(fast rank's payload, slow rank's payload): the slow rank spends ms more per step in `phase`; the fast one
    waits for it in each step's first collective (of 3)."""
    s = ms / 1e3
    base = [0.0, 0.004, 0.008, 0.002, 0.0]
    slow = list(base)
    slow[PHASES.index(phase)] += s * steps
    fast = list(base)
    fast[PHASES.index("wait")] += s * steps
    fast_d = [s + 1e-3, 1e-3, 1e-3] * steps
    slow_d = [1e-3, 1e-3, 1e-3] * steps
    return (payload(steps, fast, [s] * steps, durations=fast_d), payload(steps, slow, [0.0] * steps, durations=slow_d))


@pytest.mark.parametrize("phase", ["data", "forward", "backward", "update"])
def test_the_slow_rank_and_its_phase_are_named(phase):
    fast, slow = slow_in(phase)
    totals, upto = analyze([fast, slow])
    assert upto == 12 and totals.compared == 12 and totals.contested == 4  # the first collective of each step
    assert totals.last == [0, 4] and totals.steps_compared == 4 and totals.last_steps == [0, 4]
    assert totals.waited[0] == pytest.approx(4 * 0.05) and totals.waited[1] == 0
    assert totals.caused[1] == pytest.approx(4 * 0.05) and totals.caused[0] == 0
    rep = report(totals, "shm")
    assert rep.straggler == 1 and rep.basis == "collectives" and rep.steps == 4
    s = rep.ranks[1]
    assert s.extra_phase == phase and s.extra_phase_ms == pytest.approx(50.0) and s.extra_ms == pytest.approx(50.0)
    assert s.last == 4 and s.last_share == 1.0 and s.caused_ms == pytest.approx(50.0)
    assert rep.ranks[0].waited_ms == pytest.approx(50.0) and rep.ranks[0].last_share == 0.0
    for r in rep.ranks:  # ms per step, adding up to the step
        assert sum(r.phase_ms.values()) == pytest.approx(r.step_ms)
    words = {"data": "data loading", "update": "the update"}.get(phase, phase)
    assert rep.summary.startswith("rank 1 is the straggler: last in 100% of the collectives where a rank waited, "
                                  "the others blocked 50.0 ms/step longer than it")
    assert rep.summary.endswith(f"mostly in {words} (+50.0 ms/step)")
    text = str(rep)
    assert text.splitlines()[0] == ("straggler report: 2 ranks, 4 steps, 12 collectives compared (4 where a rank "
                                    "waited), shm backend; ms per step")
    assert text.splitlines()[1].split() == ["rank", "step", *PHASES, "waited", "caused", "last", "in"]
    assert text.splitlines()[-1] == rep.summary
    assert rep.note() == f"straggler: last in 100% of collectives, {words} +50.0 ms/step"
    assert json.loads(json.dumps(rep.to_dict()))["ranks"][1]["extra_phase"] == phase


def test_ranks_that_wait_about_equally_have_no_straggler():
    a = payload(durations=[2e-3, 1e-3, 2e-3, 1e-3], waits=[1e-3] * 4)
    b = payload(durations=[1e-3, 2e-3, 1e-3, 2e-3], waits=[1e-3] * 4)
    rep = report(analyze([a, b])[0])
    assert rep.straggler is None and rep.note() == ""
    assert rep.summary.startswith("no straggler: the waiting in collectives") and "spread over the ranks" in rep.summary
    assert [r.last for r in rep.ranks] == [2, 2]


def test_a_rank_the_others_wait_for_only_a_little_is_no_straggler():
    fast, slow = slow_in("data", ms=1.0)
    for p in (fast, slow):  # steps of 100 ms: 1 ms of waiting a step is under a tenth of one
        p["phases"][PHASES.index("forward")] += 4 * 0.1
        p["time"] = sum(p["phases"])
    rep = report(analyze([fast, slow])[0])
    assert rep.straggler is None and rep.ranks[1].last_share == 1.0
    assert rep.summary.startswith("no straggler: the others waited mostly for rank 1 (100% of the waiting in "
                                  "collectives), but blocked only 1.00 ms/step longer than it, under 10% of a "), rep


def test_only_the_collectives_every_rank_has_timed_are_compared():
    # rank 0 still runs collective 7 (not timed yet) and dropped 1-2 (its log's capacity): 3..6 are compared
    a = payload(first=3, durations=[0.05, 1e-3, 1e-3, 1e-3])
    b = payload(first=1, durations=[1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
    totals, upto = analyze([a, b])
    assert upto == 6 and totals.compared == 4 and totals.last == [0, 1]


def test_steps_are_compared_where_no_collective_was_timed():
    # the nccl backend times nothing on the host: each step's time blocked in collectives says who came last
    fast, slow = slow_in("forward")
    fast["durations"], slow["durations"] = [], []
    rep = report(analyze([fast, slow])[0])
    assert rep.basis == "steps" and rep.compared == 4 and rep.straggler == 1
    assert "last in 100% of the steps where a rank waited" in rep.summary


def test_one_rank_and_no_steps():
    assert report(analyze([payload(durations=[1e-3])])[0]).summary == "one rank: nobody to wait for"
    rep = report(Totals.empty(2))
    assert rep.straggler is None and rep.summary.startswith("nothing to compare yet (0 steps")
    assert rep.ranks[0].step_ms == 0 and rep.ranks[0].last_share == 0


def test_totals_add_up_and_travel_as_json():
    fast, slow = slow_in("data")
    one, _ = analyze([fast, slow])
    two = one.merged(one)
    assert two.steps == [8, 8] and two.last == [0, 8] and two.compared == 24
    assert two.phases[1][0] == pytest.approx(2 * one.phases[1][0])
    back = Totals.from_json(json.loads(json.dumps(two.to_json())))
    assert back == two
    with pytest.raises(ValueError, match="expected the keys"):
        Totals.from_json({"steps": [1]})
    with pytest.raises(ValueError, match="figures of 3 ranks to those of 2"):
        one.merged(Totals.empty(3))


def test_the_whole_job_from_the_ranks_files(tmp_path):
    fast, slow = slow_in("data")
    periods, _ = analyze([fast, slow])
    for r, tail in enumerate((fast, slow)):  # each rank: the totals of the reports made, and what came after
        write_figures(str(tmp_path), r, {"rank": r, "world_size": 2, "backend": "tcp", "totals": periods.to_json(),
                                         "tail": tail})
    rep, why = final_report(str(tmp_path), 2)
    assert why == "" and rep.steps == 8 and rep.compared == 24 and rep.straggler == 1 and rep.backend == "tcp"
    assert final_report(str(tmp_path), 3) == (None, "rank 2 left no figures (it did not make a DistOpt, or it did "
                                                    "not end normally)")
    (tmp_path / "report.rank1.json").write_text("{")
    rep, why = final_report(str(tmp_path), 2)
    assert rep is None and why.startswith("the figures of rank 1 cannot be read")


def test_the_arrival_log():
    log = arrivals.ArrivalLog(capacity=3)
    assert log.timed(lambda: 5, inline=True)() == 5 and log.blocked > 0 and len(log.durations) == 1
    blocked = log.blocked
    log.timed(lambda: None, inline=False)()  # on the communication thread: nobody was blocked
    assert log.blocked == blocked
    for _ in range(3):
        log.add(1.0)
    assert log.snapshot() == (3, [1.0, 1.0, 1.0])  # 5 logged, the 2 oldest dropped
    log.taken(4)
    assert log.snapshot() == (5, [1.0])
    log.taken(100)
    assert log.snapshot() == (6, [])
    with log.pause():
        assert log.paused == 1
    assert log.paused == 0
    with pytest.raises(ValueError, match="capacity must be an int >= 1, got 0"):
        arrivals.ArrivalLog(0)


@pytest.fixture(scope="module")
def comm():
    c = dist.init(backend="tcp", timeout=30)
    yield c
    c.close()


def test_a_communicator_times_its_collectives_once_a_log_is_attached(comm):
    t = tensor.from_numpy(np.ones(4, np.float32))
    log = arrivals.attach(comm)
    assert arrivals.attach(comm) is log and comm.arrivals is log
    first, before = log.snapshot()
    comm.all_reduce(t)
    comm.all_reduce(t, async_op=True).wait()
    comm.broadcast(t)
    with log.pause():
        comm.all_gather_object(1)  # the report's own gather: not logged
    n, now = log.snapshot()
    assert n == first and len(now) == len(before) + 3 and all(d >= 0 for d in now)


def test_data_loading_is_counted_by_the_readers():
    x, y = np.zeros((10, 2), np.float32), np.zeros(10, np.int32)
    before = data.timing.seconds()
    batches = list(data.batches(x, y, np.arange(10), 4))
    assert len(batches) == 3 and data.timing.seconds() > before
    before = data.timing.seconds()
    assert list(data.timed(iter([1, 2]))) == [1, 2] and data.timing.seconds() > before
    before = data.timing.seconds()
    with data.loading():
        time.sleep(0.01)
    assert data.timing.seconds() - before >= 0.01


def _steps(sgd, n):
    rng = np.random.default_rng(0)
    lin = layer.Linear(3)
    x = tensor.from_numpy(rng.random((4, 5)).astype(np.float32))
    y = tensor.from_numpy(np.eye(3, dtype=np.float32)[[0, 1, 2, 0]])
    autograd.training = True
    for _ in range(n):
        with data.loading():
            time.sleep(0.002)
        sgd.backward_and_update(autograd.softmax_cross_entropy(lin(x), y))


def test_one_rank_distopt_steps_add_up(comm):
    sgd = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
    _steps(sgd, 5)
    rep = sgd.stats()
    assert rep.world_size == 1 and rep.steps == 4 and rep.straggler is None and rep.backend == "tcp"
    s = rep.ranks[0]
    assert s.steps == 4 and sum(s.phase_ms.values()) == pytest.approx(s.step_ms, rel=1e-9)
    assert s.phase_ms["data"] >= 2.0 and s.phase_ms["backward"] > 0 and s.phase_ms["update"] > 0
    _steps(sgd, 3)
    assert sgd.stats().steps == 7  # the whole run so far
    sgd.backward_and_partial_update(autograd.softmax_cross_entropy(layer.Linear(3)(tensor.from_numpy(
        np.ones((2, 5), np.float32))), tensor.from_numpy(np.eye(3, dtype=np.float32)[[0, 1]])))
    assert sgd.stats().steps == 8  # the partial and sparse modes are steps too


def test_report_every_n_steps_prints_on_rank_0(comm, capsys):
    sgd = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, report_every=2)
    atexit.unregister(sgd.reducer.stats.at_exit)  # its table of the whole run at exit: not this test's
    _steps(sgd, 5)
    err = capsys.readouterr().err
    assert err.count("singa_lite: straggler report: 1 rank, ") == 2, err  # at steps 2 and 4


def test_bad_arguments(comm, monkeypatch):
    with pytest.raises(RuntimeError, match="made with step_stats=False"):
        opt.DistOpt(opt.SGD(), communicator=comm, step_stats=False).stats()
    with pytest.raises(ValueError, match="report_every needs step_stats=True"):
        opt.DistOpt(opt.SGD(), communicator=comm, step_stats=False, report_every=3)
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="report_every must be None or a number of steps >= 1"):
            opt.DistOpt(opt.SGD(), communicator=comm, report_every=bad)
    with pytest.raises(TypeError, match="step_stats must be True or False"):
        opt.DistOpt(opt.SGD(), communicator=comm, step_stats=1)
    monkeypatch.setenv(straggler.REPORT_VAR, "often")
    with pytest.raises(ValueError, match="SINGA_LITE_REPORT must be a whole number of steps >= 1"):
        opt.DistOpt(opt.SGD(), communicator=comm)
    monkeypatch.setenv(straggler.REPORT_VAR, "25")
    assert opt.DistOpt(opt.SGD(), communicator=comm).reducer.stats.every == 25
    sgd = opt.DistOpt(opt.SGD(), communicator=comm)
    pending = None
    try:
        lin = layer.Linear(2)
        autograd.training = True
        pending = sgd.backward(autograd.softmax_cross_entropy(lin(tensor.from_numpy(np.ones((2, 3), np.float32))),
                                                              tensor.from_numpy(np.eye(2, dtype=np.float32))))
        with pytest.raises(RuntimeError, match=r"DistOpt.stats: the step of the previous backward\(\) is still open"):
            sgd.stats()
    finally:
        if pending is not None:
            pending.discard()


@pytest.mark.parametrize("argv,every", [(["--report", "s.py"], 100), (["--report", "7", "s.py"], 7),
                                        (["--report=5", "s.py", "--report"], 5), (["s.py", "--report"], None)])
def test_singa_run_report_takes_an_optional_n(argv, every):
    args = launch_args.parse_command_line(launch_args.build_parser(), ["-np", "2"] + argv)
    assert args.report == every and args.target == "s.py"
    if every is not None:
        args.report_dir, args.job_id, args.secret = "/tmp/x", "job", ""
        env = launch_args.rank_environment(args, 0, "holder", base={})
        assert env[straggler.REPORT_VAR] == str(every) and env[straggler.REPORT_DIR_VAR] == "/tmp/x"


def test_singa_run_refuses_report_0(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    args = launch_args.parse_command_line(launch_args.build_parser(), ["-np", "2", "--report", "0", str(script)])
    with pytest.raises(launch_args.UsageError, match="--report wants a number of steps >= 1 between two reports"):
        launch_args.check_args(args)


def test_the_timeline_marks_a_verdict_and_names_the_straggler(tmp_path):
    with timeline.timeline(str(tmp_path / "t.json"), rank=1) as rec:
        timeline.mark("straggler: rank 1", {"summary": "s"}, note="straggler: last in 90% of collectives")
        timeline.record("x", "update", time.perf_counter())
    with open(rec.path) as f:
        events = json.load(f)["traceEvents"]
    marks = [e for e in events if e["ph"] == "i"]
    assert len(marks) == 1 and marks[0]["name"] == "straggler: rank 1" and marks[0]["args"] == {"summary": "s"}
    names = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert names == ["rank 1 (straggler: last in 90% of collectives)"]
