#!/usr/bin/env bash
# CI for the binary wheels (tools/build_wheel.sh), called by .ci/run:
#  1. builds and repairs the two CPU wheels of this Python: the g++ one (tagged for this machine's glibc,
#     manylinux_2_34+ on Debian 12) and the portable one of `tools/build_wheel.sh --glibc 2.28` (zig's clang, LLVM's
#     libomp), which must be tagged manylinux_2_28 or older; installs each into a fresh venv with no C/C++ compiler
#     on PATH (pip may only take wheels), times that install, and runs `python -m singa_lite` and the README's main
#     job against the installed wheel, from a copy of the checkout without its singa_lite/ folder; then the whole
#     of tests/unit against one of them (FULL_TESTS_ON below) and a smoke subset against the other (the main CI
#     run has already run the whole suite against the editable build of the same sources);
#  2. where nvcc is found, builds the CUDA wheel of its major version (singa-lite-cudaNNx, sm_80 + sm_90 + PTX),
#     checks with cuobjdump that it carries that GPU code, that its metadata depends on NVIDIA's runtime, cuBLAS,
#     cuDNN and NCCL wheels, and that it imports on this machine without a GPU and without NVIDIA's libraries and
#     reports what is missing.
# Under CI (CI=true) the compiles go through ccache when it is installed (.ci/run installs it), with a cache of
# CI's own (~/.cache/singa_lite/ccache-ci) that only CI's fresh clones write: on a machine that ran CI before, a
# rebuild compiles only what changed. Not for a checkout that people edit during the build (tools/build_wheel.sh
# says why).
#
#  3. with --aarch64, cross-compiles the aarch64 CPU wheel (`tools/build_wheel.sh --glibc 2.28 --arch aarch64`) and
#     checks it without running it: tagged manylinux_2_28_aarch64 or older, auditwheel's report, every ELF file in it
#     built for aarch64, no glibc symbol newer than 2.28. Running it needs emulation: tools/aarch64_check.sh.
#
#   .ci/wheels.sh [--cpu-only] [--cuda12] [--aarch64] [--pythons "3.10 3.12 3.13"]
#   --cpu-only  leaves out the CUDA wheels
#   --cuda12    also builds and checks singa-lite-cuda12x (nvcc 12.4 assembled by tools/cuda12_toolkit.sh when the
#               machine's nvcc is 13); .ci/run passes it: 207 s more with a cold cache here, far less warm
#   --aarch64   also cross-compiles and checks the aarch64 CPU wheel (3. above): an opt-in, as --cuda12: 195 s more with
#               a cold cache here (zig compiling libc++ for aarch64 once, then the sources; 2026-11-24, load ~1.4), 5-25 s
#               warm; over the 3 minutes a default step may add cold
#   --pythons   also builds the portable CPU wheel for each of these CPython versions (found as pythonX.Y on PATH
#               or under pyenv's versions), installs it like the others and runs the smoke subset against it
# Exits non-zero on any failure.
set -euo pipefail
cuda=1
cuda12=0
aarch64=0
pythons=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-only) cuda=0; shift ;;
    --cuda12) cuda12=1; shift ;;
    --aarch64) aarch64=1; shift ;;
    --pythons) pythons="$2"; shift 2 ;;
    *) echo "wheels.sh: unknown argument '$1' (expected --cpu-only, --cuda12, --aarch64, --pythons \"3.10 ...\")" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
root="$(pwd)"
python="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
total_start=$(date +%s)
if [ "${CI:-}" = true ] && command -v ccache >/dev/null; then
  export SINGA_LITE_CCACHE=1 CCACHE_DIR="${SINGA_LITE_CCACHE_DIR:-$HOME/.cache/singa_lite/ccache-ci}"
  echo "ccache: $CCACHE_DIR ($(ccache --show-stats | grep -i "cache size" | sed 's/^ *//'))"
fi

# Which CPU wheel runs the whole of tests/unit ("portable": the --glibc 2.28 one; "gpp": the g++ one). The other
# runs SMOKE_TESTS: the compiled kernels against numpy, the OpenMP runtime the wheel bundles, autograd, the
# packaging metadata. One line to change when the default CPU wheel changes.
FULL_TESTS_ON=portable
SMOKE_TESTS=(tests/unit/test_packaging.py tests/unit/test_core_matmul.py tests/unit/test_core_nn.py
             tests/unit/test_core_threads.py tests/unit/test_thread_pools.py tests/unit/test_autograd.py)

