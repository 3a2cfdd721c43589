"""SINGA's ``data.ImageBatchIter``: mini-batches of images listed in a text file, prepared by a background thread.

    it = ImageBatchIter("train.txt", 32, transform, shuffle=True, delimiter=",", image_folder="images/")
    it.start()
    x, y = it.next()        # x: float32 (32, C, H, W); y: int32 (32,) when every label is a number
    it.end()

The list file has one image a line: ``path<delimiter>meta``. ``meta`` is usually a label index; when every
line's meta is a whole number, labels come back as an int32 array, otherwise as a list of the meta strings
(None for a line without one). ``image_transform(full_path)`` returns a list of images for that file (several
for augmentations that make more than one crop); a PIL image is converted to RGB and laid out (3, H, W), a
numpy array is used as it is (give it C, H, W). Without ``image_transform`` each file is opened with PIL
(``pip install pillow``), which singa_lite does not otherwise need.

How it differs from SINGA, on purpose: the worker is a thread with a bounded queue.Queue (SINGA forks a
process and polls), so ``end()`` stops it cleanly and promptly; an exception in the worker (an unreadable file,
a transform error, too many images for a batch) is raised again by ``next()``, where SINGA's reader would wait
forever; and ``next()`` before ``start()`` or after ``end()`` raises RuntimeError. The iterator cycles through
the list without end, reshuffling at each pass when ``shuffle`` is set, as SINGA's does.
"""
from __future__ import annotations

import numbers
import os
import queue
import random
import threading

import numpy as np

from . import timing

__all__ = ["ImageBatchIter"]

_POLL = 0.05  # seconds between checks of the stop flag while blocked on the queue


def _open_with_pil(path):
    from PIL import Image  # checked in ImageBatchIter.__init__

    with Image.open(path) as img:
        img.load()
        return [img.copy()]


