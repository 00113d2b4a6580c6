"""STRING, Resonance RoPE, DCA's temperatures (ChunkLlama, Qwen2.5-1M), InfLLM-style block retrieval and
DuoAttention's head split: each against a dense re-implementation of its original's rule or a case
computed by hand, every backend equal to ``reference``, cached decoding equal to the full forward (TinyLM and a
transformers Llama with GQA 9/3, head_dim 64 as SmolLM2), the calibration, and the conventions table."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_dca import chunkllama

import posenc
import posenc.hf
from posenc import PositionScheme, attention
from posenc._util import relative_error
from posenc.methods import METHODS
from posenc.models.cache import KVCache
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.retrieval import BlockRetrieval, duo_query_heads

IMPLS = ("blockwise", "auto", "flex", "band", "sinks", "sdpa")


def _qkv(N, B=2, H=2, D=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g, dtype=dtype) for _ in range(3))


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rot(x, t, inv_freq, a=1.0):
    """HF rotate_half RoPE of ``x [B,H,n,D]`` at positions ``t [n]``, cos and sin times ``a``."""
    f = torch.outer(t.double(), inv_freq.double())
    emb = torch.cat((f, f), dim=-1)
    return x * (emb.cos() * a).to(x.dtype) + _rotate_half(x) * (emb.sin() * a).to(x.dtype)


def _masked(q, k, v, allowed):
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


# ============================================================================ STRING
def string_prefill(q, k, v, S, W, inv, a=1.0, overlap=True):
    """HKUNLP/STRING ``string_flash_forward`` written densely: the diagonal piece (flash-attn ``window_size=[S,0]``:
    d <= S; ``overlap=False``: d < S, as its decode path) at true positions, the shifted piece (d >= S) with the
    queries at ``qp - S + W``, merged by log-sum-exp; cos and sin times the attention factor ``a``."""
    N = q.shape[2]
    t = torch.arange(N)
    d = t[:, None] - t[None]
    q1, q2, kr = _rot(q, t, inv, a), _rot(q, (t - S + W).clamp(min=0), inv, a), _rot(k, t, inv, a)
    o1, l1 = _masked(q1, kr, v, (d >= 0) & ((d <= S) if overlap else (d < S)))
    o2, l2 = _masked(q2, kr, v, d >= S)
    w2 = torch.sigmoid(l2 - l1)[..., None]
    return torch.where(torch.isfinite(l2)[..., None], o1 + w2 * (o2 - o1), o1)


@pytest.mark.parametrize("S, W, N", [(8, 3, 40), (5, 0, 23), (12, 12, 30), (1, 1, 9)])
def test_string_equals_the_originals_rule(S, W, N):
    q, k, v = _qkv(N)
    inv = rope_frequencies(16).inv_freq
    scheme = PositionScheme.preset("string", train_len=64, shift=S, local=W)
    ref = string_prefill(q, k, v, S, W, inv, overlap=False)
    assert relative_error(attention(q, k, v, scheme, impl="reference"), ref) <= 1e-6
    # the original's prefill also counts the key at d = S in its diagonal piece: a real difference (docstring)
    if N > S:
        assert relative_error(string_prefill(q, k, v, S, W, inv, overlap=True), ref) > 1e-3


def test_string_hidden_attention_factor_and_hand_positions():
    r = PositionScheme.preset("string", train_len=64, shift=5, local=2).build_remap()
    qp, kp = torch.tensor([[9], [9], [9], [4]]), torch.tensor([[0], [4], [5], [0]])
    assert r.relative(qp, kp).flatten().tolist() == [6.0, 2.0, 4.0, 4.0]  # 9-5+2, 5-5+2, 4 (near), 4 (near)
    q, k, v = _qkv(30)
    a = 0.1 * math.log(2) + 1
    s = PositionScheme.preset("string", train_len=64, shift=8, local=3, attention_factor=a)
    ref = string_prefill(q, k, v, 8, 3, rope_frequencies(16).inv_freq, a=a, overlap=False)
    assert relative_error(attention(q, k, v, s, impl="reference"), ref) <= 1e-6


# ============================================================================ Resonance RoPE
def test_resonance_rounds_every_wavelength_by_hand():
    """d = 8, base 10000: wavelengths 2 pi 10^(2i/8... ) = 6.283, 62.83, 628.3, 6283 -> 6, 63, 628, 6283."""
    s = PositionScheme.preset("resonance", train_len=64)
    f = rope_frequencies(8, scaling=s.rope.scaling)
    assert torch.allclose(2 * math.pi / f.inv_freq.double(), torch.tensor([6.0, 63.0, 628.0, 6283.0],
                                                                          dtype=torch.float64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("spec, kw", [("yarn+resonance", {"factor": 4.0}), ("resonance+yarn", {"factor": 4.0}),
                                      ("resonance+ntk", {"factor": 2.0}), ("dynamic_yarn+resonance", {})])
def test_resonance_stacks_on_a_schedule(spec, kw):
    """sheryc/resonance_rope's Resonance-YaRN: YaRN's frequencies, then theta' = 2 pi / round(2 pi / theta); the
    attention factor is YaRN's."""
    s = PositionScheme.preset(spec, train_len=32, **kw)
    plain = dict(s.rope.scaling)
    del plain["resonance"]
    for n in (20, 100) if s.is_dynamic else (None,):
        ours = rope_frequencies(32, scaling=s.rope.scaling, seq_len=n)
        base = rope_frequencies(32, scaling=plain, seq_len=n)
        want = 2 * math.pi / torch.round(2 * math.pi / base.inv_freq.double())
        assert torch.allclose(ours.inv_freq.double(), want, rtol=1e-6, atol=0)
        assert ours.attention_scale == base.attention_scale


