"""Runs a benchmark script of another checkout of singa_lite with this environment's compiled core, so that two
trees (e.g. main and a branch) can be timed alternately in one environment:

    git worktree add --detach /tmp/before main
    cp "$(python -c 'import singa_lite._core as c; print(c.__file__)')" /tmp/before/singa_lite/
    mpiexec -n 2 python bench/run_tree.py /tmp/before bench/bench_distopt.py --backend shm

The tree goes first on sys.path and an editable install's import finder is taken out, so `import singa_lite`
is the tree's (checked before the script runs). SCRIPT is relative to the tree; its own folder is on sys.path
too, as when it is run directly."""
import os
import runpy
import sys

if len(sys.argv) < 3:
    sys.exit(__doc__)
tree, script = os.path.abspath(sys.argv[1]), sys.argv[2]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
path = os.path.join(tree, script)
sys.path[:0] = [tree, os.path.dirname(path)]
import singa_lite  # noqa: E402

if not singa_lite.__file__.startswith(tree + os.sep):
    sys.exit(f"run_tree: singa_lite was imported from {singa_lite.__file__}, not from {tree}")
sys.argv = [path] + sys.argv[3:]
runpy.run_path(path, run_name="__main__")
