#!/usr/bin/env bash
# CI for the binary wheels (tools/build_wheel.sh), called by .ci/run:
#  1. builds and repairs the CPU wheel, installs it into a fresh venv with no C/C++ compiler on PATH (pip may only
#     take wheels), times that install, and runs `python -m singa_lite`, the README's main job and tests/unit
#     against the installed wheel, from a copy of the checkout without its singa_lite/ folder; twice: the wheel
#     of this machine's g++ (tagged for its glibc, manylinux_2_34+ on Debian 12), and the portable one of
#     `tools/build_wheel.sh --glibc 2.28` (zig's clang, LLVM's libomp), which must be tagged manylinux_2_28 or
#     older;
#  2. where nvcc is found, builds the CUDA wheel (singa-lite-cudaNNx, sm_80 + sm_90 + PTX) and checks that it
#     imports on this machine without a GPU and without NVIDIA's libraries, and reports what is missing.
# Exits non-zero on any failure. `.ci/wheels.sh --cpu-only` leaves out the CUDA wheel (a compile of minutes).
set -euo pipefail
cuda=1
case "${1:-}" in
  "") ;;
  --cpu-only) cuda=0 ;;
  *) echo "wheels.sh: unknown argument '$1' (only --cpu-only)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
root="$(pwd)"
python="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
total_start=$(date +%s)

# ---------------------------------------------------------------- CPU wheels
start=$(date +%s)
tools/build_wheel.sh --python "$python" --variant cpu --out "$tmp/wheelhouse"
echo "CPU wheel (g++) built and repaired in $(( $(date +%s) - start )) s"
wheel="$(ls "$tmp"/wheelhouse/singa_lite-*.whl)"
case "$(basename "$wheel")" in
  *manylinux_*_x86_64.whl) ;;
  *) echo "not a manylinux wheel: $wheel" >&2; exit 1 ;;
esac
start=$(date +%s)
tools/build_wheel.sh --python "$python" --variant cpu --glibc 2.28 --out "$tmp/wheelhouse-glibc2.28"
echo "CPU wheel (zig, glibc 2.28) built and repaired in $(( $(date +%s) - start )) s"
portable_wheel="$(ls "$tmp"/wheelhouse-glibc2.28/singa_lite-*.whl)"
# The oldest glibc among its platform tags (manylinux_2_27_x86_64.manylinux_2_28_x86_64 -> 27): 28 or less lets
# Ubuntu 20.04+, RHEL 8+ and Debian 10+ install it.
glibc_minor="$(basename "$portable_wheel" | grep -o 'manylinux_2_[0-9]*_x86_64' | sed 's/manylinux_2_\([0-9]*\)_.*/\1/' | sort -n | head -1)"
[ -n "$glibc_minor" ] && [ "$glibc_minor" -le 28 ] ||
  { echo "the --glibc 2.28 wheel is not tagged manylinux_2_28 or older: $(basename "$portable_wheel")" >&2; exit 1; }
echo "portable CPU wheel: $(basename "$portable_wheel") (installs on glibc >= 2.$glibc_minor)"

