"""posenc.engine.backends.base: every backend declares the dtypes it runs."""

from __future__ import annotations

import torch

from posenc.engine.backends import BACKENDS
from posenc.engine.dispatch import IMPLS


def test_backends_declare_dtypes():
    assert {b.name for b in BACKENDS} == set(IMPLS) - {"auto"}
    for b in BACKENDS:
        assert torch.float32 in b.dtypes and torch.bfloat16 in b.dtypes
