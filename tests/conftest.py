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

if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    # pytest -n N: N workers share the machine's cores, so each gets its share of threads (and passes it to the
    # processes it starts). With torch's default (every core in every worker), oversubscribed OpenMP threads wait
    # on each other: on 2 idle cores `pytest -n 2` ran tests/evals/suite/test_grid.py in 259-293 s against 67-68 s
    # this way, and the default tier (-m "not slow") in 873 s against 591 s.
    _THREADS = max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)
    torch.set_num_threads(_THREADS)

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