# ---------------------------------------------------------------- CPU wheels: build and repair
start=$(date +%s)
tools/build_wheel.sh --python "$python" --variant cpu --glibc native --out "$tmp/wheelhouse-gpp"
echo "CPU wheel (g++) built and repaired in $(( $(date +%s) - start )) s"
gpp_wheel="$(ls "$tmp"/wheelhouse-gpp/singa_lite-*.whl)"
case "$(basename "$gpp_wheel")" in
  *manylinux_*_x86_64.whl) ;;
  *) echo "not a manylinux wheel: $gpp_wheel" >&2; exit 1 ;;
esac

# The oldest glibc among a wheel's platform tags (manylinux_2_27_x86_64.manylinux_2_28_x86_64 -> 27): 28 or less
# lets Ubuntu 20.04+, RHEL 8+ and Debian 10+ install it.
check_portable_tag() {  # WHEEL [ARCH, default x86_64]
  local wheel="$1" arch="${2:-x86_64}" glibc_minor
  glibc_minor="$(basename "$wheel" | grep -o "manylinux_2_[0-9]*_$arch" | sed 's/manylinux_2_\([0-9]*\)_.*/\1/' | sort -n | head -1)"
  [ -n "$glibc_minor" ] && [ "$glibc_minor" -le 28 ] ||
    { echo "the --glibc 2.28 wheel is not tagged manylinux_2_28_$arch or older: $(basename "$wheel")" >&2; exit 1; }
  echo "portable CPU wheel ($arch): $(basename "$wheel") (installs on glibc >= 2.$glibc_minor)"
}
start=$(date +%s)
tools/build_wheel.sh --python "$python" --variant cpu --glibc 2.28 --out "$tmp/wheelhouse-portable"
echo "CPU wheel (zig, glibc 2.28) built and repaired in $(( $(date +%s) - start )) s"
portable_wheel="$(ls "$tmp"/wheelhouse-portable/singa_lite-*.whl)"
check_portable_tag "$portable_wheel"

# ---------------------------------------------------------------- the aarch64 wheel (built and inspected, not run)
if [ "$aarch64" = 1 ]; then
  start=$(date +%s)
  tools/build_wheel.sh --python "$python" --variant cpu --glibc 2.28 --arch aarch64 --out "$tmp/wheelhouse-aarch64"
  echo "aarch64 CPU wheel (zig cross build, glibc 2.28) built and repaired in $(( $(date +%s) - start )) s"
  aarch64_wheel="$(ls "$tmp"/wheelhouse-aarch64/singa_lite-*.whl)"
  check_portable_tag "$aarch64_wheel" aarch64
  pytag="$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  tools_py="$root/build/wheel/venv-$pytag/bin/python"  # build_wheel.sh's: auditwheel and its ELF reader (pyelftools)
  "$(dirname "$tools_py")/auditwheel" show "$aarch64_wheel"
  "$python" -m zipfile -e "$aarch64_wheel" "$tmp/unpacked-aarch64"
  "$tools_py" - "$tmp/unpacked-aarch64" <<'EOF'
import os, re, sys
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

root = sys.argv[1]
checked, newest = [], (0, 0)
for folder, _, files in os.walk(root):
    for name in files:
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
            f.seek(0)
            elf = ELFFile(f)
            rel = os.path.relpath(path, root)
            assert elf["e_machine"] == "EM_AARCH64", f"{rel} is built for {elf['e_machine']}, not aarch64"
            for section in elf.iter_sections():
                if isinstance(section, GNUVerNeedSection):
                    for _, versions in section.iter_versions():
                        for v in versions:
                            m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", v.name)
                            if m:
                                got = (int(m[1]), int(m[2]))
                                assert got <= (2, 28), f"{rel} needs {v.name}, newer than glibc 2.28"
                                newest = max(newest, got)
            checked.append(rel)
assert any(re.search(r"_core\.cpython-\d+-aarch64-linux-gnu\.so$", c) for c in checked), f"no aarch64 _core in {checked}"
print(f"aarch64 wheel: {len(checked)} ELF files, all aarch64, newest glibc symbol GLIBC_{newest[0]}.{newest[1]}:", ", ".join(sorted(checked)))
EOF
fi

# ---------------------------------------------------------------- the test environment
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
for compiler in cc c++ gcc g++ clang nvcc; do
  if PATH="$nocc" command -v "$compiler" >/dev/null; then
    echo "the no-compiler PATH still finds $compiler: $(PATH="$nocc" command -v "$compiler")" >&2; exit 1
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

