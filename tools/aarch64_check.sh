#!/usr/bin/env bash
# Tests the aarch64 (64-bit ARM) wheel for real on this x86-64 machine, under emulation (qemu-user):
#
#   tools/aarch64_check.sh [--suite bookworm|trixie] [--wheel WHEEL] [--tests "tests/unit/a.py tests/unit/b.py"] [--no-tests] [--no-job] [-- PYTEST ARGS]
#
#   --suite     the Debian release of the arm64 root: bookworm (default; Debian 12, Python 3.11, in build/arm64-root)
#               or trixie (Debian 13, Python 3.13, in build/arm64-root-trixie)
#   --wheel     the wheel to test (default: built now with `tools/build_wheel.sh --glibc 2.28 --arch aarch64` for the
#               root's Python version, by this machine's pythonX.Y: on PATH or under pyenv's versions)
#   --tests     which test files run under emulation (default: DEFAULT_TESTS below); --no-tests runs none
#   --no-job    leaves out the README's main job (7-8 min under emulation)
#   after --    extra pytest arguments, e.g. -k "float16 or isa or shm"
#
# Steps, each skipped when already done (the script is idempotent; root only, it uses chroot and mount):
#  1. installs qemu-user-static and debootstrap (apt-get) when missing;
#  2. lets the kernel run aarch64 programs through qemu: mounts binfmt_misc when it is not and registers
#     qemu-aarch64 (Debian's /usr/lib/binfmt.d/qemu-aarch64.conf, flag F: the interpreter is opened once, so it
#     works inside the chroot). Without binfmt_misc a chroot cannot start arm64 programs, nor can the tests'
#     subprocesses: the script then stops and says so;
#  3. makes a Debian arm64 root in build/arm64-root[-trixie] (debootstrap --arch=arm64 --variant=minbase, python3 and
#     python3-venv included; its second stage runs under qemu), ~300 MB;
#  4. in it, a venv /opt/venv with numpy, pytest, hypothesis and scikit-learn from PyPI (aarch64 wheels) and the
#     wheel itself (reinstalled every run), and a copy of the checkout without singa_lite/ in /opt/src, so that
#     only the installed wheel can be imported;
#  5. runs there: `python -m singa_lite`, the README's main job (examples/mnist_dist.py: 2 ranks over the shm
#     backend) and the tests.
# /proc, /sys and a private /dev/shm are mounted into the root while it runs and unmounted at the end (without /sys,
# LLVM's libomp reads the x86 host's /proc/cpuinfo, which qemu passes through, and aborts in kmp_affinity.cpp).
# The emulated CPU: QEMU_CPU (default neoverse-n1: ARMv8.2 + NEON, the cores of AWS Graviton2 and Ampere Altra).
# Not qemu's default "max": it offers SME, OpenBLAS then takes its armv9sme kernels, and under this qemu (7.2,
# Debian 12) their dgemm returns wrong numbers (OpenBLAS's own cblas_dgemm called through ctypes, no singa_lite
# involved; right with QEMU_CPU=neoverse-n1 or a64fx, or OPENBLAS_CORETYPE=NEOVERSEN1).
# How long: the first run makes the Debian root and the venv (minutes); emulation runs the main job and the tests
# tens of times slower than natively, so --no-job and the default (smoke) tests keep a rerun short. The times of
# each step on the development machine: docs/release.md, "How long the checks take".
set -euo pipefail
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
suite=bookworm
# The compiled kernels against numpy, the instruction-set levels (aarch64 has one), the shm collectives (their spin
# uses `yield`, float16 takes the software conversion), threads, autograd, the packaging metadata.
DEFAULT_TESTS="tests/unit/test_isa_dispatch.py tests/unit/test_packaging.py tests/unit/test_core_matmul.py
tests/unit/test_core_nn.py tests/unit/test_core_threads.py tests/unit/test_autograd.py"

