"""SINGA's ``data.ImageBatchIter`` (singa_lite/data/image_batch.py): batches in list order and shuffled, label
parsing, the bounded queue, clean shutdown, and worker errors raised again by next() instead of a hang.

Images are .npy files read by a transform, so the tests need no Pillow; one test reads PNGs when Pillow is
there, another checks the message when it is not."""
import threading
import time

import numpy as np
import pytest

from singa_lite import data
from singa_lite.data import ImageBatchIter


def write_images(tmp_path, n, labels=None, delimiter=" "):
    """n images (3, 2, 2), image i filled with i; the list file gives label i (or labels[i])."""
    folder = tmp_path / "images"
    folder.mkdir()
    lines = []
    for i in range(n):
        np.save(folder / f"img{i}.npy", np.full((3, 2, 2), i, np.float32))
        meta = str(i) if labels is None else labels[i]
        lines.append(f"img{i}.npy" + ("" if meta is None else f"{delimiter}{meta}"))
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(lines) + "\n")
    return str(listing), str(folder)


def load(path):
    return [np.load(path)]


def ids(x):
    return [int(v) for v in x[:, 0, 0, 0]]


def test_in_order_batches_wrap_around(tmp_path):
    listing, folder = write_images(tmp_path, 5)
    it = ImageBatchIter(listing, 3, load, shuffle=False, image_folder=folder, capacity=2)
    assert it.num_samples == 5
    it.start()
    try:
        seen = []
        for _ in range(3):
            x, y = it.next()
            assert x.shape == (3, 3, 2, 2) and x.dtype == np.float32
            assert y.dtype == np.int32 and ids(x) == list(y)
            seen += list(y)
        assert seen == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    finally:
        it.end()
    assert data.ImageBatchIter is ImageBatchIter


def test_shuffled_passes_cover_every_image_once(tmp_path):
    listing, folder = write_images(tmp_path, 8)
    with ImageBatchIter(listing, 4, load, shuffle=True, image_folder=folder, seed=3) as it:
        passes = [[v for _ in range(2) for v in next(it)[1]] for _ in range(3)]
    for p in passes:
        assert sorted(p) == list(range(8))
    assert any(p != list(range(8)) for p in passes)  # 3 identity orders of 8 would be a 1 in 6e13 chance
    with ImageBatchIter(listing, 4, load, shuffle=True, image_folder=folder, seed=3) as again:
        assert [v for _ in range(2) for v in again.next()[1]] == passes[0]  # the seed fixes the order


def test_label_strings_and_missing_labels(tmp_path):
    listing, folder = write_images(tmp_path, 3, labels=["cat", None, "7"], delimiter=",")
    with ImageBatchIter(listing, 3, load, shuffle=False, delimiter=",", image_folder=folder) as it:
        x, y = it.next()
    assert y == ["cat", None, "7"] and ids(x) == [0, 1, 2]


def test_several_images_per_file_and_pil_like_images(tmp_path):
    listing, folder = write_images(tmp_path, 2)

    class FakePil:  # anything with convert("RGB") is taken as a PIL image: HWC -> CHW
        def __init__(self, v):
            self.v = v

        def convert(self, mode):
            assert mode == "RGB"
            return np.full((2, 3, 3), self.v, np.uint8)

    def two_crops(path):
        v = int(np.load(path)[0, 0, 0])
        return [FakePil(v), FakePil(v + 10)]

    with ImageBatchIter(listing, 4, two_crops, shuffle=False, image_folder=folder) as it:
        x, y = it.next()
    assert x.shape == (4, 3, 2, 3) and ids(x) == [0, 10, 1, 11] and list(y) == [0, 0, 1, 1]


def run_until_error(it, timeout=10.0):
    """next() until it raises; fails the test instead of hanging."""
    result = {}

    def consume():
        try:
            while True:
                it.next()
        except BaseException as e:  # noqa: B902
            result["error"] = e

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "next() hung after the worker failed"
    return result["error"]


