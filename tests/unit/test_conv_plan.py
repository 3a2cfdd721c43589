"""The cuDNN convolution plan cache and its walk down the candidates (csrc/cuda/conv_plan.h), on the CPU: the same
C++ code the GPU uses, bound in every build as _core._ConvPlanCache / _core._conv_run_first_fitting, with Python
standing in for cuDNN's heuristic and for the attempt to run an algorithm. On a GPU, tests/gpu/test_cudnn_plans.py
checks that real convolutions hit the cache and fall back when a workspace does not fit."""
import itertools

import pytest

from singa_lite import _core

# device, dtype, direction, x, w, stride, padding, dilation, groups
KEY = (0, int(_core.DType.float32), 0, (8, 3, 32, 32), (16, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1)


def varied(key, field, value):
    k = list(key)
    k[field] = value
    return tuple(k)


class Heuristic:
    """Counts how often the cache asks; answers with a list that names the call."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return [(self.calls, 1000 * self.calls), (1, 0)]


def test_the_heuristic_is_asked_once_per_key():
    cache, ask = _core._ConvPlanCache(), Heuristic()
    first = cache.get(KEY, ask)
    assert first == [(1, 1000), (1, 0)]
    for _ in range(60):  # a ResNet-18 step's worth of calls with one geometry
        assert cache.get(KEY, ask) == first
    assert ask.calls == 1
    assert cache.stats() == {"entries": 1, "hits": 60, "misses": 1}


# every field of the key, changed alone, is another plan
CHANGES = [
    (0, 1),                                       # device
    (1, int(_core.DType.float16)),                # dtype
    (2, 1), (2, 2),                               # backward data, backward filter
    (3, (9, 3, 32, 32)), (3, (8, 3, 31, 32)), (3, (8, 3, 32, 33)),  # x: batch, height, width
    (4, (32, 3, 3, 3)), (4, (16, 3, 5, 3)), (4, (16, 3, 3, 1)),     # w: out channels, kernel
    (5, (2, 1)), (5, (1, 2)),                     # stride
    (6, (0, 1)), (6, (1, 2)),                     # padding
    (7, (2, 1)), (7, (1, 2)),                     # dilation
    (8, 3),                                       # groups
]


@pytest.mark.parametrize("field,value", CHANGES)
def test_each_field_of_the_key_counts(field, value):
    cache, ask = _core._ConvPlanCache(), Heuristic()
    cache.get(KEY, ask)
    other = cache.get(varied(KEY, field, value), ask)
    assert ask.calls == 2 and other == [(2, 2000), (1, 0)]
    assert cache.get(KEY, ask) == [(1, 1000), (1, 0)]  # the first key keeps its own plan
    assert cache.stats()["entries"] == 2


def test_keys_that_only_look_alike_do_not_collide():
    # the same numbers in other fields: a hash that mixed fields loosely would confuse them
    cache, ask = _core._ConvPlanCache(), Heuristic()
    keys = set()
    for x in itertools.permutations((1, 2, 3, 4)):
        for w in ((1, 2, 3, 4), (4, 3, 2, 1)):
            keys.add((0, 1, 0, x, w, (1, 2), (2, 1), (1, 1), 1))
    for k in keys:
        cache.get(k, ask)
    assert ask.calls == len(keys) == cache.stats()["entries"]
    for k in keys:
        cache.get(k, ask)
    assert ask.calls == len(keys)


def test_the_cache_is_bounded():
    cache, ask = _core._ConvPlanCache(capacity=4), Heuristic()
    for batch in range(10):  # a job whose batch size keeps changing
        cache.get(varied(KEY, 3, (batch + 1, 3, 32, 32)), ask)
    assert cache.stats()["entries"] <= 4 and ask.calls == 10


def test_a_failing_heuristic_stores_nothing():
    cache = _core._ConvPlanCache()

    def broken():
        raise RuntimeError("cudnnGetConvolutionForwardAlgorithm_v7 failed")
    with pytest.raises(RuntimeError, match="v7 failed"):
        cache.get(KEY, broken)
    assert cache.stats()["entries"] == 0
    assert cache.get(KEY, lambda: [(5, 0)]) == [(5, 0)]


def fits(budget, tried):
    def attempt(algo, workspace):
        tried.append(algo)
        return workspace <= budget
    return attempt


def test_the_first_candidate_that_fits_runs():
    plans = [(7, 900), (6, 500), (1, 0)]  # best first, the fallback (no workspace) last
    tried = []
    assert _core._conv_run_first_fitting(plans, fits(10_000, tried)) == 0 and tried == [7]
    tried = []
    assert _core._conv_run_first_fitting(plans, fits(600, tried)) == 1 and tried == [7, 6]
    tried = []
    assert _core._conv_run_first_fitting(plans, fits(0, tried)) == 2 and tried == [7, 6, 1]


def test_out_of_memory_when_nothing_fits():
    with pytest.raises(MemoryError, match=r"none of the 2 cuDNN algorithms .* smallest workspace is 500 bytes"):
        _core._conv_run_first_fitting([(7, 900), (6, 500)], fits(100, []))


def test_other_failures_are_not_taken_for_lack_of_memory():
    def attempt(algo, workspace):
        raise RuntimeError("cudnnConvolutionForward failed: CUDNN_STATUS_EXECUTION_FAILED")
    with pytest.raises(RuntimeError, match="EXECUTION_FAILED"):
        _core._conv_run_first_fitting([(7, 900), (1, 0)], attempt)


def test_the_gpu_counters_exist_in_every_build():
    stats = _core.cudnn_conv_plan_stats()
    assert set(stats) == {"entries", "hits", "misses"}
    if not _core.cudnn_available():
        assert stats == {"entries": 0, "hits": 0, "misses": 0}