# Installs one CPU wheel into a fresh venv of the interpreter $4 the way a user does and runs the checks against
# it from run_dir: tests "full" (tests/unit) or "smoke" (SMOKE_TESTS).
# The venv folders keep 4-letter names: tests/unit/test_gpu_check_script.py fails when the interpreter's path is
# 4 characters longer (tools/gpu_check.sh's report cuts a line at a byte count, here inside a UTF-8 quote).
check_cpu_wheel() {
  local wheel="$1" label="$2" venv="$tmp/$3" interpreter="$4" tests="$5"
  "$interpreter" -m venv "$venv"
  local run_path="$venv/bin:$nocc"
  # The install a user gets: the wheel and its dependencies (numpy, scipy-openblas32; the OpenMP runtime is in
  # the wheel), wheels only.
  local t0 install_s
  t0=$(date +%s.%N)
  PATH="$run_path" "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: "$wheel"
  install_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
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
  t0=$(date +%s)
  PATH="$run_path" python examples/mnist_dist.py
  echo "examples/mnist_dist.py took $(( $(date +%s) - t0 )) s"
  t0=$(date +%s)
  if [ "$tests" = full ]; then
    PATH="$run_path" python -m pytest -q -p no:cacheprovider tests/unit
  else
    PATH="$run_path" python -m pytest -q -p no:cacheprovider "${SMOKE_TESTS[@]}"
  fi
  echo "the $label wheel's $tests tests took $(( $(date +%s) - t0 )) s"
  cd "$root"
}

case "$FULL_TESTS_ON" in
  portable) gpp_tests=smoke; portable_tests=full ;;
  gpp) gpp_tests=full; portable_tests=smoke ;;
  *) echo "wheels.sh: FULL_TESTS_ON must be portable or gpp, got '$FULL_TESTS_ON'" >&2; exit 2 ;;
esac
check_cpu_wheel "$portable_wheel" "glibc 2.28" venz "$python" "$portable_tests"
check_cpu_wheel "$gpp_wheel" g++ venv "$python" "$gpp_tests"

# ---------------------------------------------------------------- CUDA wheels
# cuobjdump lists the GPU code a binary carries. NVIDIA's pip-installed CUDA 13 has none beside nvcc, so it comes
# from its own small wheel (nvidia-cuda-cuobjdump) when neither PATH nor nvcc's folder has it.
find_cuobjdump() {
  local nvcc_dir="$1" found
  for found in "$(command -v cuobjdump || true)" "$nvcc_dir/cuobjdump"; do
    [ -n "$found" ] && [ -x "$found" ] && { echo "$found"; return; }
  done
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$tmp/cuobjdump" \
    nvidia-cuda-cuobjdump >/dev/null
  "$python" -m zipfile -e "$(ls "$tmp"/cuobjdump/*.whl)" "$tmp/cuobjdump/pkg"
  found="$(find "$tmp/cuobjdump/pkg" -name cuobjdump -type f | head -1)"
  chmod +x "$found"
  echo "$found"
}

