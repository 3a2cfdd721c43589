#!/usr/bin/env bash
# The GPU checks of singa_lite in one call (docs/gpu.md, "Running the GPU checks"): what the machine has, the build,
# what the build sees, the GPU test suite, the examples on the GPU, the GPU benchmarks, the CPU test suite (last:
# it needs no GPU, so it is what a deadline should cut first). Each
# step's full output goes to $OUT/<step>.log (default folder: ./gpu-check-out), the GPU tests' to gpu-tests.xml too:
# eight files. A table of the steps is printed last, so the end of the output says what happened.
#
#   tools/gpu_check.sh                      # every step: info build report test examples bench cpu
#   tools/gpu_check.sh build report test    # some steps
#   DEADLINE=540 tools/gpu_check.sh         # all of it within 540 s: each step gets what is left, at most its own
#                                           # limit; a step that would start with under 20 s left is skipped
#
# Offline (a GPU machine reaches no package registry): what the image lacks comes from the wheel folder that
# travels with the tree, gpu-wheels/ (WHEELS=DIR for another), made here by `tools/gpu_wheels.sh prepare`; the build
# step installs from it what is not installed yet, without asking any index.
#
# The test step sets SINGA_LITE_REQUIRE_GPU=1: without a usable GPU (no device, a driver older than the build's
# CUDA) it fails with the reason instead of skipping every GPU test and passing.
#
# PYTHON (default python3) is the interpreter; STEP_LIMIT (seconds) overrides every step's own limit. A step that
# fails does not stop the others; the exit status is 1 when any failed or was skipped.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-check-out}
py=${PYTHON:-python3}
wheels=${WHEELS:-gpu-wheels}
jobs=$(nproc 2>/dev/null || echo 4)
# nvcc where CUDA images install it, when it is not on PATH already (the build needs it: SINGA_LITE_CUDA=ON)
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-1[0-9]*/bin; do
    [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
  done
fi
start_all=$(date +%s)
# every crash prints the Python stack of each thread (a segfault says where it happened)
export PYTHONFAULTHANDLER=1
# the report step's probes (tools/gpu_probe.sh) write here a setting under which the CPU and GPU probes pass when
# plain runs crash; the later steps run under it and say so in their logs
export PROBE_ENV=${PROBE_ENV:-/tmp/singa_lite_probe.env}
rm -f "$PROBE_ENV"
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info build report test examples bench cpu)

# Each step's own limit in seconds, for the 16-core GPU machine, where the run has to end inside one 10-minute call
# (DEADLINE=540). Estimates: the build is the long pole, a few minutes, bounded below by the longest file
# (csrc/cpu/elementwise.cpp), which no core count shortens; measured times: docs/gpu.md, "Running the GPU checks".
declare -A own=([info]=30 [build]=420 [report]=150 [test]=300 [examples]=240 [bench]=180 [cpu]=240)

rows=()
failed=0
run_step() {  # name, then the command; output to $out/name.log, a row for the table
  local name=$1 start rc limit left
  shift
  limit=${STEP_LIMIT:-${own[$name]:-600}}
  if [ -n "${DEADLINE:-}" ]; then
    left=$((DEADLINE - ($(date +%s) - start_all)))
    if [ "$left" -lt 20 ]; then
      failed=1
      rows+=("$(printf '%-10s %-9s %5ss  %s' "$name" "skipped" 0 "out of time (DEADLINE=$DEADLINE s)")")
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  start=$(date +%s)
  if declare -F "$1" >/dev/null; then  # a step function: timeout runs programs, so through bash
    timeout --kill-after=10 "$limit" bash -c "$1" >"$out/$name.log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  fi
  rc=$?
  [ $rc -ne 0 ] && failed=1
  [ $rc -eq 124 ] && echo "(stopped after its limit of $limit s)" >>"$out/$name.log"
  rows+=("$(printf '%-10s rc=%-6s %5ss  %s' "$name" "$rc" "$(($(date +%s) - start))" \
    "$(grep -v '^\s*$' "$out/$name.log" | tail -n 1 | cut -c1-100)")")
}

step_info() {
  date -u
  nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi: not found"
  nvcc --version | tail -n 2 || echo "nvcc: not found"
  "$py" -c 'import sys, numpy; print("python", sys.version.split()[0], sys.executable, "numpy", numpy.__version__)'
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' \
    || echo "torch: not importable (bench part a needs it)"
  "$py" -c 'import cupy; print("cupy", cupy.__version__)' || echo "cupy: not importable"
  # the C++ toolchain the build will use, and whether its libstdc++ is a shared library or a linker script that
  # links part of it statically (a devtoolset-style GCC), which matters when numpy's libstdc++ is loaded first
  local cxx
  cxx=$(command -v "${CXX:-g++}" || true)
  echo "c++: $cxx $("$cxx" -dumpfullversion 2>/dev/null); CXX=${CXX:-} CXXFLAGS=${CXXFLAGS:-} LDFLAGS=${LDFLAGS:-}"
  ls -l /usr/bin/g++* /usr/bin/c++ 2>/dev/null
  local so
  so=$("$cxx" -print-file-name=libstdc++.so 2>/dev/null)
  echo "libstdc++.so: $so"; file -L "$so" 2>/dev/null; head -c 400 "$so" 2>/dev/null | grep -a -i "input\|group" || true
  echo "libstdc++.a: $("$cxx" -print-file-name=libstdc++.a 2>/dev/null)"
  ls "$(dirname "$so")" 2>/dev/null | grep -i "stdc++" | head
  ldconfig -p | grep "libstdc++" || true
  "$py" -m pip list 2>/dev/null | grep -iE '^(cmake|ninja|pybind11|scikit-build-core|scipy-openblas32|hypothesis|pytest|pytest-xdist|mpi4py|nvidia-(cublas|cudnn|nccl)[a-z0-9-]*) ' || true
}

