#!/usr/bin/env bash
# The GPU checks of singa_lite in as few calls as possible (docs/gpu.md, "Running the GPU checks"): build, what
# the build sees, the GPU test suite, the examples on the GPU, the GPU benchmarks. Each step's full output goes to
# $OUT/<step>.log (default folder: ./gpu-check-out); a table of the steps is printed last, so the end of the output
# says what happened.
#
#   tools/gpu_check.sh                      # every step: info build report test examples bench
#   tools/gpu_check.sh build report test    # some steps (a machine that limits one call's time: split them)
#   WHEELS=/path/to/wheels tools/gpu_check.sh build ...   # install what is missing from these wheels, offline
#
# PYTHON (default python3) is the interpreter; STEP_LIMIT (seconds, default 900) bounds every step. A step that
# fails does not stop the others; the exit status is 1 when any failed.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-check-out}
py=${PYTHON:-python3}
limit=${STEP_LIMIT:-900}
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info build report test examples bench)

rows=()
failed=0
run_step() {  # name, then the command; output to $out/name.log, a row for the table
  local name=$1 start rc
  shift
  start=$(date +%s)
  if declare -F "$1" >/dev/null; then  # a step function: timeout runs programs, so through bash
    timeout --kill-after=10 "$limit" bash -c "$1" >"$out/$name.log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  fi
  rc=$?
  [ $rc -ne 0 ] && failed=1
  rows+=("$(printf '%-16s rc=%-4s %5ss  %s' "$name" "$rc" "$(($(date +%s) - start))" \
    "$(grep -v '^\s*$' "$out/$name.log" | tail -n 1 | cut -c1-90)")")
}

step_info() {
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi: not found"
  nvcc --version | tail -n 2 || echo "nvcc: not found"
  "$py" -c 'import sys, numpy; print("python", sys.version.split()[0], "numpy", numpy.__version__)'
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' \
    || echo "torch: not importable (bench part a needs it)"
}

step_build() {
  if [ -n "${WHEELS:-}" ]; then  # offline: the build needs scipy-openblas32 besides what such an image has
    "$py" -m pip install --no-index --find-links "$WHEELS" "$WHEELS"/*.whl || return 1
  fi
  SINGA_LITE_CUDA=ON "$py" -m pip install --no-build-isolation --no-deps -v -e . || return 1
  "$py" -c 'import singa_lite; assert singa_lite.build_info()["cuda"]["compiled"]; print("built with CUDA")'
}

step_examples() {
  local ok=0
  echo "== mnist_dist, 1 rank on cuda:0, NCCL"
  "$py" examples/mnist_dist.py --device cuda --world-size 1 --epochs 2 || ok=1
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

export -f step_info step_build step_examples
export py out

for s in "${steps[@]}"; do
  case "$s" in
    info) run_step info step_info ;;
    build) run_step build step_build ;;
    report) run_step report "$py" -m singa_lite ;;
    test) run_step test "$py" -m pytest -q -ra -p no:cacheprovider tests/gpu --junitxml="$out/gpu-tests.xml" ;;
    examples) run_step examples step_examples ;;
    bench) run_step bench "$py" bench/bench_gpu.py ;;
    *) echo "unknown step '$s' (steps: info build report test examples bench)" >&2; exit 2 ;;
  esac
done

echo
echo "singa_lite GPU checks ($(date -u +%F)); logs in $out"
printf '%s\n' "${rows[@]}"
exit $failed
