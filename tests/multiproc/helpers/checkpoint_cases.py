"""Checkpoint scenarios run on shm ranks started by multiprocessing (test_checkpoint_resume.py; spawned children
import this module). Each takes a Communicator and raises AssertionError when an expectation fails."""
from __future__ import annotations

import json
import os

import numpy as np

from singa_lite import checkpoint, opt, tensor


def scenario_another_jobs_checkpoint(comm, path):
    # Rank 0 decides whether a save may replace the checkpoint in `path` and every rank learns it: rank 1's
    # job id is never the owner's, so a rank-1 decision would refuse the saves that succeed here.
    W = {"W": tensor.from_numpy(np.full((4, 3), float(comm.rank), np.float32))}
    sgd = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)

    def as_job(job):
        os.environ["SINGA_LITE_JOB_ID"] = job if comm.rank == 0 else f"{job}-seen-by-rank-1"

    def owner():
        with open(os.path.join(path, checkpoint.MANIFEST)) as f:
            m = json.load(f)
        return m["job_id"], m["token"]

    as_job("job-A")
    checkpoint.save(path, W, sgd, extra={"by": "A"})
    checkpoint.save(path, W, sgd, extra={"by": "A"})  # the same job again
    before = owner()
    assert before[0] == "job-A", before

    as_job("job-B")  # another job, which did not load it: refused on every rank, nothing changed
    try:
        checkpoint.save(path, W, sgd, extra={"by": "B"})
    except checkpoint.CheckpointError as e:
        msg = str(e)
        assert "the previous checkpoint is unchanged: rank 0:" in msg, msg
        assert "job id 'job-A'; this job's: 'job-B'" in msg and "overwrite=True" in msg, msg
    else:
        raise AssertionError("a save over another job's checkpoint was not refused")
    assert owner() == before
    comm.barrier()

    checkpoint.save(path, W, sgd, extra={"by": "B"}, overwrite=True)
    assert owner()[0] == "job-B"

    as_job("job-C")  # a relaunch under a new id continues the run it loaded
    assert checkpoint.load(path, W, sgd) == {"by": "B"}
    checkpoint.save(path, W, sgd, extra={"by": "C"})
    assert owner()[0] == "job-C"
    return "ok"
