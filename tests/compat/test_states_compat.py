"""Model.save_states / load_states and Apache SINGA's file layout, both ways.

SINGA's documented layout (python/singa/model.py): a zip (entries deflated) of ``tensor_dict.npz`` (numpy's
``savez`` of every state by name) and ``states_attr.json`` ({name: {"state_type": 0 model / 1 aux,
"shape": [...], "dtype": SINGA's DataType number}}). SINGA's reader extracts both, reads the json, loads
the npz and sorts its arrays by state_type. Here such a file is built by hand with numpy and zipfile, the
way SINGA writes it, and loaded by singa_lite; and singa_lite's file is read back with numpy and zipfile
the way SINGA reads it (np.load's default, allow_pickle=False)."""
import json
import os
import zipfile

import numpy as np
import pytest

from singa_lite import autograd, layer, model, tensor  # noqa: F401 (autograd first: see layer.py)
from singa_lite.checkpoint import CheckpointError

SINGA_FLOAT32, SINGA_INT = 0, 2  # SINGA's DataType numbers (src/proto/core.proto: kFloat32, kInt)


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)
        self.bn = layer.BatchNorm2d()

    def forward(self, x):
        return self.fc(x)


def net():
    m = Net()
    m.compile([tensor.Tensor((2, 5))], is_train=False)
    m.bn(tensor.Tensor((2, 4, 1, 1)).set_value(0.0))  # creates the batch-norm states
    return m


def singa_style_file(folder, arrays: dict, state_types: dict, dtypes: dict) -> str:
    """What SINGA's save_states writes: savez and json into a temporary folder, then both files zipped,
    deflated, under their base names."""
    tmp = os.path.join(folder, "singa_tmp")
    os.mkdir(tmp)
    npz, attr = os.path.join(tmp, "tensor_dict.npz"), os.path.join(tmp, "states_attr.json")
    np.savez(npz, **arrays)
    with open(attr, "w") as f:
        json.dump({k: {"state_type": state_types[k], "shape": list(a.shape), "dtype": dtypes[k]}
                   for k, a in arrays.items()}, f)
    fpath = os.path.join(folder, "from_singa.zip")
    with zipfile.ZipFile(fpath, mode="w") as zf:
        for p in (npz, attr):
            zf.write(p, os.path.basename(p), compress_type=zipfile.ZIP_DEFLATED)
    return fpath


def singa_style_read(fpath, folder) -> tuple:
    """What SINGA's load_states does with a file: extract, read the json, load the npz, split by state_type."""
    out = os.path.join(folder, "extracted")
    with zipfile.ZipFile(fpath) as zf:
        zf.extractall(out)
    with open(os.path.join(out, "states_attr.json")) as f:
        attrs = json.load(f)
    model_states, aux_states = {}, {}
    with np.load(os.path.join(out, "tensor_dict.npz")) as npz:  # allow_pickle=False: numpy's default
        for k in npz.files:
            (model_states if attrs[k]["state_type"] == 0 else aux_states)[k] = npz[k]
    return model_states, aux_states, attrs


def test_a_file_in_singas_layout_loads(tmp_path):
    m = net()
    rng = np.random.default_rng(0)
    arrays = {k: rng.standard_normal(tuple(v.shape)).astype(np.float32) for k, v in m.get_states().items()}
    arrays["epoch"] = np.array([7], np.int32)
    arrays["lr"] = np.array([0.05], np.float32)
    types = {k: 0 for k in m.get_states()} | {"epoch": 1, "lr": 1}
    dtypes = {k: SINGA_FLOAT32 for k in arrays} | {"epoch": SINGA_INT}
    aux = m.load_states(singa_style_file(str(tmp_path), arrays, types, dtypes))
    for k, v in m.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), arrays[k])
    assert sorted(aux) == ["epoch", "lr"]
    assert tensor.to_numpy(aux["epoch"]).tolist() == [7] and aux["epoch"].dtype == tensor.int32
    assert tensor.to_numpy(aux["lr"]).tolist() == [np.float32(0.05)]


def test_singa_lite_files_read_as_singa_reads_them(tmp_path):
    m = net()
    m.set_states({"fc.W": np.arange(15, dtype=np.float32).reshape(5, 3)})
    fpath = str(tmp_path / "ours.zip")
    m.save_states(fpath, aux_states={"epoch": tensor.from_numpy(np.array([3], np.int32)),
                                     "lr": tensor.from_numpy(np.array([0.1], np.float32))})
    with zipfile.ZipFile(fpath) as zf:
        assert sorted(zf.namelist()) == ["states_attr.json", "tensor_dict.npz"]
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in zf.infolist())
    model_states, aux_states, attrs = singa_style_read(fpath, str(tmp_path))
    assert sorted(model_states) == sorted(m.get_states()) and sorted(aux_states) == ["epoch", "lr"]
    for k, v in m.get_states().items():
        np.testing.assert_array_equal(model_states[k], tensor.to_numpy(v))
        assert attrs[k]["shape"] == list(v.shape)
    assert aux_states["epoch"].tolist() == [3] and aux_states["lr"].dtype == np.float32


def test_a_round_trip_through_both_layouts(tmp_path):
    """singa_lite -> read the SINGA way -> written the SINGA way -> singa_lite: the same states."""
    m = net()
    m.set_states({"fc.b": np.array([1.5, -2.0, 3.25], np.float32)})
    ours = str(tmp_path / "ours.zip")
    m.save_states(ours, aux_states={"step": np.array([11], np.int32)})
    model_states, aux_states, _ = singa_style_read(ours, str(tmp_path))
    arrays = {**model_states, **aux_states}
    types = {k: 0 for k in model_states} | {k: 1 for k in aux_states}
    singa_number = {np.dtype(np.float32): SINGA_FLOAT32, np.dtype(np.int32): SINGA_INT}
    dtypes = {k: singa_number[a.dtype] for k, a in arrays.items()}
    back = net()
    aux = back.load_states(singa_style_file(str(tmp_path), arrays, types, dtypes))
    for k, v in m.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(back.get_states()[k]), tensor.to_numpy(v))
    assert tensor.to_numpy(aux["step"]).tolist() == [11]


def test_a_singa_file_with_a_pickled_array_is_refused_without_unpickling(tmp_path):
    m = net()
    arrays = {k: tensor.to_numpy(v) for k, v in m.get_states().items()}
    arrays["notes"] = np.array([{"a": 1}], dtype=object)  # np.savez pickles object arrays
    types = {k: 0 for k in m.get_states()} | {"notes": 1}
    dtypes = {k: SINGA_FLOAT32 for k in arrays} | {"notes": "object"}
    fpath = singa_style_file(str(tmp_path), arrays, types, dtypes)
    with pytest.raises(CheckpointError, match="'notes'.* not a numeric dtype"):
        m.load_states(fpath)


def test_save_states_refuses_an_existing_path_like_singa(tmp_path):
    m = net()
    fpath = str(tmp_path / "m.zip")
    m.save_states(fpath)
    with pytest.raises(FileExistsError, match="already exists"):
        m.save_states(fpath)