def test_resonance_repeats_trained_angles():
    """A dimension with an integer wavelength lambda rotates position t + lambda exactly as t."""
    s = PositionScheme.preset("resonance", train_len=64)
    inv = rope_frequencies(16, scaling=s.rope.scaling).inv_freq.double()
    lam = torch.round(2 * math.pi / inv)
    for i in range(4):
        t = torch.tensor([5.0, 5.0 + float(lam[i])])
        ang = (t * inv[i]) % (2 * math.pi)
        assert abs(float(ang[0] - ang[1])) < 1e-6


# ============================================================================ DCA temperatures
@pytest.mark.parametrize("form, coef, power", [("chunkllama", 0.05, 2), ("qwen", 0.1, 1)])
def test_dca_temperature_sequence_equals_the_originals_prefill(form, coef, power):
    """ChunkLlama's prefill: q and k rotated with cos/sin x m, m = 0.05 ln(N/L) + 1 for the call's length N
    (the dense ChunkLlama of test_dca with attn_scale = m); Qwen's: the logits x (0.1 ln(N/L) + 1)."""
    L, N = 16, 50
    q, k, v = _qkv(N)
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
    q, k, v = _qkv(N)
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


# ============================================================================ InfLLM block retrieval
def retrieval_dense(q, k, v, inv, w, n_sinks, block, top_k, per_head=False):
    """The rule of :class:`BlockRetrieval` query by query: local keys at their distance, every other visible key
    at distance w (q rotated at w, k unrotated); visible: sinks, the remainder, the top-k complete blocks by
    sum_h q_h . mean(k_h of the block)."""
    B, H, N, D = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for i in range(N):
            complete = max(0, (i - w - n_sinks + 1) // block)
            heads_rank = [list(range(H))] if not per_head else [[h] for h in range(H)]
            for hs in heads_rank:
                chosen = set()
                if complete > top_k:
                    score = [sum(float(q[b, h, i] @ k[b, h, n_sinks + j * block:n_sinks + (j + 1) * block].mean(0))
                                 for h in hs) for j in range(complete)]
                    chosen = set(sorted(range(complete), key=lambda j: -score[j])[:top_k])
                else:
                    chosen = set(range(complete))
                for h in hs:
                    logits, vals = [], []
                    for j in range(i + 1):
                        d = i - j
                        blk = (j - n_sinks) // block
                        if d < w:
                            qr, kr = _rot(q[b, h, i][None, None, None], torch.tensor([i]), inv), \
                                _rot(k[b, h, j][None, None, None], torch.tensor([j]), inv)
                        elif j < n_sinks or blk >= complete or blk in chosen:
                            qr, kr = _rot(q[b, h, i][None, None, None], torch.tensor([w]), inv), k[b, h, j]
                        else:
                            continue
                        logits.append(float((qr.flatten() * kr.flatten()).sum()) / math.sqrt(D))
                        vals.append(v[b, h, j])
                    p = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                    out[b, h, i] = (p[:, None] * torch.stack(vals)).sum(0)
    return out


@pytest.mark.parametrize("per_head", [False, True])
def test_retrieval_equals_the_dense_rule(per_head):
    q, k, v = _qkv(40, B=1, H=2, D=8, seed=3)
    inv = rope_frequencies(8).inv_freq
    s = PositionScheme.preset("retrieval", train_len=64, window=8, n_sinks=2, block=4, top_k=2, per_head=per_head)
    ref = retrieval_dense(q, k, v, inv, 8, 2, 4, 2, per_head)
    for impl in ("reference", "blockwise"):
        assert relative_error(attention(q, k, v, s, impl=impl), ref) <= 1e-6, impl


def test_retrieval_picks_the_block_its_query_points_at():
    """Hand case: keys all orthogonal to the query except block 3's; with top_k = 1 the query at 40 sees block
    3 (keys 2+12..2+15) and not blocks 0, 1, 2, 4, 5 (complete: (40 - 8 - 2 + 1) // 4 = 7 blocks)."""
    D = 4
    k = torch.zeros(1, 1, 41, D, dtype=torch.float64)
    k[..., 1] = 1.0
    k[0, 0, 14:18, 0] = 1.0
    q = torch.zeros(1, 1, 1, D, dtype=torch.float64)
    q[..., 0] = 1.0
    r = BlockRetrieval(window=8, n_sinks=2, block=4, top_k=1)
    vis = r.select(torch.zeros(1, 1, 1, 1, dtype=torch.long), q, torch.tensor([[40]]), k, torch.arange(41)[None],
                   None)[0, 0, 0]
    want = [j < 2 or 14 <= j < 18 or j >= 30 or 40 - j < 8 for j in range(41)]  # sinks, block 3, remainder, local
    assert vis.tolist() == want


@pytest.mark.parametrize("per_head", [False, True])
def test_retrieval_select_keys_is_select_on_the_chosen_keys(per_head):
    """The sparse choice (block level) equals the dense one cut to its keys, and leaves out only keys no query
    sees: on random keys with padding, grouped heads (summary from 2 key heads, 4 query heads) and query
    positions from before the first complete block to past several."""
    from posenc.parts.branches import Remap

    g = torch.Generator().manual_seed(5)
    r = BlockRetrieval(window=8, n_sinks=2, block=4, top_k=2, per_head=per_head)
    k = torch.randn(2, 2, 70, 8, generator=g, dtype=torch.float64)
    kp = torch.arange(70)[None].expand(2, -1)
    key_mask = torch.ones(2, 70, dtype=torch.bool)
    key_mask[1, 30:34] = False
    summary = r.key_summary(k, kp, key_mask)
    h = torch.arange(4)[None, :, None, None]
    for lo in (0, 9, 35, 60):
        q = torch.randn(2, 4, 10, 8, generator=g, dtype=torch.float64)
        qp = torch.arange(lo, lo + 10)[None].expand(2, -1)
        dense = r.select(h, q, qp, k.repeat_interleave(2, dim=1), kp, key_mask)
        dense = dense.expand(2, dense.shape[1], 10, 70)
        idx, chosen = r.select_keys(h, q, qp, k, kp, key_mask, summary=summary)
        want_idx, want = Remap.select_keys(r, h, q, qp, k.repeat_interleave(2, dim=1), kp, key_mask)
        assert (idx is None) == (want_idx is None) and (idx is None or idx.tolist() == want_idx.tolist()), lo
        assert torch.equal(chosen.expand_as(want), want), lo
        cut = dense if idx is None else dense.index_select(-1, idx)
        assert torch.equal(chosen.expand_as(cut), cut) and int(cut.sum()) == int(dense.sum()), lo


# ============================================================================ DuoAttention
def test_duo_streaming_heads_are_sinks_plus_window_and_the_others_full():
    q, k, v = _qkv(60, B=1, H=4, seed=5)
    s = PositionScheme.preset("duo", train_len=64, streaming=[1, 3], n_sinks=3, window=10)
    out = attention(q, k, v, s, impl="reference")
    full = attention(q, k, v, PositionScheme.preset("rope", train_len=64), impl="reference")
    sink_window = PositionScheme.preset("rope", train_len=64)
    from dataclasses import replace
    sink_window = replace(sink_window, mask=replace(sink_window.mask, window=10, n_sinks=3))
    stream = attention(q, k, v, sink_window, impl="reference")
    assert relative_error(out[:, [0, 2]], full[:, [0, 2]]) <= 1e-6
    assert relative_error(out[:, [1, 3]], stream[:, [1, 3]]) <= 1e-6
    assert duo_query_heads([0, 2], 9, 3) == [0, 1, 2, 6, 7, 8]
    with pytest.raises(ValueError, match="duo.streaming"):
        attention(q, k, v, PositionScheme.preset("duo", train_len=64, streaming=[4]), impl="reference")


def test_calibration_keeps_the_heads_whose_output_streaming_changes_most():
    from posenc.evals.calibrate import calibrate_duo, head_deviation, record_calls

    torch.manual_seed(0)
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, train_len=64,
                                          scheme=PositionScheme.preset("rope", train_len=64))).eval()
    ids = torch.randint(0, 64, (1, 90), generator=torch.Generator().manual_seed(2))
    heads = calibrate_duo(lambda: model(ids), 2, n_sinks=2, window=16, retrieval_fraction=0.5)
    calls: list = []
    with record_calls(calls):
        model(ids)
    errors = torch.cat([(lambda d, n: d / n)(*head_deviation(c, hk, sc, 2, 16)) for c, hk, sc in calls])
    keep = set(torch.argsort(errors, descending=True)[:2].tolist())  # 2 of 4 (layer, KV head) pairs
    want = [duo_query_heads([g for g in range(2) if 2 * layer + g not in keep], 4, 2) for layer in range(2)]
    assert heads == want and sum(len(h) for h in heads) == 4
    assert calibrate_duo(lambda: model(ids), 2, n_sinks=2, window=90, retrieval_fraction=0.0) == [[0, 1, 2, 3]] * 2
    with pytest.raises(ValueError, match="n_layers"):
        calibrate_duo(lambda: model(ids), 3)


