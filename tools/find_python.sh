# Sourced, not run: find_python X.Y prints the path of a CPython X.Y interpreter, pythonX.Y on PATH when it
# answers, else pyenv's newest X.Y.* install (pyenv's shim is on PATH for versions it does not enable, and
# fails when called); returns 1 when there is none. Used by .ci/wheels.sh (--pythons) and
# tools/aarch64_check.sh (the build interpreter of the arm64 root's Python version).
find_python() {
  local version="$1" found
  if found="$(command -v "python$version")" && "$found" -V >/dev/null 2>&1; then echo "$found"; return; fi
  for found in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".* 2>/dev/null | sort -V -r); do
    [ -x "$found/bin/python$version" ] && { echo "$found/bin/python$version"; return; }
  done
  return 1
}