def _as_chw(img, path: str) -> np.ndarray:
    if hasattr(img, "convert"):  # a PIL image
        return np.asarray(img.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
    if isinstance(img, np.ndarray):
        return img.astype(np.float32, copy=False)
    raise TypeError(f"ImageBatchIter: image_transform({path!r}) gave a {type(img).__name__}; expected PIL images "
                    f"or numpy arrays (C, H, W)")


class _Failure:
    """What the worker queues when it fails: next() raises the exception again."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class ImageBatchIter:
    """Mini-batches ``(images, labels)`` read by a background thread; see the module docstring.

    Args (SINGA's): img_list_file, batch_size, image_transform (None: open each file with PIL), shuffle,
    delimiter, image_folder (prefix joined to each listed path; None: paths as listed), capacity (how many
    batches the queue holds ahead). ``seed`` (ours) fixes the shuffling order.
    """

    def __init__(self, img_list_file, batch_size, image_transform=None, shuffle=True, delimiter=" ",
                 image_folder=None, capacity=10, seed=None):
        for name, value in (("batch_size", batch_size), ("capacity", capacity)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"ImageBatchIter: {name} must be an int >= 1, got {value!r}")
        if image_transform is None:
            try:
                import PIL.Image  # noqa: F401
            except ImportError:
                raise ImportError("ImageBatchIter: reading image files needs Pillow (pip install pillow), or pass "
                                  "an image_transform(path) that loads them") from None
            image_transform = _open_with_pil
        elif not callable(image_transform):
            raise TypeError(f"ImageBatchIter: image_transform must be callable, got {type(image_transform).__name__}")
        self.img_list_file = img_list_file
        self.batch_size, self.capacity = int(batch_size), int(capacity)
        self.image_transform, self.shuffle = image_transform, bool(shuffle)
        self.delimiter, self.image_folder = delimiter, image_folder
        self._rng = random.Random(seed)
        self.img_list, self.is_label_index = self._read_list(img_list_file, delimiter)
        self.num_samples = len(self.img_list)
        self._thread = None
        self._queue = None
        self._stop = threading.Event()
        self._failure = None
        self._ended = False

    @staticmethod
    def _read_list(path, delimiter):
        entries = []
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                parts = line.rstrip("\n").split(delimiter, 1)
                meta = parts[1].strip() if len(parts) > 1 else None
                entries.append((parts[0].strip(), meta))
        if not entries:
            raise ValueError(f"ImageBatchIter: {path} lists no images (expected lines 'path{delimiter}label')")
        is_label_index = all(meta is not None and meta.isdigit() for _, meta in entries)
        return entries, is_label_index

    # ---------------------------------------------------------------- the worker
    def _put(self, item) -> bool:
        """Queues item, waiting while the queue is full; False when end() was called meanwhile."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _batch(self, order, index):
        images, metas = [], []
        while len(images) < self.batch_size:
            rel, meta = order[index]
            path = rel if self.image_folder is None else os.path.join(self.image_folder, rel)
            made = self.image_transform(path)
            if not isinstance(made, (list, tuple)):
                raise TypeError(f"ImageBatchIter: image_transform({path!r}) must return a list of images, got "
                                f"{type(made).__name__}")
            if len(images) + len(made) > self.batch_size:
                raise ValueError(f"ImageBatchIter: image_transform({path!r}) gave {len(made)} images, more than "
                                 f"the {self.batch_size - len(images)} left in a batch of {self.batch_size}; "
                                 f"use a batch size that is a multiple of the images per file")
            for img in made:
                images.append(_as_chw(img, path))
                metas.append(int(meta) if self.is_label_index else meta)
            index += 1
            if index == len(order):  # a pass over the list is done: start the next one
                index = 0
                if self.shuffle:
                    self._rng.shuffle(order)
        try:
            x = np.stack(images)
        except ValueError:
            shapes = sorted({a.shape for a in images})
            raise ValueError(f"ImageBatchIter: the images of a batch differ in shape {shapes}; make "
                             f"image_transform return one size") from None
        y = np.asarray(metas, dtype=np.int32) if self.is_label_index else metas
        return (x, y), index

    def _run(self):
        order = list(self.img_list)
        if self.shuffle:
            self._rng.shuffle(order)
        index = 0
        try:
            while not self._stop.is_set():
                item, index = self._batch(order, index)
                if not self._put(item):
                    return
        except BaseException as e:  # noqa: B902 - every failure must reach next(), or it would wait forever
            self._put(_Failure(e))

    # ---------------------------------------------------------------- SINGA's interface
    def start(self):
        """Starts the background reader (again after end(), from a fresh pass over the list)."""
        if self._thread is not None:
            raise RuntimeError("ImageBatchIter.start: already started; call end() first")
        self._stop.clear()
        self._queue = queue.Queue(self.capacity)
        self._failure, self._ended = None, False
        self._thread = threading.Thread(target=self._run, name="ImageBatchIter", daemon=True)
        self._thread.start()

    def next(self):
        """The next mini-batch ``(images, labels)``; waits for the reader, and raises what the reader raised."""
        if self._failure is not None:
            raise self._failure
        if self._thread is None:
            raise RuntimeError("ImageBatchIter.next: " + ("end() was called; start() again to read more"
                                                          if self._ended else "call start() first"))
        t0 = timing.now()
        while True:
            try:
                item = self._queue.get(timeout=_POLL)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("ImageBatchIter.next: the reader thread stopped without a batch") from None
        timing.add(timing.now() - t0)  # waiting for the reader: the straggler report's data loading
        if isinstance(item, _Failure):
            self._failure = item.exc
            raise item.exc
        return item

    __next__ = next

    def __iter__(self):
        return self

    def end(self, timeout: float = 10.0):
        """Stops the reader and waits for it (up to ``timeout`` seconds: a transform call already running is
        let finish; the thread is a daemon, so a stuck transform does not keep the program alive)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        self._queue = None
        self._ended = True

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.end()
