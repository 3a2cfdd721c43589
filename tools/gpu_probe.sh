#!/usr/bin/env bash
# Small probes, each in its own process with Python's fault handler on, that say where a crash of the GPU checks
# comes from (tools/gpu_check.sh runs this in its report step). Each probe prints "ok" or its exit status and, on a
# crash, the Python stack of every thread. The variants rerun the CPU probe under one changed setting at a time;
# the first setting under which the CPU and GPU probes both pass is written to $PROBE_ENV (a file of `export`
# lines) so that the later steps of the check still run and report, with that setting named in their logs.
#
#   tools/gpu_probe.sh          # PYTHON (default python3), PROBE_ENV (default /tmp/singa_lite_probe.env)
set -u
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
env_file=${PROBE_ENV:-/tmp/singa_lite_probe.env}
: >"$env_file"

cpu_probe='
import numpy as np
from singa_lite import autograd, tensor, device
a = tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
print("add", tensor.to_numpy(a + a).sum(), flush=True)
print("matmul", tensor.to_numpy(autograd.matmul(a, tensor.from_numpy(np.ones((4, 2), np.float32)))).sum(), flush=True)
x = tensor.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32))
from singa_lite import layer
autograd.training = True
conv = layer.Conv2d(4, 3, padding=1)
y = conv(x)
loss = autograd.sum(y)
grads = list(autograd.backward(loss))
print("conv fwd/bwd", tensor.to_numpy(y).shape, len(grads), flush=True)
'
gpu_probe='
import numpy as np
from singa_lite import autograd, tensor, device
dev = device.create_cuda_gpu()
print("device", dev, flush=True)
a = tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), dev)
print("add", tensor.to_numpy(a + a).sum(), flush=True)
b = tensor.from_numpy(np.ones((4, 2), np.float32), dev)
print("matmul", tensor.to_numpy(autograd.matmul(a, b)).sum(), flush=True)
x = tensor.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32), dev)
from singa_lite import layer
autograd.training = True
conv = layer.Conv2d(4, 3, padding=1)
y = conv(x)
grads = list(autograd.backward(autograd.sum(y)))
print("conv fwd/bwd", tensor.to_numpy(y).shape, len(grads), flush=True)
'

probe() {  # name, env assignments..., then -- and the code
  local name=$1 rc
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "== probe $name ${envs[*]}"
  env "${envs[@]}" PYTHONFAULTHANDLER=1 timeout 120 "$py" -c "$1" 2>&1 | tail -n 40
  rc=${PIPESTATUS[0]}
  echo "-- $name: $([ "$rc" -eq 0 ] && echo ok || echo "exit status $rc")"
  return "$rc"
}

probe import -- 'import singa_lite, sys; print(singa_lite.__file__, sys.version)'
probe cpu -- "$cpu_probe"; cpu_rc=$?
# the GPU probe where a GPU is usable; elsewhere (a development machine) its absence is no failure
if "$py" -c 'import sys; from singa_lite import device; sys.exit(0 if device.cuda_is_available() else 1)' \
    2>/dev/null; then
  probe gpu -- "$gpu_probe"; gpu_rc=$?
else
  echo "== probe gpu: skipped, no usable GPU ($("$py" -c 'from singa_lite import device
print(device.cuda_absent_reason())' 2>&1 | tail -n 1))"
  gpu_rc=0
  gpu_probe='pass'
fi
probe torch-first -- "import torch; $cpu_probe"
if [ $cpu_rc -ne 0 ] || [ $gpu_rc -ne 0 ]; then
  # one setting at a time; the first that mends both probes is kept for the rest of the check
  # numpy 2.4 (the image has 2.5), when gpu-wheels/probe holds its wheel (tools/gpu_wheels.sh prepare puts it there)
  np24=()
  if ls gpu-wheels/probe/numpy-2.4*.whl >/dev/null 2>&1 &&
      "$py" -m pip install -q --no-index --no-deps --target /tmp/singa_lite_np24 gpu-wheels/probe/numpy-2.4*.whl; then
    np24=(PYTHONPATH=/tmp/singa_lite_np24)
  fi
  # singa_lite imported before anything else (numpy included), through a sitecustomize.py on PYTHONPATH: the
  # first GPU machine crashed at import only when numpy was loaded first
  mkdir -p /tmp/singa_lite_first && echo 'import singa_lite  # noqa: F401' >/tmp/singa_lite_first/sitecustomize.py
  for setting in PYTHONPATH=/tmp/singa_lite_first "${np24[@]}" OMP_NUM_THREADS=1 SINGA_LITE_ISA=avx2 SINGA_LITE_CUDNN=0 SINGA_LITE_MALLOC=keep \
      SINGA_LITE_NUMPY_BLAS=keep CUDA_VISIBLE_DEVICES=; do
    probe "cpu-with-$setting" "$setting" -- "$cpu_probe" || continue
    [ "$setting" = CUDA_VISIBLE_DEVICES= ] && { echo "only without the GPU: nothing kept"; break; }
    probe "gpu-with-$setting" "$setting" -- "$gpu_probe" || continue
    echo "export $setting" >"$env_file"
    echo "kept for the later steps: $setting"
    break
  done
  if command -v cuda-gdb >/dev/null; then
    echo "== native stack of the first failing probe (cuda-gdb)"
    code=$cpu_probe; [ $cpu_rc -eq 0 ] && code=$gpu_probe
    timeout 120 cuda-gdb -batch -ex run -ex bt -ex 'info threads' --args "$py" -c "$code" 2>&1 | tail -n 60
  fi
fi
[ $cpu_rc -eq 0 ] && [ $gpu_rc -eq 0 ]
