"""singa_lite.data: the MNIST / CIFAR-10 readers on files written here, the offline digits, SINGA's
data_partition and the DistributedSampler (every rank computed in this one process)."""
import gzip
import os
import pickle
import struct

import numpy as np
import pytest

from singa_lite.data import (CIFAR10_CLASSES, DistributedSampler, UnsafePickleError, batches, data_partition,
                             load_cifar10, load_digits, load_mnist, read_cifar10_batch, read_idx)


# ---------------------------------------------------------------- MNIST (IDX)
def idx_bytes(array, code=0x08):
    dt = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[code]
    header = bytes([0, 0, code, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + np.asarray(array, dt).tobytes()


def write(path, raw, gz=False):
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def write_mnist(folder, n_train=30, n_test=12, gz=(True, False, False, True), rows=28, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {}
    for i, (split, n) in enumerate((("train", n_train), ("t10k", n_test))):
        x = rng.integers(0, 256, (n, rows, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n, dtype=np.uint8)
        write(folder / f"{split}-images-idx3-ubyte{'.gz' if gz[2 * i] else ''}", idx_bytes(x), gz[2 * i])
        write(folder / f"{split}-labels-idx1-ubyte{'.gz' if gz[2 * i + 1] else ''}", idx_bytes(y), gz[2 * i + 1])
        arrays[split] = (x, y)
    return arrays


@pytest.mark.parametrize("gz", [(False,) * 4, (True,) * 4, (True, False, False, True)])
def test_load_mnist_plain_and_gzipped(tmp_path, gz):
    arrays = write_mnist(tmp_path, gz=gz)
    (train_x, train_y), (test_x, test_y) = load_mnist(str(tmp_path))
    for (x, y), split in (((train_x, train_y), "train"), ((test_x, test_y), "t10k")):
        raw_x, raw_y = arrays[split]
        assert x.dtype == np.float32 and x.shape == (len(raw_x), 1, 28, 28)
        assert y.dtype == np.int32 and y.shape == (len(raw_y),)
        np.testing.assert_array_equal(x, raw_x[:, None].astype(np.float32) / 255.0)  # what the examples expect
        np.testing.assert_array_equal(y, raw_y)


def test_plain_file_wins_and_gzip_is_told_by_content(tmp_path):
    arrays = write_mnist(tmp_path, gz=(False,) * 4)
    # a stale .gz next to the plain file is ignored; a gzipped file without the suffix is still gunzipped
    write(tmp_path / "train-labels-idx1-ubyte.gz", b"garbage")
    write(tmp_path / "t10k-labels-idx1-ubyte", idx_bytes(arrays["t10k"][1]), gz=True)
    (_, train_y), (_, test_y) = load_mnist(str(tmp_path))
    np.testing.assert_array_equal(train_y, arrays["train"][1])
    np.testing.assert_array_equal(test_y, arrays["t10k"][1])


@pytest.mark.parametrize("code,values", [(0x0C, np.arange(-6, 6, dtype=np.int32).reshape(3, 4)),
                                         (0x0D, np.linspace(-1, 1, 10, dtype=np.float32))])
def test_read_idx_other_types_come_back_native_and_writable(tmp_path, code, values):
    out = read_idx(str(write(tmp_path / "f.idx", idx_bytes(values, code))))
    np.testing.assert_array_equal(out, values)
    assert out.dtype.isnative and out.flags.writeable


def test_missing_files_are_named_with_what_is_there(tmp_path):
    write_mnist(tmp_path, gz=(False,) * 4)
    os.remove(tmp_path / "t10k-images-idx3-ubyte")
    with pytest.raises(FileNotFoundError) as e:
        load_mnist(str(tmp_path))
    msg = str(e.value)
    assert "t10k-images-idx3-ubyte[.gz]" in msg and "train-images-idx3-ubyte" in msg and "never downloads" in msg
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist(str(tmp_path / "nowhere"))


def test_wrong_magic_number(tmp_path):
    arrays = write_mnist(tmp_path, gz=(False,) * 4)
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(arrays["train"][1]))  # a labels file
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        load_mnist(str(tmp_path))
    write(tmp_path / "train-images-idx3-ubyte", b"<html>404 Not Found</html>")
    with pytest.raises(ValueError, match="not an IDX file"):
        load_mnist(str(tmp_path))


@pytest.mark.parametrize("cut,match", [(-5, "truncated: the header announces shape"), (10, "truncated IDX header"),
                                       (2, "too short"), (None, "trailing bytes")])
def test_truncated_or_overlong_idx(tmp_path, cut, match):
    raw = idx_bytes(np.zeros((4, 28, 28), np.uint8))
    raw = raw + b"\0" if cut is None else raw[:cut]
    path = write(tmp_path / "x-idx3-ubyte", raw)
    with pytest.raises(ValueError, match=match) as e:
        read_idx(str(path))
    assert str(path) in str(e.value)


def test_truncated_gzip(tmp_path):
    raw = gzip.compress(idx_bytes(np.zeros((40, 28, 28), np.uint8)))
    path = write(tmp_path / "x.gz", raw[:len(raw) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated gzip"):
        read_idx(str(path))


def test_inconsistent_mnist_sets(tmp_path):
    write_mnist(tmp_path, gz=(False,) * 4)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(np.zeros(29, np.uint8)))
    with pytest.raises(ValueError, match="30 images but 29 labels"):
        load_mnist(str(tmp_path))
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(np.full(30, 12, np.uint8)))
    with pytest.raises(ValueError, match="0..9, found 12"):
        load_mnist(str(tmp_path))
    write_mnist(tmp_path, gz=(False,) * 4)
    x = np.zeros((12, 32, 32), np.uint8)
    write(tmp_path / "t10k-images-idx3-ubyte", idx_bytes(x))
    with pytest.raises(ValueError, match="train images are"):
        load_mnist(str(tmp_path))


# ---------------------------------------------------------------- CIFAR-10
def cifar_arrays(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).tolist()


def py2_pickle(data, labels):
    """A batch pickled as Python 2's cPickle wrote the real files: protocol 2, str (BINSTRING) keys and
    array bytes, numpy.core.multiarray._reconstruct, dtype('u1', 0, 1)."""
    def s(text):
        b = text if isinstance(text, bytes) else text.encode("latin1")
        return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<I", len(b)) + b)

    out = b"\x80\x02}(" + s("batch_label") + s("training batch 1 of 5")
    out += s("data") + b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + s("b") + b"\x87R"
    out += b"(K\x01J" + struct.pack("<i", data.shape[0]) + b"M\x00\x0c\x86"
    minus_one = b"J" + struct.pack("<i", -1)
    out += b"cnumpy\ndtype\n" + s("u1") + b"K\x00K\x01\x87R(K\x03" + s("|") + b"NNN" + 2 * minus_one + b"K\x00tb"
    out += b"\x89" + s(data.tobytes()) + b"tb"
    out += s("labels") + b"](" + b"".join(b"K" + bytes([v]) for v in labels) + b"e"
    return out + b"u."


def write_cifar(folder, fmt="pickle", n=7, protocol=2):
    folder.mkdir(parents=True, exist_ok=True)
    batches_ = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        data, labels = cifar_arrays(n + i, seed=i)
        batches_[name] = (data, labels)
        if fmt == "bin":
            raw = np.concatenate([np.array(labels, np.uint8)[:, None], data], axis=1).tobytes()
            (folder / f"{name}.bin").write_bytes(raw)
        elif fmt == "py2":
            (folder / name).write_bytes(py2_pickle(data, labels))
        else:
            d = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [b"img_%d.png" % k for k in range(len(labels))]}
            (folder / name).write_bytes(pickle.dumps(d, protocol=protocol))
    return batches_


def check_cifar(loaded, written):
    (train_x, train_y), (test_x, test_y) = loaded
    data = np.concatenate([written[f"data_batch_{k}"][0] for k in range(1, 6)])
    labels = sum((written[f"data_batch_{k}"][1] for k in range(1, 6)), [])
    assert train_x.dtype == np.float32 and train_x.shape == (len(data), 3, 32, 32)
    assert train_y.dtype == np.int32 and test_y.dtype == np.int32
    np.testing.assert_array_equal(train_x, data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    np.testing.assert_array_equal(train_y, labels)
    np.testing.assert_array_equal(test_x * 255.0, written["test_batch"][0].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(test_y, written["test_batch"][1])


@pytest.mark.parametrize("fmt,protocol", [("pickle", 2), ("pickle", 4), ("pickle", 5), ("py2", None), ("bin", None)])
def test_load_cifar10_every_format(tmp_path, fmt, protocol):
    written = write_cifar(tmp_path, fmt, protocol=protocol)
    check_cifar(load_cifar10(str(tmp_path)), written)


def test_cifar10_channels_are_planes(tmp_path):
    # one row is 1024 red, 1024 green, 1024 blue bytes, each plane row-major 32x32
    row = np.concatenate([np.full(1024, 10), np.full(1024, 20), np.arange(1024) % 256]).astype(np.uint8)
    (tmp_path / "b.bin").write_bytes(bytes([3]) + row.tobytes())
    x, y = read_cifar10_batch(str(tmp_path / "b.bin"))
    assert x.shape == (1, 3, 32, 32) and x.dtype == np.uint8 and y.tolist() == [3]
    assert (x[0, 0] == 10).all() and (x[0, 1] == 20).all() and x[0, 2, 1, 0] == 32
    assert len(CIFAR10_CLASSES) == 10 and CIFAR10_CLASSES[y[0]] == "cat"


def test_cifar10_parent_directory_and_missing_batches(tmp_path):
    written = write_cifar(tmp_path / "cifar-10-batches-py")
    check_cifar(load_cifar10(str(tmp_path)), written)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(FileNotFoundError) as e:
        load_cifar10(str(tmp_path))
    assert "data_batch_3[.bin]" in str(e.value) and "data_batch_2" in str(e.value)


class Exec:
    """Unpickling this runs code (it writes the file `marker`), if the unpickler lets it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


class System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("payload", ["exec", "system", "nested", "object_array", "class"])
def test_malicious_pickle_is_refused_without_running(tmp_path, payload):
    marker = tmp_path / "marker"
    data, labels = cifar_arrays(4, 0)
    obj = {
        "exec": lambda: Exec(str(marker)),
        "system": lambda: {b"data": data, b"labels": System(str(marker))},
        "nested": lambda: {b"data": data, b"labels": [1, 2, [Exec(str(marker))]]},
        "object_array": lambda: {b"data": np.array([1, "x"], dtype=object), b"labels": labels},
        "class": lambda: {b"data": data, b"labels": labels, b"meta": DistributedSampler(4, 0, 1)},
    }[payload]()
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(obj, protocol=2))
    with pytest.raises(UnsafePickleError, match="refusing") as e:
        read_cifar10_batch(str(path))
    assert str(path) in str(e.value)
    assert not marker.exists()
    if payload in ("exec", "system"):
        assert (".exec:" if payload == "exec" else ".system:") in str(e.value)
    if payload == "exec":  # the file is live: an ordinary unpickler runs it
        pickle.loads(path.read_bytes())
        assert marker.read_text() == "pwned"


def test_forged_numpy_states_are_refused(tmp_path):
    data, labels = cifar_arrays(2, 0)
    good = py2_pickle(data, labels)
    # a dtype whose pickled flags claim that its bytes hold Python objects (numpy would believe it)
    forged = good.replace(b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb", b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK?tb")
    # an object dtype asked for by name, and latin-1 encoding swapped for another codec
    by_name = good.replace(b"U\x02u1", b"U\x01O")
    codec = pickle.dumps({b"data": data, b"labels": labels}, protocol=2).replace(b"latin1", b"base64", 1)
    for raw, match in ((forged, r"dtype state \(3, '\|', None, None, None, -1, -1, 63\)"),
                       (by_name, r"dtype dtype\('O'\)"), (codec, "_codecs.encode.*'base64'")):
        assert raw != good
        (tmp_path / "b").write_bytes(raw)
        with pytest.raises(UnsafePickleError, match=match):
            read_cifar10_batch(str(tmp_path / "b"))


class HugeState:
    """Pickles as numpy's own array recipe, _reconstruct then BUILD, whose state claims 2**40 bytes of uint8
    backed by 3 bytes of data."""

    def __reduce__(self):
        return np.zeros(1).__reduce__()[0], (np.ndarray, (0,), b"b"), (1, (2 ** 40,), np.dtype("u1"), False, b"abc")


def _limited_address_space(limit=4 << 30):
    # A refused allocation must not depend on overcommit: without the check, these ask for 1 TiB and fail
    # (or succeed lazily) by chance. Under a 4 GiB cap the old unpickler raised numpy's MemoryError.
    import resource
    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (min(limit, old[1]) if old[1] > 0 else limit, old[1]))
    return old


@pytest.mark.parametrize("payload", ["reduce_object_1tib", "reduce_uint8", "newobj", "build_size"])
def test_pickles_cannot_ask_for_arrays_bigger_than_the_file(tmp_path, payload):
    # Found by the hardening review: numpy.ndarray sits in the allowed table (as _reconstruct's subtype
    # argument), and REDUCE called it: a 35-byte file made an object array of 2**37 elements (1 TiB).
    raw = {
        "reduce_object_1tib": b"\x80\x02cnumpy\nndarray\n\x8a\x06\x00\x00\x00\x00\x20\x00\x85X\x01\x00\x00\x00O\x86R.",
        "reduce_uint8": b"\x80\x02cnumpy\nndarray\n\x8a\x06\x00\x00\x00\x00\x01\x00\x85X\x02\x00\x00\x00u1\x86R.",
        # ndarray.__new__(ndarray, (2**37,), 'O') through NEWOBJ
        "newobj": b"\x80\x02cnumpy\nndarray\n\x8a\x06\x00\x00\x00\x00\x20\x00\x85X\x01\x00\x00\x00O\x86\x81.",
        "build_size": pickle.dumps(HugeState(), protocol=2),
    }[payload]
    assert len(raw) < 300
    path = tmp_path / "data_batch_1"
    path.write_bytes(raw)
    import resource
    old = _limited_address_space()
    try:
        with pytest.raises(UnsafePickleError, match="refusing") as e:
            read_cifar10_batch(str(path))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)
    assert str(path) in str(e.value)
    if payload == "build_size":
        assert "2**40" not in str(e.value) and "with 3 bytes of data" in str(e.value)


@pytest.mark.parametrize("obj,match", [
    ([1, 2], "pickled dict, found list"),
    ({b"data": np.zeros((2, 3072), np.uint8)}, "without 'labels'"),
    ({"data": np.zeros((2, 3072), np.float32), "labels": [0, 1]}, "must be a uint8 array"),
    ({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}, r"shape \(N, 3072\)"),
    ({"data": np.zeros((2, 3072), np.uint8), "labels": [0]}, "2 images but labels"),
    ({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]}, "0..9"),
    ({"data": np.zeros((2, 3072), np.uint8), "labels": ["a", "b"]}, "list of integers"),
])
def test_malformed_pickled_batches(tmp_path, obj, match):
    (tmp_path / "b").write_bytes(pickle.dumps(obj, protocol=4))
    with pytest.raises(ValueError, match=match):
        read_cifar10_batch(str(tmp_path / "b"))


def test_truncated_cifar_files(tmp_path):
    data, labels = cifar_arrays(3, 0)
    raw = pickle.dumps({b"data": data, b"labels": labels}, protocol=4)
    (tmp_path / "b").write_bytes(raw[:-100])
    with pytest.raises(ValueError, match="not a readable pickle"):
        read_cifar10_batch(str(tmp_path / "b"))
    (tmp_path / "b.bin").write_bytes(bytes(3073 * 2 - 1))
    with pytest.raises(ValueError, match="not a whole number of 3073-byte"):
        read_cifar10_batch(str(tmp_path / "b.bin"))
    (tmp_path / "b.bin").write_bytes(bytes([11]) + bytes(3072))
    with pytest.raises(ValueError, match="0..9"):
        read_cifar10_batch(str(tmp_path / "b.bin"))


# ---------------------------------------------------------------- the offline digits
def test_digits_shape_dtype_and_split():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits as sk_digits

    (train_x, train_y), (test_x, test_y) = load_digits(0)
    assert train_x.shape == (1437, 1, 28, 28) and test_x.shape == (360, 1, 28, 28)
    assert train_x.dtype == np.float32 and train_y.dtype == np.int32 and test_y.dtype == np.int32
    assert 0.0 <= train_x.min() and train_x.max() <= 1.0
    assert not train_x[:, :, :4].any() and not train_x[:, :, :, 24:].any()  # 20x20 digit in a 28x28 frame
    all_y = np.concatenate([train_y, test_y])
    np.testing.assert_array_equal(np.bincount(all_y), np.bincount(sk_digits().target))
    (again_x, again_y), _ = load_digits(0)
    np.testing.assert_array_equal(again_x, train_x)
    (_, other_y), _ = load_digits(1)
    assert not np.array_equal(other_y, train_y)


# ---------------------------------------------------------------- data_partition (SINGA's distributed-training page)
def seed_data_partition(dataset_x, dataset_y, rank_in_global, world_size):
    # verbatim from SINGA's distributed-training page (step 5)
    data_per_rank = dataset_x.shape[0] // world_size
    idx_start = rank_in_global * data_per_rank
    idx_end = (rank_in_global + 1) * data_per_rank
    return dataset_x[idx_start: idx_end], dataset_y[idx_start: idx_end]


@pytest.mark.parametrize("n,world_size", [(n, w) for n in (1, 7, 12, 64, 101) for w in (1, 2, 3, 4, 7) if n >= w])
def test_data_partition_is_seed_001s(n, world_size):
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 1, 2, 2)
    y = np.eye(10, dtype=np.float32)[np.arange(n) % 10]  # one-hot, as SINGA's page has it
    for rank in range(world_size):
        got, want = data_partition(x, y, rank, world_size), seed_data_partition(x, y, rank, world_size)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
            assert g.shape == w.shape and np.shares_memory(g, x if g.ndim == 4 else y)


def test_data_partition_is_where_singa_scripts_look():
    from singa_lite import opt

    assert opt.data_partition is data_partition


@pytest.mark.parametrize("args,err,match", [
    ((2, 2), ValueError, r"rank_in_global must be in \[0, 1\], got 2"),
    ((-1, 2), ValueError, "rank_in_global"),
    ((0, 0), ValueError, "world_size must be >= 1"),
    ((0.0, 2), TypeError, "rank_in_global must be an integer"),
    ((0, True), TypeError, "world_size must be an integer"),
])
def test_data_partition_checks_its_arguments(args, err, match):
    with pytest.raises(err, match=match):
        data_partition(np.zeros(8), np.zeros(8), *args)


def test_data_partition_checks_the_data():
    with pytest.raises(ValueError, match="8 samples but dataset_y has 7"):
        data_partition(np.zeros(8), np.zeros(7), 0, 2)
    with pytest.raises(ValueError, match="3 samples cannot be shared by 4 ranks"):
        data_partition(np.zeros(3), np.zeros(3), 0, 4)
    assert data_partition(np.zeros(4), np.zeros(4), np.int64(1), np.int32(2))[0].shape == (2,)


# ---------------------------------------------------------------- DistributedSampler
def shares(n, world_size, epoch=0, **kw):
    out = []
    for rank in range(world_size):  # a fresh object per rank, as separate processes would have
        s = DistributedSampler(n, rank, world_size, **kw)
        s.set_epoch(epoch)
        out.append(s.indices())
    return out


@pytest.mark.parametrize("n", [1, 5, 16, 97, 1000])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shares_are_equal_disjoint_and_cover(n, world_size, shuffle):
    for epoch in range(4):
        padded = shares(n, world_size, epoch, shuffle=shuffle)
        per = -(-n // world_size)
        assert [len(s) for s in padded] == [per] * world_size
        everything = np.concatenate(padded)
        assert set(everything.tolist()) == set(range(n))  # every sample, each at most twice
        counts = np.bincount(everything, minlength=n)
        assert counts.max() <= 1 + (world_size * per - 1) // n and counts.sum() - n == world_size * per - n
        if n < world_size:
            continue
        dropped = shares(n, world_size, epoch, shuffle=shuffle, drop_last=True)
        assert [len(s) for s in dropped] == [n // world_size] * world_size
        everything = np.concatenate(dropped)
        assert len(set(everything.tolist())) == len(everything) == world_size * (n // world_size)  # disjoint


def test_every_rank_computes_the_same_permutation_and_epochs_differ():
    a = shares(1000, 4, epoch=3, seed=7)
    b = shares(1000, 4, epoch=3, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    orders = [np.concatenate(shares(1000, 4, epoch=e, seed=7)).tolist() for e in range(4)]
    assert len({tuple(o) for o in orders}) == 4
    assert np.concatenate(shares(1000, 4, epoch=3, seed=8)).tolist() != orders[3]
    for o in orders:
        assert sorted(o) == list(range(1000))  # 1000 = 4 * 250: a permutation, nothing padded or dropped


def test_the_permutation_is_pinned():
    # the same on every host and numpy version: PCG64's stream is guaranteed, the argsort is stable
    s = DistributedSampler(10, 0, 1)
    assert s.order().tolist() == [3, 2, 1, 8, 6, 0, 7, 4, 5, 9]
    s.set_epoch(1)
    assert s.order().tolist() == [7, 4, 5, 1, 9, 8, 6, 2, 0, 3]


def test_dropped_samples_change_with_the_epoch():
    seen = set()
    for epoch in range(6):
        seen.update(np.concatenate(shares(103, 4, epoch, drop_last=True)).tolist())  # 3 left out per epoch
    assert seen == set(range(103))


def test_padding_wraps_around_and_no_shuffle_is_data_partition():
    assert [s.tolist() for s in shares(10, 4, shuffle=False)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1]]
    assert [s.tolist() for s in shares(2, 3, shuffle=False)] == [[0], [1], [0]]
    x = np.arange(23)
    for rank, idx in enumerate(shares(23, 5, shuffle=False, drop_last=True)):
        np.testing.assert_array_equal(x[idx], data_partition(x, x, rank, 5)[0])


def test_iteration_and_length():
    s = DistributedSampler(10, 1, 3, seed=4)
    s.set_epoch(2)
    items = list(s)
    assert items == s.indices().tolist() and len(s) == len(items) == 4
    assert all(type(i) is int for i in items)
    assert list(s) == items  # iterating again without set_epoch repeats the epoch
    assert "world_size=3" in repr(s)


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(num_samples=10, rank=3, world_size=3), ValueError, r"rank must be in \[0, 2\], got 3"),
    (dict(num_samples=10, rank=0, world_size=0), ValueError, "world_size must be >= 1"),
    (dict(num_samples=0, rank=0, world_size=1), ValueError, "num_samples must be >= 1"),
    (dict(num_samples=np.zeros(10), rank=0, world_size=1), TypeError, "dataset's size"),
    (dict(num_samples=10.0, rank=0, world_size=1), TypeError, "num_samples must be an integer"),
    (dict(num_samples=10, rank=0, world_size=1, seed=-1), ValueError, "seed must be >= 0"),
    (dict(num_samples=10, rank=0, world_size=1, shuffle="yes"), TypeError, "shuffle must be True or False"),
    (dict(num_samples=3, rank=0, world_size=4, drop_last=True), ValueError, "leave every one of 4 ranks empty"),
])
def test_sampler_checks_its_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        DistributedSampler(**kwargs)


def test_set_epoch_checks_its_argument():
    s = DistributedSampler(10, 0, 2)
    for bad, err in ((-1, ValueError), (1.5, TypeError), (None, TypeError)):
        with pytest.raises(err, match="epoch"):
            s.set_epoch(bad)
    assert s.epoch == 0


# ---------------------------------------------------------------- batches
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_follow_the_sampler(drop_last):
    x = np.arange(50, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    y = np.arange(50, dtype=np.int32)
    s = DistributedSampler(50, 1, 3, seed=2)  # 17 per rank
    s.set_epoch(5)
    got = list(batches(x, y, s, 4, drop_last=drop_last))
    assert [len(b[1]) for b in got] == ([4] * 4 if drop_last else [4] * 4 + [1])
    idx = s.indices()[:16 if drop_last else 17]
    np.testing.assert_array_equal(np.concatenate([b[1] for b in got]), y[idx])
    np.testing.assert_array_equal(np.concatenate([b[0] for b in got]), x[idx])
    assert [b[1].tolist() for b in batches(x, y, np.array([3, 1, 2]), 2)] == [[3, 1], [2]]


def test_batches_check_their_arguments_at_the_call():
    x, y = np.zeros((10, 2)), np.zeros(10)
    with pytest.raises(ValueError, match="x has 10 samples but y has 9"):
        batches(x, y[:9], range(9), 2)
    with pytest.raises(ValueError, match="made for 12 samples but x has 10"):
        batches(x, y, DistributedSampler(12, 0, 1), 2)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        batches(x, y, [0, 10], 2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        batches(x, y, range(10), 0)
    with pytest.raises(TypeError, match="integer indices"):
        batches(x, y, np.array([0.5]), 1)
