"""Rewrites a copy of pyproject.toml for a CUDA wheel (tools/build_wheel.sh): the distribution is renamed
singa-lite-cuda13x / singa-lite-cuda12x and depends on the NVIDIA wheels that pyproject.toml's extra cuda13 /
cuda12 lists. The import package stays singa_lite, so the CPU and CUDA distributions exclude each other.

    python tools/wheel_variant.py PATH/pyproject.toml cuda13x
"""
from __future__ import annotations

import ast
import re
import sys


def _one(pattern: str, text: str, what: str) -> re.Match:
    found = list(re.finditer(pattern, text, flags=re.MULTILINE))
    if len(found) != 1:
        raise SystemExit(f"wheel_variant.py: expected one {what} in pyproject.toml, found {len(found)} "
                         f"(pattern {pattern!r}); update tools/wheel_variant.py to the new layout")
    return found[0]


def rewrite(text: str, variant: str) -> str:
    if variant not in ("cuda12x", "cuda13x"):
        raise SystemExit(f"wheel_variant.py: variant must be cuda12x or cuda13x, got {variant!r}")
    extra = variant[:-1]  # cuda13x -> the extra cuda13
    # The extra's list is plain TOML strings on one line, which Python's literal syntax reads as well.
    nvidia = ast.literal_eval(_one(rf"^{extra} = (\[.*\])$", text, f"extra {extra}").group(1))
    name = _one(r'^name = "singa_lite"$', text, 'name = "singa_lite"')
    text = text[:name.start()] + f'name = "singa-lite-{variant}"' + text[name.end():]
    deps = _one(r"^dependencies = \[\n", text, "dependencies list")
    added = "".join(f'    "{d}",\n' for d in nvidia)
    comment = f"    # The {variant} wheel: NVIDIA's libraries, opened from site-packages/nvidia at run time.\n"
    return text[:deps.end()] + comment + added + text[deps.end():]


def main() -> None:
    path, variant = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(rewrite(text, variant))


if __name__ == "__main__":
    main()
