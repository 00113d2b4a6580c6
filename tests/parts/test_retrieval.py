"""posenc.parts.retrieval: InfLLM-style block retrieval against a dense re-implementation of its rule and a case
computed by hand, its sparse key choice, and DuoAttention's head split (streaming heads are sinks plus a window)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import relative_error
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.retrieval import BlockRetrieval, duo_query_heads
from tests.support.attention import _qkv_typed


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rot_scaled(x, t, inv_freq, a=1.0):
    """HF rotate_half RoPE of ``x [B,H,n,D]`` at positions ``t [n]``, cos and sin times ``a``."""
    f = torch.outer(t.double(), inv_freq.double())
    emb = torch.cat((f, f), dim=-1)
    return x * (emb.cos() * a).to(x.dtype) + _rotate_half(x) * (emb.sin() * a).to(x.dtype)


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
                            qr, kr = _rot_scaled(q[b, h, i][None, None, None], torch.tensor([i]), inv), \
                                _rot_scaled(k[b, h, j][None, None, None], torch.tensor([j]), inv)
                        elif j < n_sinks or blk >= complete or blk in chosen:
                            qr, kr = _rot_scaled(q[b, h, i][None, None, None], torch.tensor([w]), inv), k[b, h, j]
                        else:
                            continue
                        logits.append(float((qr.flatten() * kr.flatten()).sum()) / math.sqrt(D))
                        vals.append(v[b, h, j])
                    p = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                    out[b, h, i] = (p[:, None] * torch.stack(vals)).sum(0)
    return out


@pytest.mark.parametrize("per_head", [False, True])
def test_retrieval_equals_the_dense_rule(per_head):
    q, k, v = _qkv_typed(40, B=1, H=2, D=8, seed=3)
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
    q, k, v = _qkv_typed(60, B=1, H=4, seed=5)
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
