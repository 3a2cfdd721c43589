"""Release metadata: one version (singa_lite/_version.py, read by pyproject.toml) and the CUDA wheels' pyproject
rewrite (tools/wheel_variant.py, used by tools/build_wheel.sh). .ci/wheels.sh builds and tests the wheels."""
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest

import singa_lite

ROOT = Path(__file__).resolve().parents[2]


def load_wheel_variant():
    spec = importlib.util.spec_from_file_location("wheel_variant", ROOT / "tools" / "wheel_variant.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_installed_distribution_has_the_package_version():
    # Whichever distribution installed the package (singa_lite, singa-lite-cuda13x, ...), its metadata carries
    # __version__: pyproject.toml has no version of its own to drift from it.
    versions = {}
    for name in ("singa_lite", "singa-lite-cuda13x", "singa-lite-cuda12x"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    assert len(versions) == 1, f"expected one singa_lite distribution installed, found {versions}"
    assert list(versions.values()) == [singa_lite.__version__]


def test_the_version_is_written_once():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^dynamic = \["version"\]$', pyproject, re.M)
    assert not re.search(r"^version\s*=", pyproject, re.M)
    assert 'input = "singa_lite/_version.py"' in pyproject
    # The imported package's file: the checkout's, or the installed wheel's where CI tests from outside the checkout.
    init = (Path(singa_lite.__file__).parent / "_version.py").read_text(encoding="utf-8")
    assert re.findall(r'^__version__ = "([^"]+)"$', init, re.M) == [singa_lite.__version__]


@pytest.mark.parametrize("variant, extra", [("cuda13x", "cuda13"), ("cuda12x", "cuda12")])
def test_cuda_wheel_is_renamed_and_depends_on_the_nvidia_extra(variant, extra):
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    original = tomllib.loads(text)["project"]
    rewritten = tomllib.loads(load_wheel_variant().rewrite(text, variant))["project"]
    assert rewritten["name"] == f"singa-lite-{variant}"
    nvidia = original["optional-dependencies"][extra]
    assert nvidia and all(d.startswith("nvidia-") for d in nvidia)
    assert rewritten["dependencies"] == nvidia + original["dependencies"]
    # Everything else is the CPU wheel's metadata.
    for key in ("description", "license", "requires-python", "classifiers", "optional-dependencies", "scripts"):
        assert rewritten[key] == original[key]


def test_wheel_variant_refuses_unknown_variants_and_layouts():
    wheel_variant = load_wheel_variant()
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    with pytest.raises(SystemExit, match="cuda12x or cuda13x"):
        wheel_variant.rewrite(text, "cuda11x")
    with pytest.raises(SystemExit, match='expected one name = "singa_lite"'):
        wheel_variant.rewrite(text.replace('name = "singa_lite"', 'name = "other"'), "cuda13x")
