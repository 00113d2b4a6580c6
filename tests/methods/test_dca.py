"""Dual Chunk Attention (posenc.methods.dca; posenc.parts.remap.DualChunk): equals a dense re-implementation of
ChunkLlama's reference (chunkllama_attn_replace.py), reduces to RoPE inside one chunk, composes with YaRN, cached
decoding equals the full forward; its temperatures (ChunkLlama's per sequence, Qwen2.5-1M's per query) against the
original's prefill; bad parameters."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
import posenc.hf
from posenc import PositionScheme, attention
from posenc._util import relative_error
from posenc.models.cache import KVCache
from posenc.parts.frequencies import rope_frequencies
from tests.support.attention import _qkv_typed
from tests.support.chunkllama import chunkllama


def _qkv(N, B=2, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))


def _dca(chunk, local, train_len=64, **kw):
    return PositionScheme.preset("dca", train_len=train_len, chunk=chunk, local=local, **kw)


@pytest.mark.parametrize("chunk, local, N", [(12, 2, 47), (10, 0, 30), (16, 6, 33), (9, 4, 40)])
@pytest.mark.parametrize("impl", ["reference", "blockwise"])
def test_equals_chunkllama_reference(chunk, local, N, impl):
    q, k, v = _qkv(N)
    inv = rope_frequencies(16).inv_freq
    ref = chunkllama(q, k, v, chunk, local, inv)
    out = attention(q, k, v, _dca(chunk, local), impl=impl)
    assert relative_error(out, ref) <= 1e-6


def test_one_chunk_is_plain_rope():
    q, k, v = _qkv(20)
    for impl in ("reference", "blockwise", "chunks"):
        out = attention(q.float(), k.float(), v.float(), _dca(24, 3), impl=impl)  # c = 21 >= 20 tokens
        rope = attention(q.float(), k.float(), v.float(), PositionScheme.preset("rope", train_len=64), impl="reference")
        assert relative_error(out, rope) <= 1e-5, impl


def test_composes_with_yarn():
    q, k, v = _qkv(50)
    s = PositionScheme.preset("yarn+dca", train_len=16, factor=4.0, chunk=12, local=2)
    assert s.remap.kind == "dca" and s.rope.scaling["rope_type"] == "yarn"
    f = rope_frequencies(16, scaling=s.rope.scaling)
    ref = chunkllama(q, k, v, 12, 2, f.inv_freq, attn_scale=f.attention_scale)
    for impl in ("reference", "blockwise"):
        assert relative_error(attention(q, k, v, s, impl=impl), ref) <= 1e-6, impl
    out = attention(q.float(), k.float(), v.float(), s, impl="chunks")
    assert relative_error(out.double(), ref) <= 1e-5


def test_relative_positions_never_exceed_chunk():
    r = _dca(10, 2).build_remap()
    qp, kp = torch.arange(60)[:, None], torch.arange(60)[None]
    rel = r.relative(qp, kp)[qp >= kp]
    assert rel.min() >= 0 and rel.max() == 10
    local = (qp >= kp) & (qp - kp <= 2)  # distances up to the local window stay exact
    assert torch.equal(r.relative(qp, kp)[local], (qp - kp).double()[local])


def _model(scheme, seed=0):
    torch.manual_seed(seed)
    return posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, scheme=scheme,
                                         train_len=16)).eval()


@pytest.mark.parametrize("spec, params", [("dca", dict(chunk=8, local=2)),
                                          ("yarn+dca", dict(factor=2.0, chunk=8, local=3))])
def test_cached_decode_equals_full_forward(spec, params):
    model = _model(PositionScheme.preset(spec, train_len=16, **params))
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache.for_model(model, 2)
        outs = [model(ids[:, :5], cache=cache)]
        outs += [model(ids[:, t:t + 1], cache=cache) for t in range(5, 40)]
    assert relative_error(torch.cat(outs, dim=1), full) <= 1e-5


@pytest.mark.parametrize("params", [dict(chunk=4, local=4), dict(chunk=0, local=0), dict(chunk=8, local=-1)])
def test_bad_parameters(params):
    with pytest.raises(ValueError, match="dca"):
        _dca(**params)


# ============================================================================ DCA temperatures
@pytest.mark.parametrize("form, coef, power", [("chunkllama", 0.05, 2), ("qwen", 0.1, 1)])
def test_dca_temperature_sequence_equals_the_originals_prefill(form, coef, power):
    """ChunkLlama's prefill: q and k rotated with cos/sin x m, m = 0.05 ln(N/L) + 1 for the call's length N
    (the dense ChunkLlama of test_dca with attn_scale = m); Qwen's: the logits x (0.1 ln(N/L) + 1)."""
    L, N = 16, 50
    q, k, v = _qkv_typed(N)
    m = 1 + coef * math.log(N / L)
    s = PositionScheme.preset("dca", train_len=L, chunk=12, local=2, temperature=form,
                              temperature_length="sequence")
    ref = chunkllama(q, k, v, 12, 2, rope_frequencies(16).inv_freq, attn_scale=math.sqrt(m ** power))
    for impl in ("reference", "blockwise", "chunks"):
        out = attention(q.float(), k.float(), v.float(), s, impl=impl) if impl == "chunks" else \
            attention(q, k, v, s, impl=impl)
        assert relative_error(out.double(), ref) <= (1e-5 if impl == "chunks" else 1e-6), impl


def test_dca_temperature_per_query_is_cache_consistent_and_matches_the_last_row():
    L, N = 16, 50
    q, k, v = _qkv_typed(N)
    per_query = PositionScheme.preset("dca", train_len=L, chunk=12, local=2, temperature="chunkllama")
    per_call = PositionScheme.preset("dca", train_len=L, chunk=12, local=2, temperature="chunkllama",
                                     temperature_length="sequence")
    a, b = attention(q, k, v, per_query, impl="reference"), attention(q, k, v, per_call, impl="reference")
    assert relative_error(a[:, :, -1], b[:, :, -1]) <= 1e-6  # the last query: n = N either way
    assert relative_error(a[:, :, :L], attention(q, k, v, PositionScheme.preset(
        "dca", train_len=L, chunk=12, local=2), impl="reference")[:, :, :L]) <= 1e-6  # n <= L: m = 1
    t = per_query.build_temperature()
    assert float(t.scale(torch.tensor([31]))[0]) == pytest.approx((1 + 0.05 * math.log(2)) ** 2, rel=1e-12)
    for bad in ({"temperature": "yarn"}, {"temperature_length": "all"}):
        with pytest.raises(ValueError, match="dca.temperature"):
            PositionScheme.preset("dca", train_len=L, **bad)
