"""``chunks`` (Dual Chunk Attention's three pieces merged by log-sum-exp): equals a dense re-implementation of
ChunkLlama's reference and the materialised reference on every backend, and ``auto`` takes it in linear memory
when the call is long."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import relative_error
from posenc.engine import choose_backend, make_call
from posenc.engine.parts import parts_for
from posenc.parts.frequencies import rope_frequencies
from tests.support.chunkllama import chunkllama


def _qkv(N, B=2, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))


def _dca(chunk, local, train_len=64, **kw):
    return PositionScheme.preset("dca", train_len=train_len, chunk=chunk, local=local, **kw)


def test_chunks_backend_equals_chunkllama_reference():
    q, k, v = (x.float() for x in _qkv(70))
    ref = chunkllama(q.double(), k.double(), v.double(), 16, 4, rope_frequencies(16).inv_freq)
    out = attention(q, k, v, _dca(16, 4), impl="chunks")
    assert relative_error(out.double(), ref) <= 1e-5


@pytest.mark.parametrize("impl", ["auto", "chunks", "blockwise", "flex"])
def test_backends_equal_reference(impl):
    q, k, v = (x.float() for x in _qkv(300, B=1, seed=3))
    s = _dca(40, 8)
    ref = attention(q, k, v, s, impl="reference")
    assert relative_error(attention(q, k, v, s, impl=impl), ref) <= 1e-5
    for n in (1, 45):  # decode steps and a prefill continuation (queries not at a chunk start)
        ref = attention(q[:, :, -n:], k, v, s, impl="reference")
        assert relative_error(attention(q[:, :, -n:], k, v, s, impl=impl), ref) <= 1e-5, n


def test_auto_runs_chunks_in_linear_memory_when_long():
    """At length the auto choice is the LSE-merged chunk pieces (no N x N scores); a decode step of one
    query materialises one row of scores at most."""
    s = _dca(40, 8)
    parts = parts_for(s.to_json(), 2, 16)
    q, k, v = (torch.randn(1, 2, 600, 16) for _ in range(3))
    backend, _ = choose_backend(make_call(parts, q, k, v), "auto")
    assert backend.name == "chunks"
