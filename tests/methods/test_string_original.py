"""STRING's positions at N = L and N > L, pinned against the original's index arithmetic.

STRING: An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?", arXiv 2410.18745. Original:
HKUNLP/STRING ``string_for_llama.py`` (commit 216cc2f), written here from its code, not from posenc's:

- prefill, ``string_flash_forward`` (L323-367): the diagonal piece is flash-attn ``causal=True,
  window_size=[S, 0]`` on queries and keys rotated at their own positions (keys with ``0 <= d <= S`` at d); the
  shifted piece runs only when ``kv_seq_len - S > 0`` (L338-342) on the last ``N - S`` queries, rotated at
  ``position_ids - S + W`` (L414-415), against the first ``N - S`` keys, causally: keys with ``d >= S`` at
  ``d - S + W``; the two merge by log-sum-exp (L361-366), one softmax over both pieces.
- decode, ``do_flash_decoding`` on ``key_cache[kv_len - S : kv_len]`` and ``[: kv_len - S]`` (L426-434): ``d < S``
  at d, ``d >= S`` at ``d - S + W``.

Nothing in either depends on the training length L: the shift applies at N = L as at N > L. posenc follows the
decode rule everywhere; the prefill also admits the key at ``d = S`` to the diagonal piece, so that one key per
query ``i >= S`` enters the softmax twice (at S and at W), the one difference (``posenc.parts.remap.String``)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import attention
from posenc.analysis.maps import method_scheme, position_map
from posenc.methods import length_defaults
from posenc.parts.frequencies import rope_frequencies

CASES = [(24, 24, {"shift": 8, "local": 4}), (24, 36, {"shift": 8, "local": 4}), (48, 48, {}), (48, 80, {})]


def original_positions(N: int, S: int, W: int, prefill: bool) -> dict[tuple[int, int], list[int]]:
    """(query i, key j) -> the relative positions the original reads the pair at (two for its prefill's d = S)."""
    out = {}
    for i in range(N):
        for j in range(i + 1):
            d = i - j
            if prefill:
                out[i, j] = ([d] if d <= S else []) + ([d - S + W] if N - S > 0 and i >= S and d >= S else [])
            else:
                out[i, j] = [d if d < S else d - S + W]
    return out


def _rot(x, t, inv):
    """HF ``rotate_half`` RoPE at positions ``t`` (``apply_rotary_pos_emb``, L168-175; attention factor 1)."""
    f = torch.outer(t.double(), inv.double())
    emb = torch.cat((f, f), -1)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * emb.cos() + torch.cat((-x2, x1), -1) * emb.sin()


def original_attention(q, k, v, S, W, inv, prefill: bool):
    """The two pieces written densely, merged as one softmax over their union (the log-sum-exp merge)."""
    t = torch.arange(k.shape[2])
    d = t[:, None] - t[None]
    kr = _rot(k, t, inv)
    s1 = _rot(q, t, inv) @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s2 = _rot(q, t - S + W, inv) @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s1 = s1.masked_fill(~((d >= 0) & ((d <= S) if prefill else (d < S))), -math.inf)
    s2 = s2.masked_fill(~(d >= S), -math.inf)
    return torch.softmax(torch.cat([s1, s2], -1), -1) @ torch.cat([v, v], -2)


@pytest.mark.parametrize("L, N, params", CASES)
def test_positions_equal_the_originals_at_and_past_the_trained_length(L, N, params):
    pm = position_map("string", L, N, params, head_dim=8)
    S, W = pm.params["shift"], pm.params["local"]
    assert N > S  # the shifted piece is live in every case, N = L included
    rel = pm.relative
    for (i, j), pos in original_positions(N, S, W, prefill=False).items():
        assert [rel[i, j].item()] == pos, (i, j)
    assert torch.isnan(rel[torch.triu(torch.ones(N, N, dtype=torch.bool), 1)]).all()
    # the prefill differs only at d = S, where the original reads the key twice (S and W), posenc once (W)
    diff = {(i, j): pos for (i, j), pos in original_positions(N, S, W, prefill=True).items()
            if pos != [rel[i, j].item()]}
    assert diff and all(i - j == S and pos == [S, rel[i, j].item()] == [S, W] for (i, j), pos in diff.items())


@pytest.mark.parametrize("L, N, params", CASES)
def test_attention_equals_the_originals_decode_rule(L, N, params):
    D = 16
    scheme, p = method_scheme("string", L, N, params, head_dim=D)
    S, W = p["shift"], p["local"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, N, D, dtype=torch.float64, generator=g) for _ in range(3))
    inv = rope_frequencies(D).inv_freq
    out = attention(q, k, v, scheme, impl="reference")
    assert float((out - original_attention(q, k, v, S, W, inv, prefill=False)).abs().max()) < 1e-12
    rows = (out - original_attention(q, k, v, S, W, inv, prefill=True)).abs().amax(dim=(0, 1, 3))
    assert float(rows[:S].max()) < 1e-12 and bool((rows[S:] > 1e-6).all())  # the d = S key, rows i >= S


def test_the_8k_pass_keys_of_smollm2():
    """The suite's STRING at N = L = 8192 (docs/results/smollm2.md): S = 2730, W = 128. Its four pass keys (cells of
    benchmarks/results/suite-smollm2-full) are read at: 357 (exact, d < S), 6650 -> 4048, 5849 -> 3247,
    7817 -> 5215; the largest position read is N - 1 - S + W = 5589, and each position in [W, S) holds two keys."""
    p = length_defaults("string", 8192, 8192)
    assert p == {"shift": 2730, "local": 128}
    remap = method_scheme("string", 8192, 8192)[0].build_remap()
    d = torch.tensor([[357, 6650, 5849, 7817, 8191, 2729, 2730]])
    assert remap.relative(d + 10, torch.full_like(d, 10)).flatten().tolist() == [357, 4048, 3247, 5215, 5589, 2729,
                                                                                  128]
