"""The CPU kernels' instruction-set levels (csrc/cpu/isa.h): every level this CPU supports gives the same bits
(float sums, max / min with signed zeros and nans, element-wise ops, the float32 polynomials), whether chosen
with SINGA_LITE_ISA in a fresh process or with _core.set_isa; bad levels are refused with a clear error."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from singa_lite import _core

# The avx levels exist in x86-64 builds only; elsewhere (the aarch64 wheel) baseline is the one level.
X86 = platform.machine() in ("x86_64", "AMD64")
LEVELS = ["baseline", "avx2", "avx512"]
BEST = _core.build_info()["cpu_isa"]["best"]
SUPPORTED = LEVELS[: LEVELS.index(BEST) + 1]

# Computes a fixed set of results on the active level and prints {"isa": level, "results": {name: hex bytes}}.
# Sizes are odd (vector tails), long (split over blocks and threads) and short; the data hold signed zeros,
# infinities and nans where the order of operations could show.
PROBE = r"""
import json
import numpy as np
from singa_lite import _core

T = _core.Tensor.from_buffer
rng = np.random.default_rng(7)
out = {}

def put(name, t):
    out[name] = np.ascontiguousarray(np.asarray(t)).tobytes().hex()

for dt in (np.float32, np.float64):
    tag = np.dtype(dt).name
    for n in (1, 15, 17, 1000, 4099, 300_001):
        x = (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)).astype(dt)
        tx = T(x)
        put(f"sum_{tag}_{n}", _core.sum(tx))
        put(f"mean_{tag}_{n}", _core.mean(tx))
        put(f"max_{tag}_{n}", _core.max(tx))
        put(f"min_{tag}_{n}", _core.min(tx))
    # Signed zeros only: which zero max / min return depends on the order they are compared in.
    z = np.where(rng.random(1003) < 0.5, -0.0, 0.0).astype(dt)
    put(f"max_zeros_{tag}", _core.max(T(z)))
    put(f"min_zeros_{tag}", _core.min(T(z)))
    for where in (0, 5, 500, 1002):
        w = z.copy()
        w[where] = np.nan
        put(f"max_nan{where}_{tag}", _core.max(T(w)))
    m = rng.standard_normal((513, 259)).astype(dt)
    m[3, 7] = -0.0
    m[100, 9] = np.inf
    m[200, 11] = np.nan
    tm = T(m)
    for axes in ([0], [1]):
        for op in ("sum", "mean", "max", "min"):
            put(f"{op}_axis{axes[0]}_{tag}", getattr(_core, op)(tm, axes))
    a = rng.standard_normal(10_007).astype(dt)
    b = rng.standard_normal(10_007).astype(dt)
    b[::97] = 0.0
    a[::89] = -0.0
    ta, tb = T(a), T(b)
    for op in ("add", "sub", "mul", "div", "maximum", "minimum", "lt", "eq"):
        put(f"{op}_{tag}", getattr(_core, op)(ta, tb))
    put(f"add_row_{tag}", _core.add(tm, T(m[0].copy())))
    put(f"mul_scalar_{tag}", _core.mul_scalar(ta, 0.3))
    put(f"sub_scalar_first_{tag}", _core.sub_scalar(ta, 1.7, True))
    for op in ("neg", "abs", "sign", "square", "relu", "reciprocal", "exp", "tanh", "sigmoid"):
        put(f"{op}_{tag}", getattr(_core, op)(T(a * 30)))

