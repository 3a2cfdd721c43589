"""Whose checkpoint it is (singa_lite/checkpoint/, "Whose checkpoint it is"): the manifest records the saving
job's id (comm.auth.job_id()), and a save over another job's checkpoint is refused unless overwrite=True or
this process loaded that checkpoint. In one process; tests/multiproc/test_checkpoint_resume.py has the same on
2 ranks."""
import json
import os

import numpy as np
import pytest

from singa_lite import checkpoint, tensor
from singa_lite.checkpoint import CheckpointError

ID_VARS = ("SINGA_LITE_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID")


@pytest.fixture(autouse=True)
def no_job(monkeypatch):
    """No job id from the environment the tests run in, and no checkpoint loaded by this process yet."""
    for name in ID_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checkpoint, "_loaded_owners", {})


@pytest.fixture
def as_job(monkeypatch):
    def become(job):
        if job:
            monkeypatch.setenv("SINGA_LITE_JOB_ID", job)
        else:
            monkeypatch.delenv("SINGA_LITE_JOB_ID", raising=False)
    return become


def model(value=0.0):
    return {"W": tensor.from_numpy(np.full((3, 2), value, np.float32))}


def manifest(path):
    with open(os.path.join(path, checkpoint.MANIFEST)) as f:
        return json.load(f)


def snapshot(path):
    """Every file of the directory with its bytes: what a refused save must leave as it was."""
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


def test_the_manifest_records_the_job_and_the_same_job_saves_again(tmp_path, as_job):
    path = str(tmp_path / "ck")
    as_job("job-A")
    checkpoint.save(path, model(1), extra={"n": 1})
    assert manifest(path)["job_id"] == "job-A"
    checkpoint.save(path, model(2), extra={"n": 2})  # the same job, no load needed
    assert manifest(path)["job_id"] == "job-A" and checkpoint.load(path, model()) == {"n": 2}


def test_jobs_without_an_id_save_over_each_other_as_before(tmp_path):
    path = str(tmp_path / "ck")
    checkpoint.save(path, model(1), extra={"n": 1})
    assert manifest(path)["job_id"] == ""
    checkpoint.save(path, model(2), extra={"n": 2})  # a restart that cannot be told apart from the first run
    assert checkpoint.load(path, model()) == {"n": 2}


@pytest.mark.parametrize("owner,saver", [("job-A", "job-B"), ("", "job-B"), ("job-A", "")])
def test_a_save_over_another_jobs_checkpoint_is_refused_and_changes_nothing(tmp_path, as_job, owner, saver):
    path = str(tmp_path / "ck")
    as_job(owner)
    checkpoint.save(path, model(1), extra={"by": owner})
    before = snapshot(path)
    as_job(saver)
    with pytest.raises(CheckpointError) as e:
        checkpoint.save(path, model(2), extra={"by": saver})
    msg = str(e.value)
    assert f"{path} holds the checkpoint of another job" in msg, msg
    for job in (owner, saver):  # both named; a missing id said as such
        assert (repr(job) if job else "none (no SINGA_LITE_JOB_ID, torchrun run id or Slurm job id)") in msg, msg
    assert "load it first" in msg and "overwrite=True" in msg and "another directory" in msg, msg
    assert snapshot(path) == before, "a refused save changed the directory"
    assert checkpoint.load(path, model()) == {"by": owner}


def test_overwrite_replaces_another_jobs_checkpoint(tmp_path, as_job):
    path = str(tmp_path / "ck")
    as_job("job-A")
    checkpoint.save(path, model(1), extra={"by": "A"})
    old = set(os.listdir(path))
    as_job("job-B")
    checkpoint.save(path, model(2), extra={"by": "B"}, overwrite=True)
    assert manifest(path)["job_id"] == "job-B" and checkpoint.load(path, model()) == {"by": "B"}
    assert not old & set(os.listdir(path)) - {checkpoint.MANIFEST}, "job A's files are left"
    checkpoint.save(path, model(3), extra={"by": "B again"})  # job B's own now
    with pytest.raises(CheckpointError, match="overwrite must be True or False, got 'yes'"):
        checkpoint.save(path, model(3), overwrite="yes")


