"""Model.load_states on hostile files: every problem is a CheckpointError (a ValueError) naming the file and
the problem, nothing is cast into a parameter of another dtype, nothing changes before everything is
checked, and a zip bomb is refused on its declared sizes (peak memory measured in a subprocess)."""
import io
import json
import zipfile

import numpy as np
import pytest

from singa_lite import autograd, layer, model, tensor  # noqa: F401 (autograd first: see layer.py)
from singa_lite.checkpoint import CheckpointError
from test_checkpoint_hostile import BOMB, npy_bytes, peak_of, zeros_npy


class MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(256)

    def forward(self, x):
        return self.fc(x)


def mlp():
    m = MLP()
    m.compile([tensor.Tensor((2, 1024))], is_train=False)
    m.set_states({"fc.W": np.full((1024, 256), 7, np.float32), "fc.b": np.full((256,), 7, np.float32)})
    return m


DECLARED = (1024 * 256 + 256) * 4  # about 1 MiB


def states_file(path, arrays: dict, attrs: dict, npz_members=None, outer=zipfile.ZIP_DEFLATED, extra=()):
    """A file in SINGA's layout, by hand: npz_members (default: arrays as <name>.npy) in tensor_dict.npz."""
    members = npz_members if npz_members is not None else [(f"{k}.npy", npy_bytes(a), zipfile.ZIP_STORED)
                                                           for k, a in arrays.items()]
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w") as zf:
        for name, data, compression in members:
            info = zipfile.ZipInfo(name)
            info.compress_type = compression
            if callable(data):
                with zf.open(info, "w", force_zip64=True) as f:
                    data(f)
            else:
                zf.writestr(info, data)
    with zipfile.ZipFile(path, "w", outer) as zf:
        zf.writestr("tensor_dict.npz", npz.getvalue())
        zf.writestr("states_attr.json", attrs if isinstance(attrs, bytes) else json.dumps(attrs))
        for name, data in extra:
            zf.writestr(name, data)
    return str(path)


def good_arrays():
    return {"fc.W": np.ones((1024, 256), np.float32), "fc.b": np.ones((256,), np.float32)}


def attrs_of(arrays, state_type=0):
    return {k: {"state_type": state_type, "shape": list(a.shape), "dtype": str(a.dtype)} for k, a in arrays.items()}


def refuse(path, match):
    m = mlp()
    with pytest.raises(CheckpointError, match=match):
        m.load_states(path)
    assert all((tensor.to_numpy(v) == 7).all() for v in m.get_states().values()), "nothing was changed"


def test_a_hand_built_file_loads(tmp_path):
    arrays = good_arrays()
    path = states_file(tmp_path / "ok.zip", {**arrays, "epoch": np.array(3, np.int32)},
                       {**attrs_of(arrays), "epoch": {"state_type": 1, "shape": [], "dtype": "int32"}})
    m = mlp()
    aux = m.load_states(path)
    assert (tensor.to_numpy(m.get_states()["fc.W"]) == 1).all() and int(tensor.to_numpy(aux["epoch"])) == 3


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float16, np.float64])
def test_states_of_another_dtype_are_refused_not_cast(tmp_path, dtype):
    arrays = good_arrays()
    arrays["fc.W"] = arrays["fc.W"].astype(dtype)
    path = states_file(tmp_path / "m.zip", arrays, attrs_of(arrays))
    refuse(path, rf"{path}: model state 'fc.W' has shape \(1024, 256\) dtype {np.dtype(dtype)} in the file, "
                 r"\(1024, 256\) float32 in the model \(states are not cast\)")


def test_attrs_that_lie_about_the_dtype_are_refused(tmp_path):
    arrays = good_arrays()
    attrs = attrs_of(arrays)
    arrays["fc.W"] = arrays["fc.W"].astype(np.int32)  # attrs still say float32
    path = states_file(tmp_path / "m.zip", arrays, attrs)
    refuse(path, r"tensor_dict.npz\): entry 'fc.W.npy' holds a int32 \(1024, 256\) array, but the file's index "
                 r"declares float32 \(1024, 256\)")


def test_not_a_zip(tmp_path):
    path = tmp_path / "junk.zip"
    path.write_bytes(b"PK\x03\x04 this is no zip at all" * 10)
    refuse(str(path), rf"{path}: not a readable zip file \(BadZipFile")


