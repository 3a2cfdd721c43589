"""Datasets from local files, and how ranks share them. Nothing here downloads anything.

==================================  =====================================================================
``load_mnist(dir)``                 the four MNIST IDX files (plain or ``.gz``) -> float32 NCHW in [0, 1]
``load_cifar10(dir)``               CIFAR-10 "python version" (pickles, read safely) or ``*.bin`` batches
``load_digits(seed)``               scikit-learn's bundled 8x8 digits as 28x28 MNIST look-alikes (offline)
``read_idx(path)``                  any IDX file as a numpy array
``data_partition(x, y, r, w)``      SINGA's contiguous split: rank r's ``len // w`` samples
``DistributedSampler(n, r, w)``     per-epoch shuffled, equal, shared-seed shares of ``range(n)``
``batches(x, y, sampler, b)``       mini-batches of a sampler's indices
``ElasticSampler(n, r, w, b)``      per-step shares from a job-wide cursor: exact resume on any number of ranks
``ImageBatchIter(list, b, fn)``     SINGA's threaded image batch reader (a list file; PIL optional)
``timed(it)``, ``loading()``        count a loader of one's own as data loading (the straggler report)
==================================  =====================================================================

Every loader returns ``((train_x, train_y), (test_x, test_y))`` with float32 images ``(N, C, H, W)``
and int32 labels, and raises FileNotFoundError (naming the files it expected and what it found) or
ValueError (naming the file and what is wrong with it) instead of returning bad data.
"""
from .cifar10 import CIFAR10_CLASSES, SafeUnpickler, UnsafePickleError, load_cifar10, read_cifar10_batch
from .digits import load_digits
from .elastic_sampler import ElasticSampler
from .image_batch import ImageBatchIter
from .timing import loading, timed
from .mnist import MNIST_FILES, load_mnist, read_idx
from .partition import DistributedSampler, batches, data_partition

__all__ = [
    "load_mnist", "load_cifar10", "load_digits", "read_idx", "read_cifar10_batch", "MNIST_FILES",
    "CIFAR10_CLASSES", "SafeUnpickler", "UnsafePickleError", "data_partition", "DistributedSampler", "ElasticSampler",
    "batches",
    "ImageBatchIter", "loading", "timed",
]
