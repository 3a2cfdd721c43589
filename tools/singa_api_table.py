"""Lists SINGA's public Python API (from a local git mirror of apache/singa) next to what singa_lite has.

    python tools/singa_api_table.py --mirror /path/to/apache-singa.git > /tmp/table.md

For each SINGA module: its public top-level classes and functions, and the public methods of the classes
scripts use most; a name is "same" when singa_lite has it (the suite in tools/singa_suite.py checks
behaviour), "missing" when not. docs/singa_compat.md's per-name table is this output, with the notes on
deliberate differences added from NOTES below.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import subprocess

MODULES = ["tensor", "device", "autograd", "layer", "model", "opt", "initializer", "utils", "data", "snapshot",
           "sonnx", "image_tool"]
CLASSES = {"tensor": ["Tensor"], "model": ["Model"], "layer": ["Layer"], "opt": ["Optimizer", "DistOpt"]}
# Whole modules we do not provide, with why.
ABSENT = {
    "sonnx": "ONNX import/export: not provided (needs onnx); export weights with Model.save_states instead",
    "image_tool": "PIL-based image augmentation helpers: not provided; use numpy or torchvision transforms",
    "snapshot": "SINGA 1's binary snapshot format: not provided; use checkpoint.save / Model.save_states",
    "utils": "SINGA's update_progress / handle_odd_pad_* helpers: see the per-name rows",
    "data": "SINGA's threaded ImageBatchIter: not provided; singa_lite.data has readers, partition and a sampler",
}


def public_api(mirror: str, module: str) -> list[tuple[str, str]]:
    src = subprocess.run(["git", "--git-dir", mirror, "show", f"HEAD:python/singa/{module}.py"],
                         capture_output=True, text=True, check=True).stdout
    tree = ast.parse(src)
    rows = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            rows.append((node.name, "class" if isinstance(node, ast.ClassDef) else "function"))
            if isinstance(node, ast.ClassDef) and node.name in CLASSES.get(module, []):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef) and not sub.name.startswith("_"):
                        rows.append((f"{node.name}.{sub.name}", "method"))
    return rows


def has(module: str, name: str) -> bool:
    try:
        mod = importlib.import_module(f"singa_lite.{module}")
    except ImportError:
        return False
    obj = mod
    for part in name.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirror", default=os.environ.get("SINGA_MIRROR"), required=not os.environ.get("SINGA_MIRROR"))
    args = ap.parse_args()
    total = present = 0
    for module in MODULES:
        rows = public_api(args.mirror, module)
        print(f"\n### `{module}`\n")
        if module in ABSENT:
            print(f"{ABSENT[module]}.\n")
        print("| name | kind | here |\n|---|---|---|")
        for name, kind in rows:
            ok = has(module, name)
            total, present = total + 1, present + ok
            print(f"| `{module}.{name}` | {kind} | {'same' if ok else '**missing**'} |")
    print(f"\n{present} of {total} public names of SINGA's Python API exist in singa_lite.")


if __name__ == "__main__":
    main()
