#!/usr/bin/env bash
# Builds singa_lite with AddressSanitizer + UBSan into .venv-asan and runs the Python test suite under it
# (docs/reliability.md, "Sanitizers"). The interpreter is not instrumented, so the sanitizer runtime is
# preloaded; child processes (multiprocessing ranks, mpiexec jobs) inherit it. pytest captures at the
# Python level only (--capture=sys), so a report that the C++ code writes to fd 2 reaches the log even when
# it ends the process (UBSan ignores log_path when it runs beside ASan). A child that reports exits non-zero
# (halt_on_error), which fails its test, and the test prints the child's output.
#
#   tools/sanitize.sh                    # build (if needed) and run the whole suite
#   tools/sanitize.sh tests/unit -x      # arguments go to pytest (default: tests)
#   REBUILD=1 tools/sanitize.sh          # rebuild after changing csrc/
#   LEAKS=1 tools/sanitize.sh tests/unit/test_core_views.py   # also LeakSanitizer (tools/lsan.supp); short
#                                        # subsets only: full stacks for the suppressions make every malloc slow
#
# Environment: VENV (.venv-asan), SANITIZE (address,undefined), JOBS (2 parallel compiles), LOGDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-asan}
SANITIZE=${SANITIZE:-address,undefined}
JOBS=${JOBS:-2}
LOGDIR=${LOGDIR:-$PWD/build/sanitize-logs}

preload=$(gcc -print-file-name=libasan.so)
[[ $SANITIZE == *undefined* ]] && preload="$preload:$(gcc -print-file-name=libubsan.so)"

if [[ ! -x $VENV/bin/python ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  REBUILD=1
fi
if [[ -n ${REBUILD:-} ]] || ! LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0 "$VENV/bin/python" -c "import singa_lite" 2>/dev/null; then
  # Build requirements in the venv and no build isolation: the flags stay the same between builds, so a
  # rebuild after a change in csrc/ recompiles only what changed. Its own build folder: the normal
  # build's CMake cache stays as it is.
  "$VENV/bin/pip" install -q scikit-build-core pybind11 scipy-openblas32
  SINGA_LITE_CUDA=OFF SINGA_LITE_SANITIZE=$SANITIZE CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$VENV/bin/pip" install -q --no-build-isolation -e '.[test,mpi]' -C build-dir=build/asan
fi

rm -rf "$LOGDIR" && mkdir -p "$LOGDIR"
leaks=0 && [[ -n ${LEAKS:-} ]] && leaks=1
# allocator_may_return_null + max_allocation_size_mb: a huge request (the fuzz tests make them) fails as
# MemoryError instead of ending the process; under ASan they replace the fuzz tests' address-space cap.
export ASAN_OPTIONS="detect_leaks=$leaks:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1:max_allocation_size_mb=8192"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tools/ubsan.supp"
export LSAN_OPTIONS="suppressions=$PWD/tools/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0:malloc_context_size=40"
export PYTHONMALLOC=malloc  # pymalloc's arenas hide Python objects from ASan (and look like leaks to LSan)

set +e
LD_PRELOAD=$preload "$VENV/bin/python" -m pytest -q -p no:cacheprovider --capture=sys "${@:-tests}" 2>&1 | tee "$LOGDIR/pytest.log"
status=${PIPESTATUS[0]}
set -e

echo
echo "==== sanitizer summary ($SANITIZE, leaks=$leaks) ===="
tail -n 1 "$LOGDIR/pytest.log"
echo "pytest exit status: $status"
found=$(grep -cE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$LOGDIR/pytest.log" || true)
if [[ $found == 0 ]]; then
  echo "no sanitizer reports"
else
  echo "$found sanitizer report line(s) in $LOGDIR/pytest.log:"
  grep -E 'ERROR: (Address|Leak)Sanitizer|runtime error:|^SUMMARY' "$LOGDIR/pytest.log" | sort | uniq -c | head -n 40
  status=1
fi
exit "$status"