# A PATH with every program of today's PATH except the compilers: links to each executable, compilers left out.
nocc="$tmp/nocc-bin"
mkdir -p "$nocc"
IFS=: read -r -a path_dirs <<< "$PATH"
for dir in "${path_dirs[@]}"; do
  [ -d "$dir" ] || continue
  for exe in "$dir"/*; do
    name="$(basename "$exe")"
    case "$name" in
      cc|c++|gcc|g++|cpp|clang|clang++|nvcc|zig|ld|*-gcc|*-g++|*-gcc-[0-9]*|*-g++-[0-9]*|gcc-[0-9]*|g++-[0-9]*|clang-[0-9]*|clang++-[0-9]*) continue ;;
    esac
    [ -x "$exe" ] && [ ! -d "$exe" ] && [ ! -e "$nocc/$name" ] && ln -s "$exe" "$nocc/$name"
  done
done
run_path="$nocc"
for compiler in cc c++ gcc g++ clang nvcc; do
  if PATH="$run_path" command -v "$compiler" >/dev/null; then
    echo "the no-compiler PATH still finds $compiler: $(PATH="$run_path" command -v "$compiler")" >&2; exit 1
  fi
done
echo "no C/C++/CUDA compiler on the test PATH (cc, c++, gcc, g++, clang, nvcc all missing)"

# The checkout's files without singa_lite/, so that only the installed package can be imported.
run_dir="$tmp/run"
git ls-files -z --cached --others --exclude-standard | "$python" -c '
import os, shutil, sys
dest = sys.argv[1]
for rel in sys.stdin.read().split("\0"):
    if rel and not rel.startswith("singa_lite/") and os.path.isfile(rel):
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(rel, os.path.join(dest, rel))
' "$run_dir"

# Installs one CPU wheel into a fresh venv the way a user does and runs the checks against it, from run_dir.
# The venv folders keep 4-letter names: tests/unit/test_gpu_check_script.py fails when the interpreter's path is
# 4 characters longer (tools/gpu_check.sh's report cuts a line at a byte count, here inside a UTF-8 quote).
check_cpu_wheel() {
  local wheel="$1" label="$2" venv="$tmp/$3"
  "$python" -m venv "$venv"
  local run_path="$venv/bin:$nocc"
  # The install a user gets: the wheel and its dependencies (numpy, scipy-openblas32; libomp is in the wheel),
  # wheels only.
  start=$(date +%s.%N)
  PATH="$run_path" "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: "$wheel"
  local install_s
  install_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "installing the $label CPU wheel and its dependencies took $install_s s (goal: <= 15 s)"
  # A compile from source takes minutes: a slow install means the wheel was not used.
  awk -v s="$install_s" 'BEGIN { exit !(s <= 60) }' || { echo "install took $install_s s: over 60 s" >&2; exit 1; }
  PATH="$run_path" "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: "$wheel[test]"

  cd "$run_dir"
  PATH="$run_path" python -c '
import os, sys
import singa_lite
where = os.path.realpath(singa_lite.__file__)
assert where.startswith(os.path.realpath(sys.prefix) + os.sep), f"singa_lite imported from {where}, not the venv {sys.prefix}"
print("singa_lite", singa_lite.__version__, "imported from", where)
'
  PATH="$run_path" python -m singa_lite
  start=$(date +%s)
  PATH="$run_path" python examples/mnist_dist.py
  echo "examples/mnist_dist.py took $(( $(date +%s) - start )) s"
  PATH="$run_path" python -m pytest -q -p no:cacheprovider tests/unit
  cd "$root"
}

check_cpu_wheel "$wheel" g++ venv
check_cpu_wheel "$portable_wheel" "glibc 2.28" venz

# ---------------------------------------------------------------- CUDA wheel
nvcc_bin="${CUDACXX:-$(command -v nvcc || true)}"
if [ "$cuda" = 0 ]; then
  echo "--cpu-only: the CUDA wheel is not built"
elif [ -z "$nvcc_bin" ]; then
  echo "nvcc not found: the CUDA wheel is not built here"
else
  nvcc_major="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  variant="cuda${nvcc_major}x"
  start=$(date +%s)
  # nice: the CUDA compile is long and should not starve the rest of the machine.
  nice -n 10 tools/build_wheel.sh --python "$python" --variant "$variant" --out "$tmp/cuda-wheelhouse"
  echo "CUDA wheel ($variant) built and repaired in $(( $(date +%s) - start )) s"
  cuda_wheel="$(ls "$tmp"/cuda-wheelhouse/singa_lite_"$variant"-*.whl)"
  cuda_venv="$tmp/cuda-venv"
  "$python" -m venv "$cuda_venv"
  # Its metadata names NVIDIA's wheels; the check resolves them without installing them (they are GBs).
  PATH="$run_path" "$cuda_venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: \
    --dry-run --report "$tmp/cuda-report.json" "$cuda_wheel"
  "$cuda_venv/bin/python" - "$tmp/cuda-report.json" <<'EOF'
import json, sys
names = {item["metadata"]["name"].lower() for item in json.load(open(sys.argv[1]))["install"]}
wanted = {"nvidia-cublas", "nvidia-cudnn", "nvidia-nccl", "nvidia-cuda-runtime"}
missing = [w for w in wanted if not any(n.startswith(w) for n in names)]
assert not missing, f"the CUDA wheel does not depend on {missing}; it would install {sorted(names)}"
print("the CUDA wheel pulls in", ", ".join(sorted(n for n in names if n.startswith("nvidia"))))
EOF
  # Without NVIDIA's wheels and without a GPU: it must import, and say what is missing.
  PATH="$run_path" "$cuda_venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: \
    numpy scipy-openblas32
  echo "installing the CUDA wheel without NVIDIA's wheels (pip names them as missing: on purpose)"
  PATH="$run_path" "$cuda_venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: \
    --no-deps "$cuda_wheel"
  cd "$run_dir"
  report="$(PATH="$run_path" "$cuda_venv/bin/python" -m singa_lite)"
  cd "$root"
  echo "$report"
  grep -q "compiled with nvcc $nvcc_major" <<< "$report" || { echo "the CUDA wheel does not report nvcc $nvcc_major" >&2; exit 1; }
  grep -q "0 GPU(s) visible" <<< "$report" || { echo "the CUDA wheel's report does not say that no GPU is visible" >&2; exit 1; }
fi
echo ".ci/wheels.sh took $(( $(date +%s) - total_start )) s"
