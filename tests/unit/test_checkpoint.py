"""singa_lite.checkpoint in one process: what is restored (model and batch-norm statistics, optimizer and
schedule position, sampler position, generators), atomic saves (a process killed in the middle of one),
and every way a checkpoint can be bad (each a CheckpointError naming the file, with nothing changed)."""
import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from singa_lite import _core, autograd, checkpoint, device, layer, model, opt, tensor  # noqa: F401 (autograd first: see layer.py)
from singa_lite.checkpoint import CheckpointError
from singa_lite.data import DistributedSampler, batches

CPU = device.create_cpu_device()


class Net(model.Model):
    def __init__(self, channels=3):
        super().__init__()
        self.conv = layer.Conv2d(channels, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.flat = layer.Flatten()
        self.fc = layer.Linear(2)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flat(layer.Dropout(0.3)(self.bn(self.conv(x)))))

    def train_one_batch(self, x, y):
        loss = self.loss(self.forward(x), y)
        self.optimizer(loss)
        return loss


X = np.random.default_rng(0).standard_normal((12, 1, 4, 4)).astype(np.float32)
Y = (np.arange(12) % 2).astype(np.int32)


def setup(channels=3):
    net = Net(channels)
    sgd = opt.SGD(lr=opt.StepDecay(0.1, step_size=2, gamma=0.5), momentum=0.9)
    net.set_optimizer(sgd)
    net.compile([tensor.Tensor((3, 1, 4, 4))], is_train=True)
    return net, sgd, DistributedSampler(12, 0, 1, seed=1)


def train(net, it, steps):
    """`steps` steps on the batches of iterator `it` (one pass of the sampler, continued across calls)."""
    for _ in range(steps):
        xb, yb = next(it)
        net(tensor.from_numpy(xb), tensor.from_numpy(yb))


def snapshot(net, sgd):
    return {**{k: tensor.to_numpy(v).copy() for k, v in net.get_states().items()},
            **{f"m/{k}": tensor.to_numpy(v).copy() for k, v in sgd.moments.items()},
            "step": sgd.step_counter}


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


@pytest.fixture
def saved(tmp_path):
    """A checkpoint after 2 steps, the objects that wrote it and their pass over the data."""
    net, sgd, sampler = setup()
    it = batches(X, Y, sampler, 3)
    train(net, it, 2)
    path = str(tmp_path / "ckpt")
    checkpoint.save(path, net, sgd, sampler, extra={"step": 2, "note": "hi", "a": np.arange(3)})
    return path, net, sgd, sampler, it


def files(path):
    return sorted(os.listdir(path))


def test_resume_continues_exactly(saved):
    path, net, sgd, sampler, it = saved
    rng = CPU.get_rng_state()
    train(net, it, 2)  # steps 3 and 4: the schedule halves the learning rate after step 2
    want = snapshot(net, sgd)
    net2, sgd2, sampler2 = setup()
    CPU.SetRandSeed(12345)
    extra = checkpoint.load(path, net2, sgd2, sampler2)
    assert extra["step"] == 2 and extra["note"] == "hi" and np.array_equal(extra["a"], np.arange(3))
    assert (sgd2.step_counter, sgd2.lr_value) == (2, 0.05) and CPU.get_rng_state() == rng
    assert (sampler2.epoch, sampler2.position, len(sampler2)) == (0, 6, 6)
    train(net2, batches(X, Y, sampler2, 3), 2)
    same(snapshot(net2, sgd2), want)


def test_files_are_owner_only_and_a_new_save_replaces_the_old(saved):
    path, net, sgd, sampler, it = saved
    before = files(path)
    assert before[0] == "manifest.json" and len(before) == 3
    assert all(os.stat(os.path.join(path, f)).st_mode & 0o777 == 0o600 for f in before)
    train(net, it, 1)
    checkpoint.save(path, net, sgd, sampler)
    after = files(path)
    assert len(after) == 3 and not set(after[1:]) & set(before[1:])  # the older save's files are gone
    assert checkpoint.load(path, *setup()) is None


