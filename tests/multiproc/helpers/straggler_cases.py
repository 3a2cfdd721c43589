"""The straggler report's scenario, shared by tests/multiproc/test_straggler.py and jobs/straggler_job.py: a small
model trained with DistOpt where one rank is made slow on purpose, by SLEEP seconds a step in its data loading
(inside singa_lite's own reader, data.batches, as a slow disk would) or in its forward pass. SLEEP is large next to
a step of this model (about a millisecond), so the tests can ask who and which phase, never how much."""
import time

import numpy as np

SLEEP = 0.06
STEPS = 8


def train(comm=None, slow=-1, phase="data", steps=STEPS, report_every=None, hierarchical=False):
    """Trains `steps` steps (comm: a communicator, None: dist.init's); returns DistOpt.stats() as plain data, with
    its str() under "text"."""
    from singa_lite import autograd, data, layer, opt, tensor

    sgd = opt.DistOpt(opt.SGD(lr=0.01), communicator=comm, first_bucket=100, report_every=report_every,
                      hierarchical=hierarchical)
    rank = sgd.global_rank
    l1, act, l2 = layer.Linear(32), layer.ReLU(), layer.Linear(4)
    rng = np.random.default_rng(0)
    x_all = rng.random((64, 16)).astype(np.float32)
    y_all = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 64)]
    sampler = data.DistributedSampler(64, rank, sgd.world_size, seed=0)
    slow_data = rank == slow and phase == "data"

    class SlowArray(np.ndarray):
        """Indexing it takes SLEEP seconds: a reader that waits for its disk, inside data.batches."""

        def __getitem__(self, index):
            time.sleep(SLEEP)
            return np.asarray(self)[index]

    xs = x_all.view(SlowArray) if slow_data else x_all
    autograd.training = True
    done = 0
    while done < steps:
        for xb, yb in data.batches(xs, y_all, sampler, 8):
            out = l2(act(l1(tensor.from_numpy(np.ascontiguousarray(xb)))))
            if rank == slow and phase == "forward":
                time.sleep(SLEEP)
            sgd.backward_and_update(autograd.softmax_cross_entropy(out, tensor.from_numpy(yb)), threshold=300)
            done += 1
            if done == steps:
                break
    report = sgd.stats()
    return dict(report.to_dict(), text=str(report))


def check(reports: dict, slow: int, phase: str, steps: int = STEPS) -> None:
    """Every rank's report (rank -> StragglerReport.to_dict()) names `slow` and `phase`, agrees with the others,
    and adds up."""
    world = len(reports)
    first = reports[0]
    for r, rep in reports.items():
        assert {k: v for k, v in rep.items() if k != "text"} == {k: v for k, v in first.items() if k != "text"}, \
            f"rank {r}'s report differs from rank 0's:\n{rep['text']}\n{first['text']}"
    text = first["text"]
    assert first["straggler"] == slow, text
    assert first["ranks"][slow]["extra_phase"] == phase, text
    assert f"rank {slow} is the straggler" in first["summary"], text
    assert first["world_size"] == world and first["basis"] == "collectives", text
    assert first["steps"] == steps - 1, text  # the first step (the models compared) is left out
    assert 0 < first["contested"] <= first["compared"], text
    assert sum(s["last"] for s in first["ranks"]) == first["contested"], text
    for s in first["ranks"]:
        assert s["steps"] == steps - 1, text
        assert abs(sum(s["phase_ms"].values()) - s["step_ms"]) <= 1e-6 * s["step_ms"], text  # phases add up
        assert all(v >= 0 for v in s["phase_ms"].values()), text
        assert 0 <= s["last_share"] <= 1 and s["waited_ms"] >= 0 and s["caused_ms"] >= 0, text