wheel=""
tests="$DEFAULT_TESTS"
pytest_args=()
job=1
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite="$2"; shift 2 ;;
    --wheel) wheel="$(realpath "$2")"; shift 2 ;;
    --tests) tests="$2"; shift 2 ;;
    --no-tests) tests=""; shift ;;
    --no-job) job=0; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "aarch64_check.sh: unknown argument '$1' (expected --suite, --wheel, --tests, --no-tests, --no-job, -- PYTEST ARGS)" >&2; exit 2 ;;
  esac
done
case "$suite" in
  bookworm) rootfs="$root_dir/build/arm64-root" ;;
  trixie) rootfs="$root_dir/build/arm64-root-trixie" ;;
  *) echo "aarch64_check.sh: --suite takes bookworm or trixie, got '$suite'" >&2; exit 2 ;;
esac
tests="$(echo $tests)"  # one line: it goes into a bash -c command line
[ "$(id -u)" = 0 ] || { echo "aarch64_check.sh: needs root (chroot, mount, apt-get)" >&2; exit 2; }
[ "$(uname -m)" = x86_64 ] || { echo "aarch64_check.sh: for x86_64 build machines (this is $(uname -m))" >&2; exit 2; }
total_start=$(date +%s)
qemu_cpu="${QEMU_CPU:-neoverse-n1}"

# ---------------------------------------------------------------- 1. tools
if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static debootstrap
fi

# ---------------------------------------------------------------- 2. binfmt_misc
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/register" ]; then
  mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || {
    echo "aarch64_check.sh: cannot mount binfmt_misc here (a container without the privilege?): a chroot cannot" \
         "start arm64 programs. By hand, without the tests (they start subprocesses): qemu-aarch64-static -L $rootfs" \
         "$rootfs/usr/bin/python3 ..." >&2; exit 1; }
fi
if [ ! -e "$binfmt/qemu-aarch64" ]; then
  conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  [ -f "$conf" ] || { echo "aarch64_check.sh: $conf missing (reinstall qemu-user-static)" >&2; exit 1; }
  cat "$conf" > "$binfmt/register"
fi
grep -q '^enabled' "$binfmt/qemu-aarch64" || echo 1 > "$binfmt/qemu-aarch64"

# ---------------------------------------------------------------- 3. the arm64 root
if [ ! -x "$rootfs/usr/bin/python3" ] || [ ! -e "$rootfs/.debootstrap-done" ]; then
  echo "== making the Debian $suite arm64 root in $rootfs (a few minutes)"
  rm -rf "$rootfs"
  mkdir -p "$rootfs"
  t0=$(date +%s)
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$rootfs" http://deb.debian.org/debian
  touch "$rootfs/.debootstrap-done"
  echo "== root made in $(( $(date +%s) - t0 )) s"
fi
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"  # pip inside reaches PyPI with this machine's resolver
# and trusts what this machine's pip trusts (a network whose HTTPS goes through a proxy with its own CA).
host_ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
cp "$host_ca" "$rootfs/opt/host-ca.crt" 2>/dev/null || mkdir -p "$rootfs/opt" && cp "$host_ca" "$rootfs/opt/host-ca.crt"