# ============================================================================ every backend, cache, transformers
NEW = [("string", dict(shift=20, local=5, attention_factor=1.07)), ("resonance+yarn", dict(factor=4.0)),
       ("retrieval", dict(window=16, n_sinks=2, block=8, top_k=2)), ("retrieval", dict(window=9, block=3,
                                                                                       top_k=3, per_head=True)),
       ("duo", dict(streaming=[0, 2], n_sinks=2, window=10)), ("dca", dict(chunk=40, local=8, temperature="qwen")),
       ("dca", dict(chunk=40, local=8, temperature="chunkllama", temperature_length="sequence"))]


@pytest.mark.parametrize("spec, kw", NEW)
def test_every_backend_equals_reference(spec, kw):
    s = PositionScheme.preset(spec, train_len=64, **kw)
    q, k, v = _qkv(300, B=1, H=4, seed=1, dtype=torch.float32)
    ref = attention(q, k, v, s, impl="reference")
    for impl in IMPLS:
        assert relative_error(attention(q, k, v, s, impl=impl), ref) <= 1e-5, impl
    for n in (1, 37):  # a decode step and a prefill continuation
        ref = attention(q[:, :, -n:], k, v, s, impl="reference")
        for impl in IMPLS:
            assert relative_error(attention(q[:, :, -n:], k, v, s, impl=impl), ref) <= 1e-5, (impl, n)