step_build() {
  if [ -d "$wheels" ]; then
    PYTHON="$py" tools/gpu_wheels.sh install "$wheels" || return 1
  else
    echo "no wheel folder $wheels: building with what is installed"
  fi
  # --no-index: nothing is fetched (the machine has no registry); the build dependencies are installed already.
  SINGA_LITE_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$py" -m pip install --no-index --no-build-isolation \
    --no-deps -v -e . || return 1
  # which libstdc++ the extension uses: shared (listed by ldd) or parts of it linked in (its own std:: symbols)
  local core
  core=$("$py" -c 'import importlib.util as u; print(u.find_spec("singa_lite._core").origin)')
  echo "extension: $core"; ldd "$core"
  echo "std::locale / codecvt / ostream symbols defined in it: $(nm -C --defined-only "$core" 2>/dev/null |
    grep -c 'std::locale\|std::codecvt\|std::basic_ostream')"
  "$py" -c 'import singa_lite; assert singa_lite.build_info()["cuda"]["compiled"]; print("built with CUDA")'
}

probe_settings() {  # the probes' setting, if they kept one
  if [ -s "$PROBE_ENV" ]; then
    echo "running with: $(cat "$PROBE_ENV") (kept by tools/gpu_probe.sh: plain runs crashed)"
    # shellcheck disable=SC1090
    . "$PROBE_ENV"
  fi
}

step_report() {
  "$py" -m singa_lite || return  # with its status: no interpreter (127), an import that fails
  PYTHON="$py" tools/gpu_probe.sh
}

step_test() {
  probe_settings
  # in 4 processes where pytest-xdist is installed: a test that crashes its process is reported and its process
  # replaced, instead of ending the whole suite. The tests that fill the GPU's memory (gpu_exclusive) run after
  # them, alone: beside them the others found no memory (the first GPU run).
  local parallel=() rc=0
  "$py" -c 'import xdist' 2>/dev/null && parallel=(-n 4 --dist loadfile)
  SINGA_LITE_REQUIRE_GPU=1 "$py" -m pytest -q -ra -p no:cacheprovider "${parallel[@]}" -m "not gpu_exclusive" \
    tests/gpu --junitxml="$out/gpu-tests.xml" || rc=1
  echo "== the tests that fill the GPU, alone"
  SINGA_LITE_REQUIRE_GPU=1 "$py" -m pytest -q -ra -p no:cacheprovider -m gpu_exclusive tests/gpu || rc=1
  return $rc
}

step_cpu() {
  probe_settings
  # the CPU suite, in parallel where pytest-xdist is installed (the GPU machine has it)
  local parallel=()
  "$py" -c 'import xdist' 2>/dev/null && parallel=(-n "$((jobs < 8 ? jobs : 8))")
  "$py" -m pytest -q -p no:cacheprovider "${parallel[@]}" tests/unit
}

step_examples() {
  probe_settings
  local ok=0
  echo "== mnist_dist, 1 rank on cuda:0, NCCL, the parent having initialised CUDA (spawned ranks)"
  "$py" -c 'import runpy, sys; from singa_lite import device; assert device.cuda_is_available();
sys.argv = ["mnist_dist.py"] + sys.argv[1:]; runpy.run_path("examples/mnist_dist.py", run_name="__main__")' \
    --device cuda --world-size 1 --epochs 2 || ok=1
  echo "== mnist_dist, sparseTopK"
  "$py" examples/mnist_dist.py --device cuda --world-size 1 --epochs 1 --dist-option sparseTopK || ok=1
  echo "== singa-run --backend nccl"
  "$py" -m singa_lite.run -np 1 --backend nccl examples/mnist_dist.py --launcher singa-run --device cuda \
    --epochs 1 || ok=1
  echo "== multi_device over NCCL's clique"
  "$py" examples/multi_device.py --device cuda --replicas 1 --allreduce nccl || ok=1
  echo "== resnet_cifar10 on generated data"
  "$py" examples/resnet_cifar10.py --device cuda --world-size 1 --epochs 1 || ok=1
  [ $ok -eq 0 ] && echo "examples: all ran" || echo "examples: some failed (see above)"
  return $ok
}

step_bench() {
  probe_settings
  "$py" bench/bench_gpu.py --repeat 3 --steps 10
}

export -f probe_settings step_info step_build step_report step_test step_cpu step_examples step_bench
export py out wheels jobs

for s in "${steps[@]}"; do
  case "$s" in
    info) run_step info step_info ;;
    build) run_step build step_build ;;
    report) run_step report step_report ;;
    test) run_step test step_test ;;
    examples) run_step examples step_examples ;;
    cpu) run_step cpu step_cpu ;;
    bench) run_step bench step_bench ;;
    *) echo "unknown step '$s' (steps: info build report test examples bench cpu)" >&2; exit 2 ;;
  esac
done

echo
echo "singa_lite GPU checks ($(date -u +%F), $(($(date +%s) - start_all)) s); logs in $out"
printf '%s\n' "${rows[@]}"
exit $failed