def test_a_numpy_generator_and_the_generator_state_api():
    CPU.SetRandSeed(5)
    first = tensor.Tensor((4,)).gaussian()
    state = CPU.get_rng_state()
    assert state[0] == 5 and state[1] > 0
    a = tensor.to_numpy(tensor.Tensor((6,)).gaussian())
    CPU.set_rng_state(state)
    assert np.array_equal(tensor.to_numpy(tensor.Tensor((6,)).gaussian()), a)
    assert first is not None
    with pytest.raises(ValueError, match="counter must be in"):
        CPU.set_rng_state((1, -1))
    with pytest.raises(TypeError, match="two ints"):
        CPU.set_rng_state(None)
    if _core.cuda_device_count() == 0:
        with pytest.raises(ValueError, match="cuda:0 does not exist here"):
            _core.set_generator_state(_core.Device("cuda:0"), 1, 2)


def test_numpy_rng_is_saved_and_restored(tmp_path):
    net, sgd, sampler = setup()
    rng = np.random.default_rng(3)
    rng.normal(size=5)
    checkpoint.save(str(tmp_path / "c"), net, sgd, rng=rng)
    want = rng.normal(size=4)
    rng2 = np.random.default_rng(99)
    checkpoint.load(str(tmp_path / "c"), rng=rng2)
    assert np.array_equal(rng2.normal(size=4), want)
    with pytest.raises(CheckpointError, match="MT19937"):
        checkpoint.load(str(tmp_path / "c"), rng=np.random.Generator(np.random.MT19937(1)))


# ---------------------------------------------------------------- atomicity
KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    from test_checkpoint import X, Y, batches, setup, train
    from singa_lite import checkpoint
    net, sgd, sampler = setup()
    train(net, batches(X, Y, sampler, 3), 4)
    calls, real = [0], os.fsync
    def fsync(fd):  # dies at the k-th fsync of the save: files written, not yet renamed or committed
        calls[0] += 1
        if calls[0] == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)
        real(fd)
    checkpoint.os.fsync = fsync
    checkpoint.save(sys.argv[1], net, sgd, sampler, extra={"step": 4})