@pytest.mark.parametrize("spec, kw, long, decode", [("retrieval", {}, "retrieved", "retrieved"),
                                                     ("duo", dict(streaming=[1]), "blockwise", "reference")])
def test_auto_runs_content_selection_in_linear_memory_when_long(spec, kw, long, decode):
    """Long calls of the remaps that choose keys by content or head go to a tiled path (no N x N scores): InfLLM's
    to the near band + retrieved far keys, DuoAttention's to blockwise; a decode step of DuoAttention may
    materialise its one row."""
    from posenc.engine import choose_backend, make_call
    from posenc.engine.parts import parts_for

    parts = parts_for(PositionScheme.preset(spec, train_len=64, **kw).to_json(), 4, 16)
    q, k, v = (torch.randn(1, 4, 700, 16) for _ in range(3))
    assert choose_backend(make_call(parts, q, k, v), "auto")[0].name == long
    assert choose_backend(make_call(parts, q[:, :, -1:], k, v), "auto")[0].name == decode


@pytest.mark.parametrize("per_head", [False, True])
def test_retrieved_backend_equals_reference_at_every_length_around_the_window(per_head):
    """The retrieved-keys backend against the materialised reference for lengths from below the window to several
    tiles past it (a tile whose far keys are all chosen, a first far query at w, the far tiles' key prefixes), for
    full calls, a decode step and a prefill continuation, GQA keys (9 query heads on 3)."""
    from posenc.engine import choose_backend, make_call
    from posenc.engine.backends.retrieved import Retrieved
    from posenc.engine.parts import parts_for

    s = PositionScheme.preset("retrieval", train_len=64, window=12, n_sinks=2, block=4, top_k=2, per_head=per_head)
    q, k, v = _qkv(300, B=2, H=9, seed=3, dtype=torch.float32)
    k, v = k[:, :3], v[:, :3]
    for n in (5, 12, 13, 14, 40, 299):
        for nq in (n, 1, min(n, 37)):
            args = q[:, :, n - nq:n], k[:, :, :n], v[:, :, :n]
            assert choose_backend(make_call(parts_for(s.to_json(), 9, 16), *args), "retrieved")[0].name == "retrieved"
            ref = attention(*args, s, impl="reference")
            assert relative_error(attention(*args, s, impl="retrieved"), ref) <= 1e-5, (n, nq)
    assert Retrieved.tile < 299 - 12  # the longest call has more than one far tile