# proc and sys for Python, OpenMP and the tests; a private tmpfs as /dev/shm for the shm communicator's segments.
mounted=()
cleanup() {
  local i
  for (( i=${#mounted[@]}-1; i>=0; i-- )); do umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" || true; done
}
trap cleanup EXIT
mount_in_root() {  # type, mount point inside the root
  local where="$rootfs$2"
  mkdir -p "$where"
  mountpoint -q "$where" || { mount -t "$1" "$1" "$where"; mounted+=("$where"); }
}
mount_in_root proc /proc
mount_in_root sysfs /sys
mount_in_root tmpfs /dev/shm

# Runs a command line inside the root, in /opt/src, with the venv first on PATH and a clean environment.
in_root() {
  chroot "$rootfs" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin \
    QEMU_CPU="$qemu_cpu" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/opt/host-ca.crt PYTHONDONTWRITEBYTECODE=1 /bin/bash -c "cd /opt/src 2>/dev/null || cd /; $1"
}
root_python="$(in_root 'python3 -c "import sys; print(f\"{sys.version_info[0]}.{sys.version_info[1]}\")"')"
echo "== arm64 root: $(in_root 'uname -m') (under qemu, QEMU_CPU=$qemu_cpu), Python $root_python"

# ---------------------------------------------------------------- 4. the venv, the wheel, the sources
if [ ! -x "$rootfs/opt/venv/bin/python" ] || [ ! -e "$rootfs/opt/venv/.deps-done" ]; then
  echo "== the root's venv: numpy, pytest, hypothesis, scikit-learn (PyPI's aarch64 wheels)"
  t0=$(date +%s)
  in_root "python3 -m venv /opt/venv && pip install -q --only-binary :all: numpy pytest hypothesis scikit-learn && touch /opt/venv/.deps-done"
  echo "== venv made in $(( $(date +%s) - t0 )) s"
fi
if [ -z "$wheel" ]; then
  # The build machine's CPython of the root's version builds it (the wheel must match the root's Python).
  source "$root_dir/tools/find_python.sh"
  build_python="$(find_python "$root_python")" || build_python=""
  [ -n "$build_python" ] || { echo "aarch64_check.sh: no python$root_python on PATH to build the cp${root_python/./} wheel (give --wheel)" >&2; exit 1; }
  t0=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" "$root_dir/tools/build_wheel.sh" --python "$build_python" \
    --glibc 2.28 --arch aarch64 --out "$root_dir/build/wheel/dist-aarch64"
  echo "== wheel built in $(( $(date +%s) - t0 )) s"
  wheel="$(ls -t "$root_dir"/build/wheel/dist-aarch64/singa_lite-*-cp${root_python/./}-*aarch64.whl | head -1)"
fi
case "$(basename "$wheel")" in
  *_aarch64.whl) ;;
  *) echo "aarch64_check.sh: $wheel is not an aarch64 wheel" >&2; exit 1 ;;
esac
mkdir -p "$rootfs/opt/wheels"
rm -f "$rootfs"/opt/wheels/*.whl
cp "$wheel" "$rootfs/opt/wheels/"
t0=$(date +%s)
# The wheel's own dependencies (numpy, scipy-openblas32) from PyPI; it is reinstalled even when the version is the same.
in_root "pip install -q --only-binary :all: /opt/wheels/$(basename "$wheel") && pip install -q --force-reinstall --no-deps /opt/wheels/$(basename "$wheel")"
echo "== installed $(basename "$wheel") in $(( $(date +%s) - t0 )) s"
rm -rf "$rootfs/opt/src"
mkdir -p "$rootfs/opt/src"
(cd "$root_dir" && git ls-files -z --cached --others --exclude-standard) | (cd "$root_dir" && python3 -c '
import os, shutil, sys
dest = sys.argv[1]
for rel in sys.stdin.read().split("\0"):
    if rel and not rel.startswith("singa_lite/") and os.path.isfile(rel):
        os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(rel, os.path.join(dest, rel))
' "$rootfs/opt/src")

# ---------------------------------------------------------------- 5. the checks
in_root 'python -c "
import os, platform, singa_lite
where = os.path.realpath(singa_lite.__file__)
assert where.startswith(\"/opt/venv/\"), where
assert platform.machine() == \"aarch64\", platform.machine()
print(\"singa_lite\", singa_lite.__version__, \"on\", platform.machine(), \"from\", where)
"'
in_root 'python -m singa_lite'
if [ "$job" = 1 ]; then
  t0=$(date +%s)
  in_root 'python examples/mnist_dist.py'
  echo "== examples/mnist_dist.py (the README's main job) took $(( $(date +%s) - t0 )) s under emulation"
fi
if [ -n "$tests" ]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086  # the test list is split on purpose
  extra=""
  [ ${#pytest_args[@]} = 0 ] || extra="$(printf '%q ' "${pytest_args[@]}")"
  in_root "python -m pytest -q -p no:cacheprovider $tests $extra"
  echo "== tests took $(( $(date +%s) - t0 )) s under emulation: $tests ${pytest_args[*]}"
fi
echo "== aarch64_check.sh took $(( $(date +%s) - total_start )) s"
