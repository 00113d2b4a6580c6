"""Position remaps (posenc.parts.remap) against independent implementations written here from the papers and
reference repos (bojone/rerope's two-matrix ReRoPE and Leaky ReRoPE, datamllab/LongLM's SelfExtend, HKUNLP/STRING),
not from posenc's engine; hand-written PCW and StreamingLLM positions, Llama 4's query temperature by hand, and
the capability attributes the backends read (``restricts_keys``, ``remaps_distance``, ``reads_content``) agreeing
with the methods each remap overrides."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import assert_close, relative_error
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.masks import MaskSpec
from posenc.parts.remap import REMAPS, Llama4Temperature, ParallelContextWindows, Remap
from tests.support.attention import _causal, _hf_rotate, _qkv, _qkv_typed, _softmax_attend

torch.manual_seed(0)


def _bojone_rerope(q, k, v, window, inv, logn_L=None):
    """bojone/rerope rerope_patch.py: two score matrices, q rotated at `window` for the far one."""
    N, D = q.shape[2], q.shape[3]
    pos = torch.arange(N)
    if logn_L is not None:
        q = q * (torch.log(pos + 1.0) / math.log(logn_L)).clamp(min=1)[:, None]
    q1, k1 = _hf_rotate(q, pos, inv), _hf_rotate(k, pos, inv)
    q2 = _hf_rotate(q, torch.full_like(pos, window), inv)
    s1 = q1 @ k1.transpose(-1, -2) / math.sqrt(D)
    s2 = q2 @ k.transpose(-1, -2) / math.sqrt(D)
    rect = (pos[:, None] - pos[None]).abs() < window
    return _softmax_attend(torch.where(rect, s1, s2), v, _causal(N))


def _bojone_leaky(q, k, v, window, factor, inv):
    """bojone/rerope leaky_rerope_patch.py: far branch uses linear scaling `factor` and q at pos+offset."""
    N, D = q.shape[2], q.shape[3]
    pos = torch.arange(N)
    offset = window * (factor - 1)
    q1, k1 = _hf_rotate(q, pos, inv), _hf_rotate(k, pos, inv)
    q2, k2 = _hf_rotate(q, pos + offset, inv / factor), _hf_rotate(k, pos, inv / factor)
    s1 = q1 @ k1.transpose(-1, -2) / math.sqrt(D)
    s2 = q2 @ k2.transpose(-1, -2) / math.sqrt(D)
    rect = (pos[:, None] - pos[None]).abs() < window
    return _softmax_attend(torch.where(rect, s1, s2), v, _causal(N))


def _longlm_selfextend(q, k, v, group, window, inv):
    """datamllab/LongLM SelfExtend (Llama patch): neighbour and grouped scores, merged by mask."""
    N, D = q.shape[2], q.shape[3]
    pos = torch.arange(N)
    nq, nk = _hf_rotate(q, pos, inv), _hf_rotate(k, pos, inv)
    gq = _hf_rotate(q, pos // group + window - window // group, inv)
    gk = _hf_rotate(k, pos // group, inv)
    ns = nq @ nk.transpose(-1, -2) / math.sqrt(D)
    gs = gq @ gk.transpose(-1, -2) / math.sqrt(D)
    neighbour = torch.ones(N, N).tril()
    if N - window > 0:
        neighbour[window:, :-window] -= torch.ones(N - window, N - window).tril()
    return _softmax_attend(torch.where(neighbour.bool(), ns, gs), v, _causal(N))


@pytest.mark.parametrize("impl", ["reference", "blockwise"])
def test_rerope_equals_bojone_two_matrix(impl):
    q, k, v = _qkv(N=300)
    inv = rope_frequencies(16).inv_freq
    s = PositionScheme.preset("rerope", train_len=128, window=32)
    assert_close(attention(q, k, v, s, impl=impl), _bojone_rerope(q, k, v, 32, inv), rtol=1e-5, atol=1e-6)


def test_rerope_logn_equals_bojone():
    q, k, v = _qkv(N=200)
    inv = rope_frequencies(16).inv_freq
    s = PositionScheme.preset("rerope+logn", train_len=64, window=16)
    assert_close(attention(q, k, v, s, impl="blockwise"), _bojone_rerope(q, k, v, 16, inv, logn_L=64),
                 rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["reference", "blockwise"])
def test_leaky_rerope_equals_bojone(impl):
    q, k, v = _qkv(N=280)
    inv = rope_frequencies(16).inv_freq
    s = PositionScheme.preset("leaky_rerope", train_len=128, window=24, factor=4)
    assert_close(attention(q, k, v, s, impl=impl), _bojone_leaky(q, k, v, 24, 4, inv), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["reference", "blockwise"])
def test_selfextend_equals_longlm(impl):
    q, k, v = _qkv(N=270)
    inv = rope_frequencies(16).inv_freq
    s = PositionScheme.preset("selfextend", train_len=128, group=4, window=32)
    assert_close(attention(q, k, v, s, impl=impl), _longlm_selfextend(q, k, v, 4, 32, inv), rtol=1e-5, atol=1e-6)


def test_pcw_mask_and_positions_hand_written():
    pcw = ParallelContextWindows(window=2, n_windows=2)
    p = torch.arange(6)
    allowed = (MaskSpec().allowed(p[:, None], p[None]) & pcw.allowed(p[:, None], p[None])).int()
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1],
    ])
    assert torch.equal(allowed, expected)
    assert pcw.branches()[0].q_rot(p).tolist() == [0, 1, 0, 1, 2, 3]


def test_streaming_relative_positions_match_cache_slots():
    """A sink seen from query m sits at distance (slot of query) - sink = min(m, s+w-1) - kp."""
    from posenc.parts.remap import StreamingReindex

    r = StreamingReindex(n_sinks=2, window=3)
    qp = torch.tensor([10])
    kp = torch.tensor([0, 1, 8, 9, 10])
    # cache = [0, 1, 8, 9, 10] at slots 0..4; query slot 4
    assert r.relative(qp, kp).tolist() == [4.0, 3.0, 2.0, 1.0, 0.0]


@pytest.mark.parametrize("cls", sorted(set(REMAPS.values()), key=lambda c: c.__name__))
def test_remap_capabilities_agree_with_the_methods(cls):
    """``restricts_keys`` / ``remaps_distance`` are declared, not inferred: they must say whether the class
    overrides ``allowed`` / ``relative``."""
    assert cls.restricts_keys == (cls.allowed is not Remap.allowed), cls
    assert cls.remaps_distance == (cls.relative is not Remap.relative), cls


# ===================================================================== the parts
def test_temperature_hand_computed():
    t = Llama4Temperature(attn_scale=0.1, floor_scale=4.0)
    qp = torch.tensor([0, 2, 3, 6, 7, 100])
    # floor((p + 1) / 4) = 0, 0, 1, 1, 2, 25
    want = torch.tensor([1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3),
                         1 + 0.1 * math.log(26)], dtype=torch.float64)
    assert_close(t.scale(qp), want, rtol=1e-12, atol=0)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rot_scaled(x, t, inv_freq, a=1.0):
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
    q1, q2, kr = _rot_scaled(q, t, inv, a), _rot_scaled(q, (t - S + W).clamp(min=0), inv, a), _rot_scaled(k, t, inv, a)
    o1, l1 = _masked(q1, kr, v, (d >= 0) & ((d <= S) if overlap else (d < S)))
    o2, l2 = _masked(q2, kr, v, d >= S)
    w2 = torch.sigmoid(l2 - l1)[..., None]
    return torch.where(torch.isfinite(l2)[..., None], o1 + w2 * (o2 - o1), o1)


@pytest.mark.parametrize("S, W, N", [(8, 3, 40), (5, 0, 23), (12, 12, 30), (1, 1, 9)])
def test_string_equals_the_originals_rule(S, W, N):
    q, k, v = _qkv_typed(N)
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
    q, k, v = _qkv_typed(30)
    a = 0.1 * math.log(2) + 1
    s = PositionScheme.preset("string", train_len=64, shift=8, local=3, attention_factor=a)
    ref = string_prefill(q, k, v, 8, 3, rope_frequencies(16).inv_freq, a=a, overlap=False)
    assert relative_error(attention(q, k, v, s, impl="reference"), ref) <= 1e-6


def test_reads_content_is_declared_where_select_is_overridden():
    """The engine sends a remap to the score-tile backends by ``reads_content``; it must say whether the class
    overrides ``select`` (as ``restricts_keys`` / ``remaps_distance`` do for ``allowed`` / ``relative``)."""
    from posenc.parts.remap import REMAPS, Remap

    for cls in REMAPS.values():
        assert cls.reads_content == (cls.select is not Remap.select), cls
