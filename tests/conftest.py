"""Test-session setup.

``POSENC_NAN_FILL=1`` turns on the guard against uninitialised reads: every tensor that
PyTorch allocates without initialising (``torch.empty`` and friends, including the buffers of
compiled kernels) is filled with NaN (integers with their largest value), so a kernel that reads memory
it never wrote gives NaN instead of whatever the allocator happened to return. `make test` runs the
engine tests a second time this way (with ``MALLOC_PERTURB_`` and a raised
``MALLOC_MMAP_THRESHOLD_`` for the C allocator as well; the Makefile says why).
"""

import os

import pytest
import torch

from posenc.hf.source import load_source
from posenc.models import checkpoint as ckpt
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.scheme.core import PositionScheme
from tests.support.corpus import write_corpus

if os.environ.get("POSENC_NAN_FILL") == "1":
    # fill_uninitialized_memory only acts under deterministic algorithms; warn_only keeps ops that have
    # no deterministic implementation running (with a warning) instead of raising
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True


def pytest_collection_modifyitems(config, items):
    """Test tiers (README "Testing"): a test that calls torch.compile (marker ``compile``: tens of seconds on its
    first call) is in the slow tier too, so `make test` (``-m "not slow"``) skips it in its first step; the
    engine's compiled tests still run in `make test`'s NaN-fill step (the Makefile runs ENGINE_TESTS unfiltered
    there, where they matter), and `make test-slow` runs all of them."""
    import pytest

    for item in items:
        if item.get_closest_marker("compile") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny byte-level checkpoint (vocab 257) written the way `posenc train` writes one."""
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=257, dim=16, n_layers=1, n_heads=2, scheme=PositionScheme.preset("rope", train_len=16),
                   train_len=16)
    path = tmp_path_factory.mktemp("cli") / "run"
    ckpt.save_checkpoint(path, TinyLM(cfg), cfg, {"step": 1, "finished": True},
                         extra={"tokenizer": {"name": "byte", "bos": True}, "corpus": "stdlib"})
    return path


@pytest.fixture(scope="module")
def smol():
    model, tok = load_source("smollm2")
    return model, tok


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return str(write_corpus(tmp_path / "tiny.txt"))