print(json.dumps({"isa": _core.get_isa(), "results": out}))
"""


def run_probe(env_level: str | None, code: str = PROBE) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SINGA_LITE_ISA", None)
    if env_level is not None:
        env["SINGA_LITE_ISA"] = env_level
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def probe_results(level: str) -> dict:
    proc = run_probe(level)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["isa"] == level  # the override took effect
    return got["results"]


def test_best_level_is_the_default():
    proc = run_probe(None, "from singa_lite import _core; print(_core.get_isa())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == BEST
    info = _core.build_info()["cpu_isa"]
    assert info["best"] in LEVELS and info["active"] in LEVELS


@pytest.mark.skipif(len(SUPPORTED) < 2, reason="this CPU has only the baseline level")
def test_every_level_gives_the_same_bits():
    ref = probe_results(SUPPORTED[0])
    for level in SUPPORTED[1:]:
        got = probe_results(level)
        assert got.keys() == ref.keys()
        differ = [name for name in ref if got[name] != ref[name]]
        assert not differ, f"{level} differs from {SUPPORTED[0]} in {differ}"


def test_set_isa_in_process_switches_and_keeps_results():
    import numpy as np

    x = np.random.default_rng(1).standard_normal(100_003).astype(np.float32)
    x[17] = -0.0
    t = _core.Tensor.from_buffer(x)
    before = _core.get_isa()
    try:
        seen = {}
        for level in SUPPORTED:
            _core.set_isa(level)
            assert _core.get_isa() == level
            seen[level] = (np.asarray(_core.sum(t)).tobytes(), np.asarray(_core.max(t)).tobytes(),
                           np.asarray(_core.tanh(t)).tobytes())
        assert len(set(seen.values())) == 1
        _core.set_isa("best")
        assert _core.get_isa() == BEST
    finally:
        _core.set_isa(before)


@pytest.mark.parametrize("bad", ["avx3", "AVX2", "sse4", "native"])
def test_unknown_level_from_env_stops_import_with_reason(bad):
    proc = run_probe(bad, "import singa_lite")
    assert proc.returncode != 0
    assert f"SINGA_LITE_ISA='{bad}' is not an instruction-set level" in proc.stderr
    assert "baseline, avx2, avx512" in proc.stderr


def test_unknown_level_in_set_isa_raises_value_error():
    before = _core.get_isa()
    with pytest.raises(ValueError, match=r"set_isa\('fast'\) is not an instruction-set level.*baseline, avx2"):
        _core.set_isa("fast")
    assert _core.get_isa() == before


@pytest.mark.skipif(BEST == "avx512" or not X86, reason="this CPU supports every level (or is not x86-64)")
def test_level_the_cpu_lacks_is_refused():
    higher = LEVELS[LEVELS.index(BEST) + 1]
    with pytest.raises(ValueError, match=f"this CPU supports at most '{BEST}'"):
        _core.set_isa(higher)
    proc = run_probe(higher, "import singa_lite")
    assert proc.returncode != 0 and f"this CPU supports at most '{BEST}'" in proc.stderr


@pytest.mark.skipif(X86, reason="x86-64 builds have the avx levels")
@pytest.mark.parametrize("level", ["avx2", "avx512"])
def test_x86_level_is_refused_by_name_on_other_architectures(level):
    # Not "this CPU supports at most baseline": the build, not the CPU, lacks the level.
    want = f"'{level}' is an x86-64 level and this build of singa_lite is for {platform.machine()}"
    before = _core.get_isa()
    with pytest.raises(ValueError, match=want):
        _core.set_isa(level)
    assert _core.get_isa() == before == "baseline"
    proc = run_probe(level, "import singa_lite")
    assert proc.returncode != 0 and f"SINGA_LITE_ISA='{level}': {want}" in proc.stderr


def test_empty_env_value_means_best():
    proc = run_probe("", "from singa_lite import _core; print(_core.get_isa())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == BEST


def test_detected_level_matches_the_cpu_flags():
    # The detection reads CPUID itself; __builtin_cpu_supports read every level as baseline in the portable
    # (zig clang) wheel, whose runtime library never fills the table it reads.
    if not X86:
        # /proc/cpuinfo may be the x86 host's under emulation (qemu-user); the build has no avx code either way.
        assert BEST == "baseline"
        return
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags here")
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2"} <= set(flags):
        want = "avx512"
    elif "avx2" in flags:
        want = "avx2"
    else:
        want = "baseline"
    assert BEST == want