def test_a_corrupt_deflate_stream(tmp_path):
    arrays = good_arrays()
    path = states_file(tmp_path / "m.zip", arrays, attrs_of(arrays))
    data = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("tensor_dict.npz")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + 10:start + 60] = bytes(range(50))  # inside the compressed bytes of tensor_dict.npz
    open(path, "wb").write(bytes(data))
    refuse(path, rf"{path} \(tensor_dict.npz\): corrupt \((error|BadZipFile)")


def test_attrs_that_are_not_utf8(tmp_path):
    path = states_file(tmp_path / "m.zip", good_arrays(), b'{"fc.W": "\xff\xfe"}')
    refuse(path, rf"{path} \(states_attr.json\): not valid JSON \('utf-8' codec can't decode")


def test_attrs_nested_too_deeply(tmp_path):
    path = states_file(tmp_path / "m.zip", good_arrays(), ("[" * 100000 + "]" * 100000).encode())
    refuse(path, rf"{path} \(states_attr.json\): JSON nested too deeply")


def test_bad_attrs(tmp_path):
    arrays = good_arrays()
    for attrs, match in [
        ({**attrs_of(arrays), "fc.b": {"state_type": 7, "shape": [256], "dtype": "float32"}}, "is not {'state_type'"),
        ({**attrs_of(arrays), "fc.b": {"state_type": 0, "shape": [-1], "dtype": "float32"}}, r"shape \[-1\] is not"),
        ({**attrs_of(arrays), "fc.b": {"state_type": 0, "shape": [256], "dtype": "object"}}, "not a numeric dtype"),
        ({**attrs_of(arrays), "fc.b": {"state_type": 0, "shape": [256], "dtype": 9}}, "SINGA dtype number 9"),
        ({"fc.W": attrs_of(arrays)["fc.W"]}, r"missing \['fc.b'\]"),
        ([1, 2], "holds a list, not a dict"),
    ]:
        refuse(states_file(tmp_path / "m.zip", arrays, attrs), match)


def test_members_that_do_not_match_the_attrs(tmp_path):
    arrays = good_arrays()
    path = states_file(tmp_path / "m.zip", {**arrays, "ghost": np.zeros(3, np.float32)}, attrs_of(arrays))
    refuse(path, r"does not hold exactly the states states_attr.json declares: missing \[\], undeclared "
                 r"\['ghost.npy'\]")
    path = states_file(tmp_path / "m2.zip", arrays, attrs_of(arrays), extra=[("notes.txt", "hi")])
    refuse(path, r"not a singa_lite/SINGA checkpoint \(it holds \['notes.txt', 'states_attr.json', "
                 r"'tensor_dict.npz'\]")


def test_a_truncated_member_and_a_header_of_2_to_the_40_elements(tmp_path):
    arrays = good_arrays()
    members = [("fc.W.npy", npy_bytes(arrays["fc.W"])[:-100], zipfile.ZIP_STORED),
               ("fc.b.npy", npy_bytes(arrays["fc.b"]), zipfile.ZIP_STORED)]
    refuse(states_file(tmp_path / "t.zip", arrays, attrs_of(arrays), members),
           r"entry 'fc.W.npy' truncated: its header declares a float32 \(1024, 256\) array \(1048576 bytes of "
           r"data\), the entry holds 1048476 bytes of data")
    huge = {"fc.W": np.zeros(4, np.float32), "fc.b": arrays["fc.b"]}
    members = [("fc.W.npy", npy_bytes(huge["fc.W"], shape=(2 ** 40,)), zipfile.ZIP_STORED),
               ("fc.b.npy", npy_bytes(arrays["fc.b"]), zipfile.ZIP_STORED)]
    attrs = {**attrs_of(arrays), "fc.W": {"state_type": 1, "shape": [2 ** 40], "dtype": "float32"}}
    attrs["W2"] = attrs.pop("fc.W")  # an aux state that declares 4 TiB: the member is 16 bytes of data
    members[0] = ("W2.npy", members[0][1], zipfile.ZIP_STORED)
    m = MLP()
    m.compile([tensor.Tensor((2, 1024))], is_train=False)
    path = states_file(tmp_path / "h.zip", arrays, attrs, members)
    with pytest.raises(CheckpointError, match=r"missing \['fc.W'\]"):  # the model's check comes first
        m.load_states(path)
    attrs["fc.W"] = attrs_of(arrays)["fc.W"]
    members.append(("fc.W.npy", npy_bytes(arrays["fc.W"]), zipfile.ZIP_STORED))
    path = states_file(tmp_path / "h2.zip", arrays, attrs, members)
    refuse(path, r"tensor_dict.npz: declares \d+ bytes, more than|entry 'W2.npy' declares 144 bytes, but a "
                 r"float32 \(1099511627776,\) array takes 4398046511104 bytes")


