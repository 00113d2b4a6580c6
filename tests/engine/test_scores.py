"""posenc.engine.scores: what every backend shares after the scores, the soft-cap (Gemma 2) and learned attention sinks.

Learned attention sinks (``sink_logits``: GPT-OSS's ``s_aux``): one logit per head in every softmax denominator,
a virtual key of value 0 that no mask hides. Checked against a naive implementation written here from the
formula, on every backend that takes them, under windows, padding, a multi-branch remap and a dynamic schedule;
the backends that cannot take them are passed over with the reason."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import assert_close
from posenc.engine import choose_backend, make_call, run_attention
from posenc.engine.parts import parts_for
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.rotary import apply_rope
from tests.support.attention import _causal, _hf_rotate, _qkv, _softmax_attend

torch.manual_seed(0)


def test_softcap_equals_formula_on_every_path():
    """PositionScheme.softcap: c * tanh(s / c) of the scaled q.k, before the mask (Gemma 2)."""
    from dataclasses import replace

    q, k, v = _qkv(N=140)
    q = q * 4  # large logits, so the cap matters
    N, D = q.shape[2], q.shape[3]
    inv = rope_frequencies(D).inv_freq
    pos = torch.arange(N)
    s = _hf_rotate(q, pos, inv) @ _hf_rotate(k, pos, inv).transpose(-1, -2) / math.sqrt(D)
    ref = _softmax_attend(torch.tanh(s / 2.0) * 2.0, v, _causal(N))
    scheme = replace(PositionScheme.preset("rope", train_len=64), softcap=2.0)
    for impl in ("reference", "blockwise", "sdpa"):  # sdpa cannot soft-cap: falls back to blockwise
        assert_close(attention(q, k, v, scheme, impl=impl), ref, rtol=1e-5, atol=1e-6, name=impl)
    assert not torch.allclose(attention(q, k, v, PositionScheme.preset("rope", train_len=64)), ref, atol=1e-3)
    with pytest.raises(ValueError, match="softcap"):
        replace(scheme, softcap=-1.0)

H, D = 4, 8

SINKS = torch.tensor([-3.0, 0.0, 1.5, 4.0])


def _inputs(B=2, N=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g) for _ in range(3))


def _naive(q, k, v, sinks, window=None, key_mask=None, base=10000.0):
    """softmax([q_m R(m-n) k_n / sqrt(D) for visible n] + [sink_h]) @ [v_n] + [0]: GPT-OSS's eager
    attention (cat the sink logit to the masked scores, softmax, drop the sink column)."""
    B, _, N, _ = q.shape
    pos = torch.arange(N)
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    qr = apply_rope(q, pos[None].expand(B, -1), inv)
    kr = apply_rope(k, pos[None].expand(B, -1), inv)
    s = (qr @ kr.transpose(-1, -2)).double() / D ** 0.5
    ok = pos[None, :] <= pos[:, None]
    if window is not None:
        ok = ok & (pos[:, None] - pos[None, :] < window)
    ok = ok[None, None].expand(B, 1, N, N)
    if key_mask is not None:
        ok = ok & key_mask[:, None, None, :]
    s = s.masked_fill(~ok, float("-inf"))
    s = torch.cat((s, sinks.double().view(1, -1, 1, 1).expand(B, H, N, 1)), dim=-1)
    return (torch.softmax(s, dim=-1)[..., :-1] @ v.double()).float()


@pytest.mark.parametrize("impl", ["reference", "blockwise", "auto", "sdpa", "flex", "toeplitz", "band"])
@pytest.mark.parametrize("window", [None, 7])
def test_sink_logits_equal_the_formula(impl, window):
    """Every impl gives GPT-OSS's answer: reference and blockwise compute it; the others fall back to them."""
    q, k, v = _inputs()
    key_mask = torch.ones(2, 40, dtype=torch.bool)
    key_mask[0, :5] = False  # left padding in row 0
    scheme = PositionScheme.preset("rope", train_len=64)
    if window is not None:
        scheme = PositionScheme.preset("sliding_window", train_len=64, window=window)
    out = run_attention(parts_for(scheme.to_json(), H, D), q, k, v, impl=impl, key_mask=key_mask,
                        sink_logits=SINKS)
    torch.testing.assert_close(out, _naive(q, k, v, SINKS, window, key_mask), rtol=1e-5, atol=1e-6)


