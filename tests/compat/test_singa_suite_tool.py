"""tools/singa_suite.py: what it copies from a mirror of apache/singa, and that the ``singa`` alias it writes
makes SINGA's example modules import singa_lite. Skipped without a mirror ($SINGA_MIRROR or the default
location below); SINGA's files go to a temporary folder, never into the checkout."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIRROR = os.environ.get("SINGA_MIRROR", "/work/.mirror/apache+singa/repo")

pytestmark = pytest.mark.skipif(not Path(MIRROR).is_dir(), reason=f"no git mirror of apache/singa at {MIRROR}")


@pytest.fixture
def suite(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("singa_suite", ROOT / "tools" / "singa_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "REF", tmp_path / "ref")
    return mod


def test_mlp_example_is_copied_and_imports_through_the_alias(suite):
    suite.materialize(MIRROR)
    ref = suite.REF
    assert (ref / "examples" / "mlp" / "model.py").is_file()
    assert (ref / "examples" / "cnn" / "train_cnn.py").is_file()
    assert (ref / ".gitignore").read_text() == "*\n"
    # As train_cnn.py does for its "mlp" model: examples/ on sys.path, then ``from mlp import model``.
    code = ("import sys; sys.path.insert(0, '..'); from mlp import model; import singa, singa_lite; "
            "m = model.create_model(data_size=10, num_classes=3); "
            "assert singa is singa_lite and isinstance(m, singa_lite.model.Model); print('ok')")
    env = suite.env()
    out = subprocess.run([sys.executable, "-c", code], cwd=ref / "examples" / "cnn", env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


def test_a_tree_missing_from_the_mirror_is_named(suite, monkeypatch):
    monkeypatch.setattr(suite, "TREES", ["examples/no_such_example"])
    with pytest.raises(SystemExit, match="cannot read examples/no_such_example from the mirror"):
        suite.materialize(MIRROR)
