"""The timeline (singa_lite/timeline.py): a Chrome-trace JSON of a tiny model's training steps."""
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from singa_lite import autograd, device, engine, layer, opt, tensor, timeline
from singa_lite.model import Model


class _Tiny(Model):
    def __init__(self):
        super().__init__()
        self.l1 = layer.Linear(8)
        self.act = layer.ReLU()
        self.l2 = layer.Linear(2)

    def forward(self, x):
        return self.l2(self.act(self.l1(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss


def _data():
    rng = np.random.default_rng(0)
    x = tensor.from_numpy(rng.random((4, 5)).astype(np.float32))
    y = tensor.from_numpy(np.eye(2, dtype=np.float32)[[0, 1, 0, 1]])
    return x, y


def _model(x):
    m = _Tiny()
    m.set_optimizer(opt.SGD(lr=0.1))
    m.compile([x], is_train=True, use_graph=False)
    return m


def _load(path):
    with open(path) as f:
        doc = json.load(f)
    assert set(doc) >= {"traceEvents", "otherData"}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M"), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and e["dur"] >= 0 and isinstance(e["tid"], int), e
    return doc, [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _inside(inner, outer):
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def test_model_steps_ops_and_gaps(tmp_path):
    x, y = _data()
    m = _model(x)
    with timeline.timeline(str(tmp_path / "trace.json")) as rec:
        assert engine.op_hook() is rec  # recording takes the engine's one hook
        for _ in range(3):
            m(x, y)
    assert engine.op_hook() is None  # and gives it back: one global test per op when off
    assert rec.path == str(tmp_path / "trace.rank0.json")
    doc, evs = _load(rec.path)
    assert doc["otherData"]["steps"] == 3 and doc["otherData"]["dropped_events"] == 0
    steps = [e for e in evs if e["cat"] == "step"]
    gaps = [e for e in evs if e["cat"] == "gap"]
    assert [e["name"] for e in steps] == ["step 0", "step 1", "step 2"]
    assert len(gaps) == 2
    for i, gap in enumerate(gaps):  # the gap runs from one step's end to the next step's start
        end = steps[i]["ts"] + steps[i]["dur"]
        assert abs(gap["ts"] - end) < 1e-2 and abs(gap["ts"] + gap["dur"] - steps[i + 1]["ts"]) < 1e-2
    for step in steps:
        ops = [e for e in evs if e["cat"] in ("forward", "backward") and _inside(e, step)]
        fwd = [e for e in ops if e["cat"] == "forward"]
        bwd = [e for e in ops if e["cat"] == "backward"]
        types = [e["args"]["type"] for e in fwd]
        assert types == ["Matmul", "AddBias", "ReLU", "Matmul", "AddBias", "SoftMaxCrossEntropy"], types
        assert all(e["dur"] > 0 for e in ops)
        # backward visits the same op instances in reverse, after the last forward
        assert [e["name"] for e in bwd] == [e["name"] for e in reversed(fwd)]
        assert bwd[0]["ts"] >= fwd[-1]["ts"] + fwd[-1]["dur"]
        for a, b in zip(ops, ops[1:]):  # ops on the training thread do not overlap
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    # the ops outside every step: none (each step starts with its first op)
    loose = [e for e in evs if e["cat"] in ("forward", "backward") and not any(_inside(e, s) for s in steps)]
    assert loose == []


def test_off_records_nothing_and_hook_is_none(tmp_path):
    assert not timeline.is_active() and engine.op_hook() is None
    assert timeline.stop() is None
    x, y = _data()
    _model(x)(x, y)
    assert list(tmp_path.iterdir()) == []


def test_profiler_and_timeline_together(tmp_path):
    """The device's time profiler and the timeline share the hook: both see every op."""
    x, y = _data()
    m = _model(x)
    dev = device.get_default_device()
    dev.SetVerbosity(1)
    try:
        with timeline.timeline(str(tmp_path / "t.json")) as rec:
            for _ in range(7):
                m(x, y)
            assert rec.inner is not None
        assert engine.op_hook() is not None and engine.op_hook() is not rec  # the profiler keeps its hook
        profiled = sum(calls for _, calls in dev._profile.forward.values())
    finally:
        dev.SetVerbosity(0)
    assert engine.op_hook() is None
    _, evs = _load(rec.path)
    assert len([e for e in evs if e["cat"] == "forward"]) == 7 * 6
    assert profiled > 0


def test_event_cap_warns_once_and_counts(tmp_path):
    x, y = _data()
    m = _model(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with timeline.timeline(str(tmp_path / "cap.json"), max_events=10) as rec:
            for _ in range(3):
                m(x, y)
    msgs = [str(w.message) for w in caught if "timeline" in str(w.message)]
    assert len(msgs) == 1 and "10 events" in msgs[0]
    doc, evs = _load(rec.path)
    assert len(evs) == 10 and doc["otherData"]["dropped_events"] > 0


def test_paths_and_bad_arguments(tmp_path):
    assert timeline.rank_path("a/trace.json", 3) == "a/trace.rank3.json"
    assert timeline.rank_path("a/trace", 1) == "a/trace.rank1.json"
    assert timeline.rank_path(str(tmp_path), 2) == str(tmp_path / "timeline.rank2.json")
    assert timeline.rank_path("newdir/", 0) == os.path.join("newdir", "timeline.rank0.json")
    with pytest.raises(TypeError, match="path"):
        timeline.start(None)
    with pytest.raises(ValueError, match="max_events"):
        timeline.start(str(tmp_path / "x.json"), max_events=0)
    with pytest.raises(ValueError, match="rank"):
        timeline.start(str(tmp_path / "x.json"), rank=-1)
    timeline.start(str(tmp_path / "x.json"), rank=5)
    try:
        with pytest.raises(RuntimeError, match="already recording"):
            timeline.start(str(tmp_path / "y.json"))
    finally:
        assert timeline.stop() == str(tmp_path / "x.rank5.json")
    assert os.listdir(tmp_path) == ["x.rank5.json"]  # no temporary file left


def test_environment_variable_writes_at_exit(tmp_path):
    """SINGA_LITE_TIMELINE=path records a whole script and writes the file at exit, atomically."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys; sys.path.insert(0, %r)\n"
        "from test_timeline import _data, _model\n"
        "x, y = _data(); m = _model(x)\n"
        "for _ in range(2): m(x, y)\n" % os.path.dirname(__file__))
    env = dict(os.environ, SINGA_LITE_TIMELINE=str(tmp_path / "out") + os.sep, RANK="1")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "out" / "timeline.rank1.json"
    assert f"wrote {path}" in r.stderr
    doc, evs = _load(path)
    assert doc["otherData"]["rank"] == 1 and all(e["pid"] == 1 for e in evs)
    assert [e["name"] for e in evs if e["cat"] == "step"] == ["step 0", "step 1"]
    assert sorted(os.listdir(tmp_path / "out")) == ["timeline.rank1.json"]  # no temporary file left


def test_plot_tool_draws_a_step(tmp_path):
    """tools/plot_timeline.py (docs/benchmarks.md's picture) reads a trace and writes a PNG of one step."""
    pytest.importorskip("matplotlib")
    x, y = _data()
    m = _model(x)
    with timeline.timeline(str(tmp_path / "t.json"), rank=0) as rec:
        for _ in range(3):
            m(x, y)
    tool = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "plot_timeline.py")
    png = tmp_path / "step.png"
    r = subprocess.run([sys.executable, tool, rec.path, "--step", "1", "-o", str(png)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = subprocess.run([sys.executable, tool, rec.path, "--step", "7", "-o", str(png)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "no step 7" in r.stderr and "0..2" in r.stderr


def test_bad_max_events_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(timeline.MAX_EVENTS_VAR, "lots")
    with pytest.raises(ValueError, match="SINGA_LITE_TIMELINE_MAX_EVENTS"):
        timeline.start(str(tmp_path / "t.json"))
    assert not timeline.is_active()


def test_a_process_that_recorded_nothing_writes_no_file(tmp_path):
    """The parent of multiprocessing ranks inherits SINGA_LITE_TIMELINE but runs no op: at exit it must not
    write an empty file under rank 0's name (it would replace the real rank 0's)."""
    out = tmp_path / "trace.json"
    (tmp_path / "trace.rank0.json").write_text("rank 0's")
    env = dict(os.environ, SINGA_LITE_TIMELINE=str(out))
    env.pop("RANK", None)
    r = subprocess.run([sys.executable, "-c", "import singa_lite"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "nothing recorded" in r.stderr
    assert (tmp_path / "trace.rank0.json").read_text() == "rank 0's"


# Names a writer could have used for its temporary file (the old one was f"{path}.tmp{pid}"), each planted as a
# symbolic link to a file the writer must never touch.
_PLANTED = ("{path}.tmp{pid}", "{path}.tmp", "{path}.tmp0", "{path}~", "{path}.part", "{path}.new", "{dir}/.{base}.tmp")


def _plant(target, victim) -> list:
    names = []
    for form in _PLANTED:
        name = form.format(path=target, pid=os.getpid(), dir=os.path.dirname(target), base=os.path.basename(target))
        os.symlink(victim, name)
        names.append(name)
    return names


@pytest.mark.parametrize("writer", ["stop", "merge"])
def test_the_file_is_written_through_a_private_temporary_file(tmp_path, monkeypatch, writer):
    """A symbolic link planted where a predictable temporary name would be is not followed: the writer creates
    its temporary file itself (O_CREAT | O_EXCL, mode 0600, in the target's directory), and leaves nothing
    behind but the file."""
    victim = tmp_path / "victim"
    victim.write_text("not yours")
    out = tmp_path / "out"
    out.mkdir()
    if writer == "stop":
        target = str(out / "t.rank0.json")
    else:
        target = str(out / "timeline.json")
        ranks = []
        for r in range(2):
            with timeline.timeline(str(tmp_path / "ranks" / "t.json"), rank=r) as rec:
                timeline.record("op", "forward", time.perf_counter())
            ranks.append(rec.path)
    planted = _plant(target, str(victim))
    created, real_open = [], os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        if os.path.dirname(os.path.abspath(path)) == str(out):
            created.append((os.path.basename(path), flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    if writer == "stop":
        timeline.start(str(out / "t.json"), rank=0)
        timeline.record("op", "forward", time.perf_counter())
        assert timeline.stop() == target
    else:
        assert timeline.merge(ranks, target) == target
    monkeypatch.undo()

    assert victim.read_text() == "not yours"
    for name in planted:
        assert os.readlink(name) == str(victim), name
    assert created, "the temporary file was not created through os.open (O_EXCL)"
    for name, flags, mode in created:
        assert flags & os.O_CREAT and flags & os.O_EXCL and mode == 0o600, (name, oct(flags), oct(mode))
    assert sorted(os.listdir(out)) == sorted(os.path.basename(n) for n in planted + [target])
    assert os.stat(target).st_mode & 0o777 == 0o600
    _, evs = _load(target)
    assert len(evs) == (1 if writer == "stop" else 2)


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    """Whatever fails while the file is written (a value JSON cannot encode; the rename, here onto a directory)
    removes the temporary file; the file that was there is untouched."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "t.rank0.json").write_text("the previous trace")
    timeline.start(str(out / "t.json"), rank=0)
    timeline.record("op", "forward", time.perf_counter(), {"value": object()})
    with pytest.raises(TypeError, match="not JSON serializable"):
        timeline.stop()
    assert not timeline.is_active()
    assert os.listdir(out) == ["t.rank0.json"] and (out / "t.rank0.json").read_text() == "the previous trace"

    (out / "d.json").mkdir()
    with pytest.raises(OSError):
        timeline.merge([], str(out / "d.json"))
    assert sorted(os.listdir(out)) == ["d.json", "t.rank0.json"] and os.listdir(out / "d.json") == []