def test_worker_error_is_raised_by_next_and_stays(tmp_path):
    listing, folder = write_images(tmp_path, 4)

    def flaky(path):
        if path.endswith("img2.npy"):
            raise OSError(f"cannot decode {path}")
        return load(path)

    it = ImageBatchIter(listing, 1, flaky, shuffle=False, image_folder=folder, capacity=1)
    it.start()
    err = run_until_error(it)
    assert isinstance(err, OSError) and "img2.npy" in str(err)
    with pytest.raises(OSError, match="img2.npy"):
        it.next()  # the failure is reported again, not replaced by a wait
    it.end()


@pytest.mark.parametrize("transform,error,match", [
    (lambda p: [np.load(p)] * 3, ValueError, "more than the 2 left in a batch of 2"),
    (lambda p: np.load(p), TypeError, "must return a list"),
    (lambda p: ["not an image"], TypeError, "PIL images or numpy arrays"),
    (lambda p: [np.zeros((3, 2, 2 + p.endswith("1.npy")), np.float32)], ValueError, "differ in shape"),
])
def test_bad_transform_output_reaches_next(tmp_path, transform, error, match):
    listing, folder = write_images(tmp_path, 2)
    it = ImageBatchIter(listing, 2, transform, shuffle=False, image_folder=folder)
    it.start()
    err = run_until_error(it)
    it.end()
    assert isinstance(err, error) and match in str(err)


def test_queue_is_bounded_and_end_is_prompt(tmp_path):
    listing, folder = write_images(tmp_path, 4)
    calls = []

    def counting(path):
        calls.append(path)
        return load(path)

    it = ImageBatchIter(listing, 2, counting, shuffle=False, image_folder=folder, capacity=2)
    it.start()
    # the worker fills the queue, then waits on it: 2 batches queued + 1 built and waiting, 2 images each
    deadline = time.monotonic() + 10
    while len(calls) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # time to read more, were the queue not bounded
    assert len(calls) == 6
    thread = it._thread
    t0 = time.monotonic()
    it.end()
    assert time.monotonic() - t0 < 1.0 and not thread.is_alive()
    time.sleep(0.2)
    assert len(calls) == 6  # nothing read after end()


def test_start_next_end_order(tmp_path):
    listing, folder = write_images(tmp_path, 2)
    it = ImageBatchIter(listing, 1, load, shuffle=False, image_folder=folder)
    with pytest.raises(RuntimeError, match="call start"):
        it.next()
    it.start()
    with pytest.raises(RuntimeError, match="already started"):
        it.start()
    assert list(it.next()[1]) == [0]
    it.end()
    it.end()  # a second end is harmless
    with pytest.raises(RuntimeError, match="end\\(\\) was called"):
        it.next()
    it.start()  # again, from the top of the list
    assert list(it.next()[1]) == [0]
    it.end()


def test_bad_arguments(tmp_path):
    listing, folder = write_images(tmp_path, 1)
    with pytest.raises(FileNotFoundError):
        ImageBatchIter(str(tmp_path / "nope.txt"), 1, load)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="lists no images"):
        ImageBatchIter(str(empty), 1, load)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        ImageBatchIter(listing, 0, load)
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        ImageBatchIter(listing, 1, load, capacity=0)
    with pytest.raises(TypeError, match="must be callable"):
        ImageBatchIter(listing, 1, "load")


def test_without_transform_pillow_reads_files(tmp_path):
    try:
        from PIL import Image
    except ImportError:
        with pytest.raises(ImportError, match="pip install pillow"):
            ImageBatchIter(str(tmp_path / "any.txt"), 1)
        return
    for i in range(2):
        Image.fromarray(np.full((4, 5, 3), 40 * i, np.uint8)).save(tmp_path / f"p{i}.png")
    (tmp_path / "list.txt").write_text("p0.png 0\np1.png 1\n")
    with ImageBatchIter(str(tmp_path / "list.txt"), 2, shuffle=False, image_folder=str(tmp_path)) as it:
        x, y = it.next()
    assert x.shape == (2, 3, 4, 5) and x[1].max() == 40 and list(y) == [0, 1]
