"""Where NVIDIA's pip wheels put their shared libraries. A CUDA build of singa_lite opens cuBLAS, cuDNN and NCCL at
run time (so that it imports without them); the loaders look first in the folder found here, then on the
system's library path."""
from __future__ import annotations

import importlib.util
import os


def nvidia_lib_dir(subdirs, library_prefix: str) -> str | None:
    """The first site-packages/nvidia/<subdir> (in the order given) holding a file named library_prefix*,
    or None (no wheel installed, or none with that library)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for sub in subdirs:
            folder = os.path.join(root, sub)
            if os.path.isdir(folder) and any(n.startswith(library_prefix) for n in os.listdir(folder)):
                return folder
    return None
