"""Moved public modules and names keep working from their old place for a release, with a DeprecationWarning
that names the new place (singa_lite/_moved.py holds the table)."""
import importlib
import subprocess
import sys
import warnings

import pytest

import singa_lite
from singa_lite import _moved


def test_from_singa_lite_import_ddp_gives_the_parallel_module_and_names_its_new_place():
    code = ("import warnings; warnings.simplefilter('error')\n"
            "try:\n    from singa_lite import ddp\nexcept DeprecationWarning as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "singa_lite.ddp has moved to singa_lite.parallel.ddp" in out.stdout, out.stdout + out.stderr
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "from singa_lite import ddp; import singa_lite.parallel.ddp as new; import singa_lite.ddp as old\n"
            "assert ddp is new is old, (ddp, new, old); print(ddp.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "singa_lite.parallel.ddp", out.stdout + out.stderr


def test_the_warning_points_at_the_line_that_used_the_old_path():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop("singa_lite.ddp", None)
        importlib.import_module("singa_lite.ddp")
        vars(singa_lite).pop("ddp", None)  # the import set it: the attribute form is checked on its own
        module = singa_lite.ddp
    assert module is importlib.import_module("singa_lite.parallel.ddp")
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    assert all(w.filename == __file__ for w in caught), [w.filename for w in caught]


@pytest.mark.parametrize("old", sorted(_moved.MODULES))
def test_every_old_module_path_resolves_to_its_new_module(old):
    with pytest.warns(DeprecationWarning, match=_moved.MODULES[old].replace(".", r"\.")):
        sys.modules.pop(old, None)
        module = importlib.import_module(old)
    assert module is importlib.import_module(_moved.MODULES[old])


@pytest.mark.parametrize("old", sorted(_moved.NAMES), ids=lambda key: ".".join(key))
def test_every_old_name_resolves_to_the_object_at_its_new_place(old):
    module, name = old
    new_module, _, new_name = _moved.NAMES[old].partition(":")
    with pytest.warns(DeprecationWarning, match=f"{new_module}.{new_name}".replace(".", r"\.")):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(new_module), new_name)


def test_a_name_that_never_existed_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        singa_lite.no_such_thing  # noqa: B018