@pytest.mark.parametrize("spec, kw", NEW[:6] + [("duo", dict(streaming=[[1], [0, 3]], n_sinks=1, window=6))])
def test_cached_decode_equals_full_forward(spec, kw):
    torch.manual_seed(0)
    scheme = PositionScheme.preset(spec, train_len=16, **{**kw, **({"window": 6} if "window" in kw else {})})
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, train_len=16,
                                          scheme=scheme)).eval()
    ids = torch.randint(0, 64, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache.for_model(model, 2)
        outs = [model(ids[:, :7], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(7, 50)]
    assert relative_error(torch.cat(outs, dim=1), full) <= 1e-5


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=64, num_hidden_layers=2, num_attention_heads=9,
                                   num_key_value_heads=3, vocab_size=120, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("spec, kw", [("string", {}), ("resonance+yarn", dict(factor=2.0)), ("retrieval", {}),
                                      ("dca", dict(temperature="qwen")), ("duo", dict(streaming=[[0, 1, 2], []]))])
def test_hf_gqa_llama_cached_equals_full(spec, kw):
    """A tiny LlamaForCausalLM with SmolLM2's head layout (9 query heads, 3 KV heads, head_dim 64), read at 3x its
    trained length: transformers' own cache gives the logits of the full forward."""
    model = posenc.hf.extend(_tiny_llama(), spec, **kw)
    ids = torch.randint(0, 120, (1, 96), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :40], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(40, 96):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
    assert relative_error(torch.cat(steps, dim=1), full) <= 1e-5


def test_hf_duo_calibrated_on_the_model_itself():
    from posenc.evals.calibrate import calibrate_duo

    base = _tiny_llama()
    probe = posenc.hf.extend(copy.deepcopy(base), "duo")  # every head retrieving: the engine sees every layer
    ids = torch.randint(0, 120, (1, 64), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        heads = calibrate_duo(lambda: probe(ids), 2, n_sinks=2, window=8, retrieval_fraction=0.5)
        assert sum(len(h) for h in heads) == 9  # 3 of 6 KV heads stream: 3 x 3 query heads
        model = posenc.hf.extend(copy.deepcopy(base), "duo", streaming=heads, n_sinks=2, window=8)
        assert torch.isfinite(model(ids).logits).all()
        assert relative_error(probe(ids).logits, base(ids).logits) <= 1e-5  # no streaming head: the model itself


# ============================================================================ conventions
def test_docs_conventions_table_is_the_registrys():
    from pathlib import Path

    from posenc.methods.conventions import conventions_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "conventions.md").read_text(encoding="utf-8")
    assert conventions_table() in page, "regenerate docs/guides/conventions.md's table: conventions_table()"
    for name in ("streaming_llm", "selfextend", "dca", "string", "retrieval", "duo", "lm_infinite"):
        assert any(p.original for p in METHODS[name].params), name
    assert "recent_size + 1" in METHODS["streaming_llm"].param("window").describe()


def test_reads_content_is_declared_where_select_is_overridden():
    """The engine sends a remap to the score-tile backends by ``reads_content``; it must say whether the class
    overrides ``select`` (as ``restricts_keys`` / ``remaps_distance`` do for ``allowed`` / ``relative``)."""
    from posenc.parts.remap import REMAPS, Remap

    for cls in REMAPS.values():
        assert cls.reads_content == (cls.select is not Remap.select), cls


@pytest.mark.parametrize("n", [4096, 8192, 12000, 16256, 16257, 32768])
def test_string_length_defaults_keep_positions_trained_up_to_twice_the_length(n):
    """The suite's STRING at length n (L = 8192, W = 128): every relative position below L while n <= 2L - W
    (the shift's docstring); past it the shifted piece stays trained and the diagonal one reaches n - L + W - 1."""
    from posenc.evals.suite.spec import method_params

    L, W = 8192, 128
    p = method_params("string", L, n, 64, 1e5, {})
    assert p["local"] == W
    top = PositionScheme.preset("string", train_len=L, **p).build_remap().relative(
        torch.arange(n)[:, None], torch.zeros(1, 1, dtype=torch.long)).max().item()
    shifted = n - 1 - p["shift"] + W
    assert top == (max(p["shift"] - 1, shifted) if n > p["shift"] else n - 1)
    assert (top < L) == (n <= 2 * L - W)
    if n > 2 * L - W:
        assert shifted < L and top == n - L + W - 1