# Builds the CUDA wheel $1 (cuda13x / cuda12x) with nvcc $2 and checks it.
check_cuda_wheel() {
  local variant="$1" nvcc_bin="$2" nvcc_major="${1#cuda}"
  nvcc_major="${nvcc_major%x}"
  start=$(date +%s)
  # nice: the CUDA compile is long and should not starve the rest of the machine.
  if [ -n "$nvcc_bin" ]; then
    CUDACXX="$nvcc_bin" nice -n 10 tools/build_wheel.sh --python "$python" --variant "$variant" --out "$tmp/wheelhouse-$variant"
  else
    nice -n 10 tools/build_wheel.sh --python "$python" --variant "$variant" --out "$tmp/wheelhouse-$variant"
  fi
  echo "CUDA wheel ($variant) built and repaired in $(( $(date +%s) - start )) s"
  local cuda_wheel cuda_venv="$tmp/cv$nvcc_major" report cuobjdump
  cuda_wheel="$(ls "$tmp/wheelhouse-$variant"/singa_lite_"$variant"-*.whl)"

  # The GPU code: sm_80 and sm_90 machine code and PTX for newer GPUs (SINGA_LITE_CUDA_ARCHS' default).
  "$python" -m zipfile -e "$cuda_wheel" "$tmp/unpacked-$variant"
  cuobjdump="$(find_cuobjdump "$(dirname "${nvcc_bin:-$root/build/wheel/cuda12-toolkit/bin/nvcc}")")"
  "$cuobjdump" --list-elf --list-ptx "$tmp/unpacked-$variant"/singa_lite/_core*.so > "$tmp/gpu-code-$variant.txt"
  "$python" - "$tmp/gpu-code-$variant.txt" "$variant" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
elf = set(re.findall(r"^ELF file.*\.(sm_\d+)\.cubin$", text, re.M))
ptx = set(re.findall(r"^PTX file.*\.(sm_\d+)\.ptx$", text, re.M))
assert elf == {"sm_80", "sm_90"} and ptx == {"sm_90"}, f"the {sys.argv[2]} wheel carries machine code {sorted(elf)} and PTX {sorted(ptx)}; expected sm_80 + sm_90 and PTX sm_90"
print(f"the {sys.argv[2]} wheel carries machine code for", " and ".join(sorted(elf)), "and PTX for", *sorted(ptx))
EOF

  "$python" -m venv "$cuda_venv"
  # Its metadata names NVIDIA's wheels; the check resolves them without installing them (they are GBs).
  PATH="$cuda_venv/bin:$nocc" "$cuda_venv/bin/python" -m pip install -q --disable-pip-version-check \
    --only-binary :all: --dry-run --report "$tmp/cuda-report-$variant.json" "$cuda_wheel"
  "$cuda_venv/bin/python" - "$tmp/cuda-report-$variant.json" "$nvcc_major" <<'EOF'
import json, sys
names = {item["metadata"]["name"].lower() for item in json.load(open(sys.argv[1]))["install"]}
major = sys.argv[2]
# CUDA 12's wheels end in -cu12; CUDA 13's runtime and cuBLAS dropped the suffix, cuDNN and NCCL end in -cu13.
wanted = {"nvidia-cublas", "nvidia-cudnn", "nvidia-nccl", "nvidia-cuda-runtime"}
missing = [w for w in wanted if not any(n.startswith(w) for n in names)]
assert not missing, f"the CUDA wheel does not depend on {missing}; it would install {sorted(names)}"
wrong = [n for n in names if n.startswith("nvidia") and n.endswith(("-cu11", "-cu12", "-cu13")) and not n.endswith(f"-cu{major}")]
assert not wrong, f"the CUDA {major} wheel depends on another CUDA's wheels: {wrong}"
print("the CUDA wheel pulls in", ", ".join(sorted(n for n in names if n.startswith("nvidia"))))
EOF
  # Without NVIDIA's wheels and without a GPU: it must import, and say what is missing.
  PATH="$cuda_venv/bin:$nocc" "$cuda_venv/bin/python" -m pip install -q --disable-pip-version-check \
    --only-binary :all: numpy scipy-openblas32
  echo "installing the $variant wheel without NVIDIA's wheels (pip names them as missing: on purpose)"
  PATH="$cuda_venv/bin:$nocc" "$cuda_venv/bin/python" -m pip install -q --disable-pip-version-check \
    --only-binary :all: --no-deps "$cuda_wheel"
  cd "$run_dir"
  report="$(PATH="$cuda_venv/bin:$nocc" "$cuda_venv/bin/python" -m singa_lite)"
  cd "$root"
  echo "$report"
  grep -q "compiled with nvcc $nvcc_major\." <<< "$report" ||
    { echo "the $variant wheel does not report nvcc $nvcc_major" >&2; exit 1; }
  grep -q "0 GPU(s) visible" <<< "$report" ||
    { echo "the $variant wheel's report does not say that no GPU is visible" >&2; exit 1; }
}

nvcc_bin="${CUDACXX:-$(command -v nvcc || true)}"
if [ "$cuda" = 0 ]; then
  echo "--cpu-only: the CUDA wheels are not built"
else
  if [ -z "$nvcc_bin" ]; then
    echo "nvcc not found: the machine's CUDA wheel is not built here"
  else
    nvcc_major="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
    check_cuda_wheel "cuda${nvcc_major}x" "$nvcc_bin"
  fi
  if [ "$cuda12" = 1 ] && [ "${nvcc_major:-}" != 12 ]; then
    # No nvcc given: build_wheel.sh assembles CUDA 12.4 (tools/cuda12_toolkit.sh).
    CUDACXX="" check_cuda_wheel cuda12x ""
  fi
fi
# ---------------------------------------------------------------- other CPython versions (--pythons)
source tools/find_python.sh  # find_python X.Y: pythonX.Y on PATH, else pyenv's newest X.Y.* install
for version in $pythons; do
  interpreter="$(find_python "$version")" ||
    { echo "--pythons: no Python $version (neither python$version on PATH nor under pyenv's versions)" >&2; exit 1; }
  start=$(date +%s)
  tools/build_wheel.sh --python "$interpreter" --variant cpu --glibc 2.28 --out "$tmp/wheelhouse-py$version"
  echo "CPU wheel (zig, glibc 2.28) for Python $version built and repaired in $(( $(date +%s) - start )) s"
  wheel="$(ls "$tmp/wheelhouse-py$version"/singa_lite-*.whl)"
  check_portable_tag "$wheel"
  check_cpu_wheel "$wheel" "Python $version glibc 2.28" "v${version/./}" "$interpreter" smoke
done

echo ".ci/wheels.sh took $(( $(date +%s) - total_start )) s"