def test_sink_logits_are_not_a_no_op_and_a_large_negative_sink_is_none():
    q, k, v = _inputs()
    parts = parts_for(PositionScheme.preset("rope", train_len=64).to_json(), H, D)
    plain = run_attention(parts, q, k, v)
    with_sinks = run_attention(parts, q, k, v, sink_logits=SINKS)
    assert (with_sinks - plain).abs().max() > 0.1
    # the sink takes mass: every output is the plain one scaled by p(real keys) in (0, 1)
    ratio = (with_sinks / plain)[plain.abs() > 1e-3]
    assert bool((ratio > 0).all() and (ratio < 1).all())
    torch.testing.assert_close(run_attention(parts, q, k, v, sink_logits=torch.full((H,), -1e4)), plain,
                               rtol=1e-5, atol=1e-6)


def test_sink_logits_under_a_two_branch_remap_blockwise_equals_reference():
    """ReRoPE (two branches) and a dynamic schedule (dynamic NTK: queries grouped by length) with sinks."""
    q, k, v = _inputs(N=96)
    for name, params in (("rerope", {"window": 12}), ("dynamic_ntk", {})):
        parts = parts_for(PositionScheme.preset(name, train_len=32, **params).to_json(), H, D)
        ref = run_attention(parts, q, k, v, impl="reference", sink_logits=SINKS)
        torch.testing.assert_close(run_attention(parts, q, k, v, impl="blockwise", sink_logits=SINKS), ref,
                                   rtol=1e-5, atol=1e-6)


def test_a_query_that_sees_no_key_gives_zero_with_sinks():
    q, k, v = _inputs(B=1, N=6)
    parts = parts_for(PositionScheme.preset("rope", train_len=64).to_json(), H, D)
    key_mask = torch.tensor([[False, False, True, True, True, True]])
    out = run_attention(parts, q, k, v, q_pos=torch.arange(6), k_pos=torch.arange(6), key_mask=key_mask,
                        sink_logits=SINKS)
    assert torch.isfinite(out).all() and bool((out[:, :, :2] == 0).all())


def test_sink_logits_get_gradients():
    q, k, v = _inputs(N=16)
    sinks = SINKS.clone().requires_grad_(True)
    parts = parts_for(PositionScheme.preset("rope", train_len=64).to_json(), H, D)
    run_attention(parts, q, k, v, sink_logits=sinks).sum().backward()
    assert sinks.grad is not None and bool((sinks.grad != 0).all())


def test_auto_passes_over_backends_without_sinks_with_the_reason():
    q, k, v = _inputs(N=80)
    parts = parts_for(PositionScheme.preset("rope", train_len=64).to_json(), H, D)
    backend, declined = choose_backend(make_call(parts, q, k, v, sink_logits=SINKS))
    assert backend.learned_sinks and backend.name in ("reference", "blockwise")
    assert any("learned attention sinks" in why for _, why in declined)


@pytest.mark.parametrize("bad,exc,match", [(torch.zeros(3), ValueError, r"\[heads\] = \(4,\)"),
                                            (torch.zeros(4, dtype=torch.long), TypeError, "floating-point"),
                                            ([0.0] * 4, TypeError, "floating-point")])
def test_bad_sink_logits_refused(bad, exc, match):
    q, k, v = _inputs(N=8)
    parts = parts_for(PositionScheme.preset("rope", train_len=64).to_json(), H, D)
    with pytest.raises(exc, match=match):
        run_attention(parts, q, k, v, sink_logits=bad)