""")


@pytest.mark.parametrize("kill_at", [1, 3, 5])  # the shared file, the rank file, the manifest
def test_a_process_killed_while_saving_leaves_the_previous_checkpoint(saved, kill_at):
    path, net, sgd, _, _ = saved
    proc = subprocess.run([sys.executable, "-c", KILLER, path, str(kill_at), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    left = files(path)
    assert any(f.endswith(".tmp") for f in left), left  # the interrupted file is there, and ignored
    net2, sgd2, sampler2 = setup()
    assert checkpoint.load(path, net2, sgd2, sampler2)["step"] == 2
    same(snapshot(net2, sgd2), snapshot(net, sgd))
    checkpoint.save(path, net2, sgd2, sampler2)  # the next save clears what the killed one left
    assert len(files(path)) == 3 and not any(f.endswith(".tmp") for f in files(path))


# ---------------------------------------------------------------- bad checkpoints
def rewrite_manifest(path, **changes):
    mpath = os.path.join(path, "manifest.json")
    with open(mpath) as f:
        m = json.load(f)
    m.update(changes)
    with open(mpath, "w") as f:
        json.dump(m, f)
    return m


def shared_file(path):
    return os.path.join(path, json.load(open(os.path.join(path, "manifest.json")))["shared"]["name"])


def refuse(path, match, *objects):
    """load raises CheckpointError matching `match`, and the objects are as they were."""
    net, sgd, sampler = objects or setup()
    before = snapshot(net, sgd), (sampler.epoch, sampler.position), CPU.get_rng_state()
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load(path, net, sgd, sampler)
    same(before[0], snapshot(net, sgd))
    assert before[1:] == ((sampler.epoch, sampler.position), CPU.get_rng_state())


def test_truncated_files(saved):
    path = saved[0]
    shared = shared_file(path)
    with open(shared, "r+b") as f:
        f.truncate(os.path.getsize(shared) // 2)
    refuse(path, rf"{shared}: \d+ bytes, the manifest says \d+: truncated")
    mpath = os.path.join(path, "manifest.json")
    with open(mpath, "r+b") as f:
        f.truncate(20)
    refuse(path, "manifest.json: not valid JSON")


def test_a_flipped_byte(saved):
    path = saved[0]
    shared = shared_file(path)
    data = bytearray(open(shared, "rb").read())
    i = data.index(b"\x93NUMPY") + 200  # inside the first array's values
    data[i] ^= 0x40
    with open(shared, "wb") as f:
        f.write(data)
    refuse(path, f"{shared}: SHA-256 differs")
    # with a manifest that agrees, the zip's CRC-32 still catches it
    import hashlib
    m = json.load(open(os.path.join(path, "manifest.json")))
    m["shared"]["sha256"] = hashlib.sha256(data).hexdigest()
    rewrite_manifest(path, shared=m["shared"])
    refuse(path, f"{shared}: entry 'arrays/0.npy' is corrupt .*CRC")


class Payload:
    marker = ""

    def __reduce__(self):  # unpickling would create the marker file
        return (open, (self.marker, "w"))


def test_a_pickled_object_array_is_refused_without_running_it(saved, tmp_path):
    import hashlib
    path = saved[0]
    shared = shared_file(path)
    Payload.marker = str(tmp_path / "pwned")
    evil = np.empty(1, dtype=object)
    evil[0] = Payload()
    src = zipfile.ZipFile(shared)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as dst:
        for name in src.namelist():
            if name == "arrays/0.npy":
                with dst.open(name, "w") as f:
                    np.lib.format.write_array(f, evil, allow_pickle=True)
            else:
                dst.writestr(name, src.read(name))
    src.close()
    data = buf.getvalue()
    with open(shared, "wb") as f:
        f.write(data)
    m = json.load(open(os.path.join(path, "manifest.json")))
    m["shared"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    rewrite_manifest(path, shared=m["shared"])
    refuse(path, f"{shared}: entry 'arrays/0.npy' "
                 "(holds dtype object; only numeric arrays are read|declares .* refused unread)")
    assert not os.path.exists(Payload.marker)


def test_object_arrays_are_refused_on_save(saved):
    path, net, sgd, sampler, _ = saved
    before = files(path)
    with pytest.raises(CheckpointError, match=r"save: extra\['bad'\] is an array of dtype object"):
        checkpoint.save(path, net, sgd, sampler, extra={"bad": np.array([None])})
    assert files(path) == before


def test_wrong_world_size_version_and_magic(saved):
    path = saved[0]
    rewrite_manifest(path, world_size=2)
    refuse(path, r"saved by 2 rank\(s\), loaded by 1; resume with 2 ranks, or pass reshard=True")
    rewrite_manifest(path, world_size=1, format_version=99)
    refuse(path, f"format version 99; this singa_lite reads versions 1 to {checkpoint.FORMAT_VERSION}")
    rewrite_manifest(path, format_version=1, magic="zip")
    refuse(path, "not a singa_lite checkpoint")


def test_a_missing_shard_or_manifest(saved):
    path = saved[0]
    m = json.load(open(os.path.join(path, "manifest.json")))
    rank_file = os.path.join(path, m["ranks"][0]["name"])
    os.remove(rank_file)
    refuse(path, f"{rank_file}: missing \\(rank 0's file")
    os.remove(os.path.join(path, "manifest.json"))
    refuse(path, "holds no complete checkpoint")
    refuse(str(path) + "-nowhere", "no such checkpoint directory")


def test_files_of_two_saves_mixed(saved, tmp_path):
    path, net, sgd, sampler, _ = saved
    other = str(tmp_path / "other")
    checkpoint.save(other, net, sgd, sampler)
    m, o = (json.load(open(os.path.join(p, "manifest.json"))) for p in (path, other))
    os.replace(os.path.join(other, o["ranks"][0]["name"]), os.path.join(path, m["ranks"][0]["name"]))
    rank_file = os.path.join(path, m["ranks"][0]["name"])
    refuse(path, f"{rank_file}: (SHA-256 differs|\\d+ bytes)")
    m["ranks"][0].update(size=o["ranks"][0]["size"], sha256=o["ranks"][0]["sha256"])
    rewrite_manifest(path, ranks=m["ranks"])
    refuse(path, f"{rank_file}: token is .* mixes files of different saves")


def test_another_model_or_sampler(saved):
    path = saved[0]
    refuse(path, r"model state 'conv.W' is float32 \(3, 1, 3, 3\) in the checkpoint, float32 \(4, 1, 3, 3\)",
           *setup(channels=4))
    net, sgd, _ = setup()
    refuse(path, "the state has seed=1, this sampler 2", net, sgd, DistributedSampler(12, 0, 1, seed=2))
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        checkpoint.load(shared_file(path), net)


def test_model_save_states_is_atomic_and_owner_only(tmp_path):
    net, _, _ = setup()
    f = str(tmp_path / "m.zip")
    net.save_states(f, aux_states={"epoch": 3})
    assert os.stat(f).st_mode & 0o777 == 0o600 and os.listdir(tmp_path) == ["m.zip"]
    assert int(tensor.to_numpy(setup()[0].load_states(f)["epoch"])) == 3


# ---------------------------------------------------------------- the sampler's position
def test_sampler_position_and_resume_mid_epoch():
    s = DistributedSampler(10, 1, 2, seed=4)
    s.set_epoch(3)
    whole = s.indices().tolist()
    it = batches(np.arange(10), np.arange(10), s, 2)
    assert next(it)[0].tolist() == whole[:2] and s.position == 2  # counted as the batch is handed out
    state = s.state_dict()
    assert (state["epoch"], state["position"]) == (3, 2)
    t = DistributedSampler(10, 1, 2, seed=4)
    t.load_state_dict(state)
    t.set_epoch(3)  # the usual loop: the same epoch keeps the resumed start
    assert len(t) == 3 and list(t) == whole[2:] and t.position == 5
    assert list(t) == whole and len(t) == 5  # the start is used once: the next pass is whole
    t.set_epoch(3, position=4)
    assert [x.tolist() for x, _ in batches(np.arange(10), np.arange(10), t, 2)] == [whole[4:]]
    t.set_epoch(4, position=1)
    t.set_epoch(5)  # another epoch: from its start
    assert len(t) == 5 and t.position == 0
    with pytest.raises(ValueError, match=r"position must be in \[0, 5\]"):
        t.set_epoch(5, position=6)
    with pytest.raises(ValueError, match="seed=4, this sampler 0"):
        DistributedSampler(10, 0, 2).load_state_dict(state)


def test_sampler_state_resharded_to_another_world_size():
    old = DistributedSampler(40, 1, 2, seed=3)
    old.set_epoch(1, position=8)  # 8 of 20 done
    state = old.state_dict()
    for world, position in ((1, 16), (3, 6), (4, 4), (2, 8)):  # the same fraction of the new share
        new = DistributedSampler(40, 0, world, seed=3)
        s = new.resharded_state(state)
        assert (s["epoch"], s["position"], s["world_size"]) == (1, position, world)
        new.load_state_dict(s)
        assert new.epoch == 1 and len(new) == -(-40 // world) - position
    done = {**state, "position": 20}  # an epoch finished: the new share is finished too
    assert DistributedSampler(40, 2, 3, seed=3).resharded_state(done)["position"] == 14
    with pytest.raises(ValueError, match="seed=3, this sampler 4"):
        DistributedSampler(40, 0, 3, seed=4).resharded_state(state)
    with pytest.raises(ValueError, match=r"position must be in \[0, 20\]"):
        DistributedSampler(40, 0, 3, seed=3).resharded_state({**state, "position": 21})
