"""The facade (posenc/__init__.py): ``import posenc`` imports neither torch nor transformers (the command line starts
at once), and every public name ``posenc.X`` still resolves, to the object of the module that defines it."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import posenc


def test_import_posenc_loads_neither_torch_nor_transformers():
    code = ("import sys, json, posenc, posenc.cli; "
            "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == []


def test_every_public_name_resolves_to_its_module_object():
    assert sorted(posenc.__all__) == sorted(posenc._PUBLIC)
    for name, module in posenc._PUBLIC.items():
        assert getattr(posenc, name) is getattr(importlib.import_module(module), name), name
        assert name in dir(posenc)
    from posenc import PositionScheme, generate  # the from-import form

    assert PositionScheme.preset("rope").name == "rope" and callable(generate)


def test_an_unknown_name_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        posenc.nope  # noqa: B018


def test_any_subpackage_imports_first():
    """Each floor imports in a fresh interpreter on its own: no import order hidden by an eager facade (the method
    records import ``posenc.scheme.part``, ``posenc.scheme.core`` imports the records)."""
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    for first in ("posenc.methods", "posenc.methods.common", "posenc.scheme", "posenc.hf", "posenc.training.train"):
        proc = subprocess.run([sys.executable, "-c", code, first], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (first, proc.stderr[-500:])
