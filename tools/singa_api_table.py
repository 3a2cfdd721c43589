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
# Whole modules we do not provide, or provide in part, with why.
ABSENT = {
    "sonnx": "ONNX export and import on the onnx package, an optional extra (pip install 'singa_lite[onnx]'); "
             "see docs/onnx.md",
    "image_tool": "PIL-based image augmentation helpers: not provided; use numpy or torchvision transforms",
    "snapshot": "SINGA 1's binary snapshot format: not provided; use checkpoint.save / Model.save_states",
}
# Per-name notes: (status, note). The status replaces "same" / "missing" where it says more: "different on
# purpose" for a name that exists but deliberately behaves otherwise (the note says how).
NOTES = {
    "device.get_num_opencl_platforms": ("different on purpose", "no OpenCL backend: always 0"),
    "device.get_num_opencl_devices": ("different on purpose", "no OpenCL backend: always 0"),
    "device.create_opencl_device": ("different on purpose", "no OpenCL backend: raises RuntimeError saying so"),
    "device.get_gpu_mem_size": (None, "(free, total) bytes, read from the CUDA driver; CudaError without a GPU"),
    "device.device_query": (None, "read from the CUDA driver; CudaError without a GPU"),
    "autograd.infer_dependency": (None, "inputs the engine does not record (data, labels) are not counted"),
    "autograd.Dummy": (None, "made on demand for parameters; our leaves have no creator"),
    "layer.LayerMeta": (None, "Layer.__call__ initializes on first call itself; no metaclass needed"),
    "model.ModelMeta": (None, "operations run eagerly (graph mode buffers nothing), so there is nothing to wrap"),
    "layer.RNN_Base": (None, "RNN and LSTM derive from Layer directly"),
    "layer.CudnnRNN": (None, "cuDNN's RNN API on a GPU, autograd operators elsewhere; see the layer table"),
    "opt.DecayScheduler": (None, "returns a HyperValue: a float that also has a value tensor's as_type / data"),
    "opt.Optimizer": (None, "lr_value etc. are HyperValue floats, step_counter an int; see the opt table"),
    "utils.same_pad_shape_check": (None, "returns (pads, odd_pads); SINGA's fails before returning"),
    "utils.post_order_recursive": (None, "unrecorded inputs are named '<op>:in<i>'"),
    "data.ImageBatchIter": (None, "a thread, not a process; worker errors raised by next(); PIL optional"),
    "sonnx.SingaRep": (None, "weights become parameters on first use; last_layers keeps SINGA's arithmetic"),
    "sonnx.SingaFrontend": (None, "walks the recorded graph; data inputs matched by position (or identity)"),
    "snapshot.Snapshot": (None, "deprecated in SINGA itself; use checkpoint.save / Model.save_states"),
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
        print("| name | kind | here | note |\n|---|---|---|---|")
        for name, kind in rows:
            ok = has(module, name)
            total, present = total + 1, present + ok
            status, note = NOTES.get(f"{module}.{name}", (None, ""))
            status = status if ok and status else ("same" if ok else "**missing**")
            print(f"| `{module}.{name}` | {kind} | {status} | {note} |")
    print(f"\n{present} of {total} public names of SINGA's Python API exist in singa_lite.")


if __name__ == "__main__":
    main()
