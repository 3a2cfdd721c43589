"""singa_lite.layer and singa_lite.model: names, lazy parameters, both SINGA spellings, modes, checkpoints."""
import json
import zipfile

import numpy as np
import pytest

from singa_lite import autograd, device, layer, model, opt, tensor


class MLP(model.Model):
    def __init__(self, hidden=16, classes=3):
        super().__init__()
        self.fc1 = layer.Linear(hidden)          # in_features inferred on the first call
        self.act = layer.ReLU()
        self.fc2 = layer.Linear(classes)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def data(n=64, dim=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, dim)) * 4
    y = rng.integers(0, classes, n)
    return (tensor.from_numpy((centers[y] + rng.standard_normal((n, dim))).astype(np.float32)),
            tensor.from_numpy(y.astype(np.int32)))


@pytest.fixture(autouse=True)
def reset_mode():
    device.get_default_device().SetRandSeed(0)
    yield
    autograd.training = False


def test_lazy_parameters_and_compile():
    m = MLP()
    assert m.get_params() == {}
    tx, _ = data()
    m.compile([tx], is_train=True)
    params = m.get_params()
    assert {k: v.shape for k, v in params.items()} == {"fc1.W": (6, 16), "fc1.b": (16,), "fc2.W": (16, 3),
                                                        "fc2.b": (3,)}
    assert all(p.name == k for k, p in params.items()), "one name per parameter: its attribute path"
    assert m.training and autograd.training


def test_standalone_layers_get_unique_names_and_nesting_renames():
    a, b = layer.Linear(2, 3), layer.Linear(2, 3)
    assert a.W.name != b.W.name and a.W.name.endswith(".W")

    class Block(layer.Layer):
        def __init__(self):
            super().__init__()
            self.inner = layer.Linear(2, 2)

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.head = layer.Linear(2, 1)

    net = Net()
    assert sorted(p.name for p in net.get_params().values()) == ["block.inner.W", "block.inner.b", "head.W",
                                                                  "head.b"]
    assert sorted(net.get_params()) == sorted(p.name for p in net.get_params().values())


def test_both_spellings_are_one_implementation():
    assert autograd.Linear is layer.Linear and autograd.Conv2d is layer.Conv2d
    assert autograd.MaxPool2d is layer.MaxPool2d and autograd.BatchNorm2d is layer.BatchNorm2d
    eager = autograd.Conv2d(1, 20, 5, padding=0)       # SINGA autograd: in, out, kernel
    assert eager.W.shape == (20, 1, 5, 5) and eager.b.shape == (20,)
    lazy = layer.Conv2d(20, 5)                          # SINGA layer: out, kernel; in from the input
    assert lazy.get_params() == {}
    assert layer.Linear(800, 500).W.shape == (800, 500)
    bn = layer.BatchNorm2d(8)
    assert set(bn.get_states()) == {"scale", "bias", "running_mean", "running_var"}
    assert set(bn.get_params()) == {"scale", "bias"}
    with pytest.raises(ValueError, match="group"):
        layer.Conv2d(3, 10, 3, group=4)


def test_set_states_checks_everything_before_writing():
    m = MLP()
    tx, _ = data()
    m.compile([tx])
    before = {k: tensor.to_numpy(v) for k, v in m.get_states().items()}
    with pytest.raises(ValueError, match="has shape"):
        m.set_states({"fc1.b": np.ones(16), "fc2.W": np.ones((3, 16))})  # second one is transposed
    with pytest.raises(KeyError, match="no state 'nope'"):
        m.set_states({"fc1.b": np.ones(16), "nope": np.ones(1)})
    for k, v in m.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), before[k], err_msg=f"{k} changed by a failed set_states")


def test_train_and_eval_modes_dispatch():
    m = MLP()
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    tx, ty = data()
    m.compile([tx], is_train=True)
    first = None
    for _ in range(40):
        out, loss = m(tx, ty)
        first = first if first is not None else loss.item()
    assert loss.item() < 0.3 * first
    m.eval()
    assert not autograd.training
    pred = tensor.to_numpy(tensor.argmax(m(tx), 1))
    assert (pred == tensor.to_numpy(ty)).mean() > 0.9


def test_save_and_load_states_roundtrip(tmp_path):
    m = MLP()
    tx, _ = data()
    m.compile([tx])
    path = str(tmp_path / "ckpt.zip")
    m.save_states(path, aux_states={"epoch": np.array(3), "lr": tensor.from_numpy(np.array([0.5], np.float32))})
    with zipfile.ZipFile(path) as zf:
        assert set(zf.namelist()) == {"tensor_dict.npz", "states_attr.json"}
        attrs = json.loads(zf.read("states_attr.json"))
    assert attrs["fc1.W"] == {"state_type": 0, "shape": [6, 16], "dtype": "float32"}
    assert attrs["epoch"]["state_type"] == 1
    with pytest.raises(FileExistsError):
        m.save_states(path)
    other = MLP()
    other.compile([tx])
    aux = other.load_states(path)
    for k, v in m.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(other.get_states()[k]), tensor.to_numpy(v))
    assert int(tensor.to_numpy(aux["epoch"])) == 3 and tensor.to_numpy(aux["lr"])[0] == 0.5
    assert list(tmp_path.iterdir()) == [tmp_path / "ckpt.zip"], "no temporary files left behind"


def test_load_states_rejects_other_models_and_bad_files(tmp_path):
    m = MLP()
    tx, _ = data()
    m.compile([tx])
    path = str(tmp_path / "m.zip")
    m.save_states(path)
    wider = MLP(hidden=32)
    wider.compile([tx])
    with pytest.raises(ValueError, match="has shape"):
        wider.load_states(path)
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("x.txt", "hi")
    with pytest.raises(ValueError, match="not a singa_lite/SINGA checkpoint"):
        m.load_states(str(bad))
    with pytest.raises(FileNotFoundError):
        m.load_states(str(tmp_path / "missing.zip"))


def test_compile_needs_tensors():
    with pytest.raises(TypeError, match="compile"):
        MLP().compile([np.zeros((2, 6))])
