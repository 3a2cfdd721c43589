"""The examples run as jobs: small sizes, real code paths."""
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, *argv):
    old = sys.argv
    sys.argv = [name, *argv]
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    except SystemExit as e:
        return e.code
    finally:
        sys.argv = old
    return 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_linear_regression_recovers_weights(dtype, capsys):
    code = run_example("linear_regression.py", "--samples", "2000", "--features", "16", "--steps", "80",
                       "--dtype", dtype)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "max |w - w_true|" in out


def test_linear_regression_rejects_bad_arguments():
    assert run_example("linear_regression.py", "--steps", "0") not in (0, None)