def test_the_dtype_numbers_of_singa_files_are_read(tmp_path):
    arrays = {**good_arrays(), "step": np.array([5], np.int32), "half": np.ones(2, np.float16)}
    attrs = {"fc.W": {"state_type": 0, "shape": [1024, 256], "dtype": 0}, "fc.b": {"state_type": 0, "shape": [256],
                                                                               "dtype": 0},
             "step": {"state_type": 1, "shape": [1], "dtype": 2}, "half": {"state_type": 1, "shape": [2], "dtype": 1}}
    aux = mlp().load_states(states_file(tmp_path / "s.zip", arrays, attrs))
    assert tensor.to_numpy(aux["step"]).tolist() == [5] and aux["half"].dtype == tensor.float16
    attrs["step"]["dtype"] = 0  # the member is int32, the number says float32
    refuse(states_file(tmp_path / "s2.zip", arrays, attrs), r"entry 'step.npy' holds a int32 \(1,\) array, but "
                                                            r"the file's index declares float32 \(1,\)")


# ---------------------------------------------------------------- zip bombs
LOAD = ("from test_checkpoint_states import mlp\nm = mlp()", "m.load_states({path!r})")


def load_peak(path):
    import os

    prep, run = LOAD
    here = os.path.dirname(os.path.abspath(__file__))
    return peak_of(f"sys.path.insert(0, {here!r})\n" + prep, run.format(path=str(path)))


def test_a_good_load_peaks_within_twice_its_declared_data(tmp_path):
    arrays = good_arrays()
    outcome, peak = load_peak(states_file(tmp_path / "ok.zip", arrays, attrs_of(arrays)))
    assert outcome == "ok"
    assert peak < 2 * DECLARED + 64 * 1024, peak  # (+ the zip and JSON readers' own few KiB)


def test_an_undeclared_deflated_member_is_refused_unread(tmp_path):
    arrays = good_arrays()
    members = [(f"{k}.npy", npy_bytes(a), zipfile.ZIP_STORED) for k, a in arrays.items()]
    members.append(("bomb.npy", zeros_npy(BOMB // 4), zipfile.ZIP_DEFLATED))
    path = states_file(tmp_path / "bomb.zip", arrays, attrs_of(arrays), members)
    outcome, peak = load_peak(path)
    assert outcome.startswith("CheckpointError") and "refused unread" in outcome, outcome
    assert peak < 2 * DECLARED + 64 * 1024, peak


def test_a_member_declaring_more_than_its_shape_is_refused_unread(tmp_path):
    arrays = good_arrays()
    members = [("fc.W.npy", zeros_npy(BOMB // 16), zipfile.ZIP_DEFLATED),  # 64 MiB: passes the outer bound
               ("fc.b.npy", npy_bytes(arrays["fc.b"]), zipfile.ZIP_STORED)]
    path = states_file(tmp_path / "bomb.zip", arrays, attrs_of(arrays), members, outer=zipfile.ZIP_STORED)
    outcome, peak = load_peak(path)
    assert outcome.startswith("CheckpointError") and "refused unread" in outcome, outcome
    assert peak < 2 * DECLARED + 64 * 1024, peak


def test_a_states_attr_json_bomb_is_refused_unread(tmp_path):
    """32 MiB of JSON whitespace, deflated to a few KiB: refused on its declared size."""
    arrays = good_arrays()
    attrs = json.dumps(attrs_of(arrays)).encode() + b" " * (32 << 20)
    path = states_file(tmp_path / "attrs.zip", arrays, attrs)
    outcome, peak = load_peak(path)
    assert outcome.startswith("CheckpointError") and "(states_attr.json)" not in outcome, outcome
    assert f"{path}: entry 'states_attr.json' declares 3355" in outcome and "never over 16777216 bytes" in outcome
    assert peak < 2 * DECLARED, peak