def test_a_job_that_loaded_the_checkpoint_continues_its_run_under_a_new_id(tmp_path, as_job):
    # A run relaunched with a fresh id (a new singa-run, torchrun --standalone): load, then save as before.
    path = str(tmp_path / "ck")
    as_job("first-launch")
    checkpoint.save(path, model(1), extra={"step": 100})
    as_job("second-launch")
    W = model()
    assert checkpoint.load(path, W) == {"step": 100}
    checkpoint.save(path, W, extra={"step": 200})
    assert manifest(path)["job_id"] == "second-launch"
    checkpoint.save(path, W, extra={"step": 300})
    # a third job that did not load it may not replace it; the message names the job that saved last
    as_job("third")
    with pytest.raises(CheckpointError, match="job id 'second-launch'; this job's: 'third'"):
        checkpoint.save(path, W, extra={"step": 0})


def test_a_load_allows_saves_into_that_directory_while_it_holds_what_was_loaded(tmp_path, as_job):
    mine, theirs = str(tmp_path / "mine"), str(tmp_path / "theirs")
    as_job("A")
    checkpoint.save(mine, model(1), extra={"by": "A"})
    checkpoint.save(theirs, model(1), extra={"by": "A"})
    as_job("B")
    checkpoint.load(mine, model())
    with pytest.raises(CheckpointError, match="job id 'A'; this job's: 'B'"):
        checkpoint.save(theirs, model(2))  # loading one directory says nothing about another
    checkpoint.load(theirs, model())
    as_job("C")  # meanwhile another job takes the directory over
    checkpoint.save(theirs, model(3), extra={"by": "C"}, overwrite=True)
    as_job("B")
    with pytest.raises(CheckpointError, match="job id 'C'; this job's: 'B'"):
        checkpoint.save(theirs, model(4))  # B loaded A's checkpoint, not C's
    assert checkpoint.load(theirs, model()) == {"by": "C"}


def without_job_id(path):
    """The manifest as an older singa_lite wrote it: no job_id."""
    m = manifest(path)
    del m["job_id"]
    checkpoint.atomic_write(os.path.join(path, checkpoint.MANIFEST), json.dumps(m).encode())


def test_an_older_manifest_without_a_job_id_counts_as_no_id(tmp_path, as_job):
    path = str(tmp_path / "ck")
    checkpoint.save(path, model(1), extra={"n": 1})
    without_job_id(path)
    checkpoint.save(path, model(2), extra={"n": 2})  # no id over no id
    without_job_id(path)
    as_job("job-B")
    with pytest.raises(CheckpointError, match="job id none .*; this job's: 'job-B'"):
        checkpoint.save(path, model(3))
    assert checkpoint.load(path, model()) == {"n": 2}


def test_an_unreadable_manifest_may_be_replaced_by_any_job(tmp_path, as_job):
    path = str(tmp_path / "ck")
    as_job("A")
    checkpoint.save(path, model(1))
    with open(os.path.join(path, checkpoint.MANIFEST), "w") as f:
        f.write("{ not json")
    with pytest.raises(CheckpointError):
        checkpoint.load(path, model())  # nothing can be loaded from it ...
    as_job("B")
    checkpoint.save(path, model(2), extra={"by": "B"})  # ... so replacing it loses nothing
    assert checkpoint.load(path, model()) == {"by": "B"}


def test_the_id_is_the_launchers_when_singa_lite_has_none(tmp_path, monkeypatch):
    # Slurm: job and step (a requeued job keeps both; another step of the same job is another job)
    path = str(tmp_path / "ck")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    checkpoint.save(path, model(1))
    assert manifest(path)["job_id"] == "77.0"
    checkpoint.save(path, model(2))
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    with pytest.raises(CheckpointError, match="job id '77.0'; this job's: '77.1'"):
        checkpoint.save(path, model(3))
    monkeypatch.setenv("SINGA_LITE_JOB_ID", "x" * 200)  # a bad id is said, not saved under
    with pytest.raises(CheckpointError, match="SINGA_LITE_JOB_ID must be at most 128 printable ASCII"):
        checkpoint.save(path, model(3))
