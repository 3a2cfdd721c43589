#!/usr/bin/env bash
# The wheels a GPU machine without a package registry lacks, carried in an ignored folder next to the tree
# (gpu-wheels/, at most 64 MiB with the tree; see docs/gpu.md, "Running the GPU checks").
#
#   tools/gpu_wheels.sh prepare [DIR]   # here, with network: download them into DIR (default gpu-wheels)
#   tools/gpu_wheels.sh install [DIR]   # there, offline: install those whose distribution is not installed yet
#
# What the GPU machine's image lacks for the build, `python -m singa_lite` and the CPU tests: scipy-openblas32 (the
# CPU BLAS, a build and run-time dependency) and hypothesis with its two dependencies (tests/unit's property tests).
# The image has the rest (nvcc 13, CMake, ninja, pybind11, scikit-build-core, numpy, pytest, scikit-learn, mpi4py,
# CuPy, PyTorch, the nvidia-* wheels; docs/gpu.md). PYTHON (default python3) is the interpreter that pip runs with;
# GPU_PYTHON_VERSION (default 3.12, the image's) the Python the wheels are for; NEEDED overrides the list.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
needed=${NEEDED:-"scipy-openblas32>=0.3.27 hypothesis attrs sortedcontainers"}
limit_mib=48  # of the 64 MiB a call may carry: the tracked tree (~4 MiB) and room for it to grow

cmd=${1:-}
dir=${2:-gpu-wheels}
case "$cmd" in
  prepare)
    rm -rf "$dir"
    mkdir -p "$dir"
    # one version of each (two stop an offline install); --no-deps: the list names every dependency itself
    # shellcheck disable=SC2086
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      --platform any -d "$dir" $needed
    # numpy 2.4 for one of tools/gpu_probe.sh's variants (the image has numpy 2.5): in probe/, which `install` skips
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$dir/probe" "numpy>=2.4,<2.5"
    ls -l "$dir"
    kib=$(du -sk "$dir" | cut -f1)
    echo "$dir: $((kib / 1024)) MiB in $(find "$dir" -name '*.whl' | wc -l) wheels (limit ${limit_mib} MiB)"
    [ "$kib" -le $((limit_mib * 1024)) ] || { echo "$dir is larger than ${limit_mib} MiB" >&2; exit 1; }
    ;;
  install)
    [ -d "$dir" ] || { echo "no wheel folder '$dir' (make it with: tools/gpu_wheels.sh prepare)" >&2; exit 1; }
    missing=()
    for whl in "$dir"/*.whl; do
      [ -e "$whl" ] || continue
      name=$(basename "$whl" | cut -d- -f1)
      if "$py" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$name" 2>/dev/null; then
        echo "installed already: $name $("$py" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")"
      else
        missing+=("$whl")
      fi
    done
    if [ ${#missing[@]} -gt 0 ]; then
      "$py" -m pip install --no-index --no-deps --no-cache-dir --find-links "$dir" "${missing[@]}"
    fi
    ;;
  *)
    echo "usage: tools/gpu_wheels.sh prepare|install [DIR]" >&2
    exit 2
    ;;
esac
