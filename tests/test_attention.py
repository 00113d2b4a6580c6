"""The attention engine against independent implementations, known limits, and hand-written masks.

Independent references are written here from the papers / reference repos (bojone/rerope's
two-matrix ReRoPE and Leaky ReRoPE, datamllab/LongLM's SelfExtend, HF's apply_rotary_pos_emb +
SDPA), not from posenc's engine.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from posenc import PositionalAttention, PositionScheme, attention
from posenc._util import assert_close, relative_error
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.masks import MaskSpec, materialize
from posenc.parts.remap import ParallelContextWindows

torch.manual_seed(0)


def _qkv(B=2, H=4, N=96, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g) for _ in range(3)]


def _hf_rotate(x, pos, inv_freq):
    """HF Llama: cos/sin = cat(freqs, freqs); x*cos + rotate_half(x)*sin (float64 here)."""
    freqs = pos.double()[:, None] * inv_freq.double()[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _softmax_attend(scores, v, mask):
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _causal(N):
    return torch.ones(N, N, dtype=torch.bool).tril()


# ------------------------------------------------------------------ RoPE and its remaps vs references
def test_rope_equals_hf_rotation_plus_sdpa():
    q, k, v = _qkv()
    N, D = q.shape[2], q.shape[3]
    inv = rope_frequencies(D).inv_freq
    pos = torch.arange(N)
    ref = F.scaled_dot_product_attention(_hf_rotate(q, pos, inv), _hf_rotate(k, pos, inv), v, is_causal=True)
    s = PositionScheme.preset("rope", train_len=64)
    for impl in ("reference", "sdpa", "blockwise"):
        assert_close(attention(q, k, v, s, impl=impl), ref, rtol=1e-5, atol=1e-6, name=impl)


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "kerple_log", "xpos", "sinusoidal"])
def test_sdpa_training_path_gradients_equal_reference(name):
    """The fused path used for training gives the same gradients as the materialised reference."""
    s = PositionScheme.preset(name, train_len=32)
    torch.manual_seed(3)
    m = PositionalAttention(32, 4, s)
    x = torch.randn(2, 32, 32)
    grads = []
    for impl in ("reference", "sdpa"):
        m.zero_grad()
        m(x, impl=impl).pow(2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, name=n)


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


# ------------------------------------------------------------------ limits that reduce to known cases
@pytest.mark.parametrize("method,params", [
    ("rerope", {"window": 100}),            # window >= length
    ("leaky_rerope", {"window": 8, "factor": 1.0}),  # k = 1
    ("selfextend", {"group": 1, "window": 8}),       # G = 1
    ("lm_infinite", {"window": 100, "ceiling": 100}),
    ("sliding_window", {"window": 100}),
    ("streaming_llm", {"window": 100, "n_sinks": 4}),
    ("dynamic_ntk", {}),                    # inside the trained length
    ("dynamic_yarn", {}),
    ("dynamic_ntk_qwen", {}),
    ("logn", {}),
])
def test_limits_equal_plain_rope(method, params):
    q, k, v = _qkv(N=64)
    plain = attention(q, k, v, PositionScheme.preset("rope", train_len=64), impl="reference")
    s = PositionScheme.preset(method, train_len=64, **params)
    for impl in ("reference", "blockwise"):
        assert_close(attention(q, k, v, s, impl=impl), plain, rtol=1e-5, atol=1e-6, name=f"{method}/{impl}")


def test_dynamic_schedule_is_per_query():
    """Beyond L, query m uses the schedule for length m+1: the last query of a long sequence equals
    the last query of the static schedule at that length."""
    q, k, v = _qkv(N=96)
    dyn = attention(q, k, v, PositionScheme.preset("dynamic_ntk", train_len=32), impl="reference")
    for m in (31, 50, 95):
        static = PositionScheme.preset("rope", train_len=32)
        from dataclasses import replace
        sc = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": 32}
        freqs = rope_frequencies(16, scaling=sc, seq_len=max(m + 1, 32))
        ntk = replace(static, rope=replace(static.rope, base=10000.0,
                                           scaling={"rope_type": "base", "base": 10000.0 * (
                                               (freqs.inv_freq[-1].double() / rope_frequencies(16).inv_freq[-1]
                                                ) ** (-16 / 14)).item()}))
        ref = attention(q[:, :, : m + 1], k[:, :, : m + 1], v[:, :, : m + 1], ntk, impl="reference")
        assert_close(dyn[:, :, m], ref[:, :, m], rtol=1e-4, atol=1e-5, name=f"query {m}")


def test_dynamic_step_recomputes_the_schedule_every_step_positions():
    """``step=s``: query m uses the per-query schedule of position ceil((m+1)/s)*s - 1 (step 1: its own); a
    query at the end of a step block gives exactly what the per-token schedule gives there."""
    q, k, v = _qkv(N=96)
    exact = attention(q, k, v, PositionScheme.preset("dynamic_ntk", train_len=32), impl="reference")
    one = attention(q, k, v, PositionScheme.preset("dynamic_ntk", train_len=32, step=1), impl="reference")
    assert_close(one, exact, rtol=0, atol=0, name="step 1")
    stepped = attention(q, k, v, PositionScheme.preset("dynamic_ntk", train_len=32, step=16), impl="reference")
    for m in (47, 63, 95):  # ends of step blocks: the same length as the exact schedule
        assert_close(stepped[:, :, m], exact[:, :, m], rtol=1e-6, atol=1e-7, name=f"query {m}")
    assert (stepped[:, :, 40] - exact[:, :, 40]).abs().max() > 1e-6  # inside a block: the block's length
    assert_close(stepped[:, :, :32], exact[:, :, :32], rtol=0, atol=0, name="inside L")
    with pytest.raises(ValueError, match="step"):
        PositionScheme.preset("dynamic_ntk", train_len=32, step=0)


# ------------------------------------------------------------------ masks against hand-written matrices
def _grid(mask, n):
    p = torch.arange(n)[None]
    return materialize(mask, p, p)[0, 0].int()


def test_bca_mask_hand_written():
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
    ])
    assert torch.equal(_grid(MaskSpec(block=2), 6), expected)


def test_lambda_and_sink_masks_hand_written():
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 1, 1, 0, 0],
        [1, 0, 0, 1, 1, 0],
        [1, 0, 0, 0, 1, 1],
    ])  # one global/sink token + window 2
    assert torch.equal(_grid(MaskSpec(window=2, n_sinks=1), 6), expected)
    window_only = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    assert torch.equal(_grid(MaskSpec(window=2), 4), window_only)


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


def test_alibi_4x4_equals_formula():
    H, N, D = 2, 4, 8
    q, k, v = _qkv(B=1, H=H, N=N, D=D)
    s = PositionScheme.preset("alibi")
    out = attention(q, k, v, s, impl="reference")
    slopes = torch.tensor([2 ** -4, 2 ** -8])  # 2 heads: 2^(-8/2 * (h+1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(N)
    bias = -slopes[:, None, None] * (i[:, None] - i[None]).float()
    ref = _softmax_attend(scores + bias, v, _causal(N))
    assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_infini_single_segment_is_gated_softmax():
    s = PositionScheme.preset("infini", train_len=64, segment_len=64)
    m = PositionalAttention(32, 4, s)
    with torch.no_grad():
        m.memory.beta.copy_(torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    x = torch.randn(2, 40, 32)
    out = m(x, impl="reference")
    q, k, v = m.project(x)
    dot = attention(q, k, v, PositionScheme.preset("rope", train_len=64), impl="reference")
    gate = torch.sigmoid(m.memory.beta)[None, :, None, None]
    ref = m.o_proj(((1 - gate) * dot).transpose(1, 2).reshape(2, 40, 32))
    assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_infini_memory_carries_across_segments():
    s = PositionScheme.preset("infini", train_len=64, segment_len=8)
    m = PositionalAttention(32, 4, s)
    with torch.no_grad():
        m.memory.beta.fill_(3.0)
    x = torch.randn(1, 24, 32)
    x2 = x.clone()
    x2[:, :4] += 1.0  # change the first segment only
    a, b = m(x), m(x2)
    assert not torch.allclose(a[:, 8:], b[:, 8:])  # later segments see the first through memory


def test_infini_refuses_padding_cache_and_context():
    """The compressive memory folds every token into its state: padding, a cache or a context would be read
    wrongly, so each is refused by name; an all-True key mask is no padding and runs."""
    m = PositionalAttention(32, 4, PositionScheme.preset("infini", train_len=64, segment_len=8))
    x = torch.randn(2, 16, 32)
    mask = torch.ones(2, 16, dtype=torch.bool)
    assert_close(m(x, key_mask=mask), m(x))
    mask[0, :3] = False
    with pytest.raises(ValueError, match="infini.*padding"):
        m(x, key_mask=mask)
    with pytest.raises(ValueError, match="no KV cache or context"):
        m(x, context=(torch.zeros(2, 4, 4, 8), torch.zeros(2, 4, 4, 8), torch.zeros(2, 4, dtype=torch.long)))


# ------------------------------------------------------------------ fast paths == reference for every preset
TRAINED = list(PositionScheme.presets())
_INFERENCE_PARAMS = {
    "pi": {"factor": 4}, "ntk": {"factor": 4}, "ntk_mixed": {"factor": 4}, "yarn": {"factor": 4},
    "llama3": {"factor": 4}, "rope_base": {"base": 500.0}, "rerope": {"window": 40},
    "leaky_rerope": {"window": 40, "factor": 4}, "selfextend": {"group": 4, "window": 40},
    "sliding_window": {"window": 50}, "lm_infinite": {"window": 50}, "streaming_llm": {"window": 50},
    "bca": {}, "pcw": {"window": 64}, "logn": {}, "dynamic_ntk": {}, "dynamic_ntk_qwen": {},
    "dynamic_yarn": {}, "dca": {"chunk": 40, "local": 8}, "p_rope": {}, "chunked_attention": {"chunk": 48},
    "temperature_tuning": {"floor_scale": 16.0}, "string": {"shift": 40, "local": 8}, "resonance": {},
    "retrieval": {"window": 32, "n_sinks": 2, "block": 8, "top_k": 2}, "duo": {"streaming": [1, 3], "window": 20},
}


def _preset(name):
    from posenc.scheme.core import METHODS, TRAINED

    if name in METHODS and name not in TRAINED:
        return PositionScheme.preset(name, train_len=64, **_INFERENCE_PARAMS[name])
    return PositionScheme.preset(name, train_len=64)


def _attention_schemes(s):
    """The schemes one attention layer runs: a layer pattern's distinct layers, else the scheme itself."""
    return [s] if s.layers is None else list({x.to_json(): x for x in s.layers}.values())


@pytest.mark.parametrize("name", sorted(PositionScheme.presets()))
@pytest.mark.parametrize("n", [130, 256])
def test_blockwise_equals_reference_every_preset(name, n):
    torch.manual_seed(1)
    s = _preset(name)
    if s.max_positions is not None and n > s.max_positions:
        s = PositionScheme.preset(name, train_len=n)
    for layer in _attention_schemes(s):
        m = PositionalAttention(32, 4, layer)
        x = torch.randn(2, n, 32)
        with torch.no_grad():
            ref = m(x, impl="reference")
            fast = m(x, impl="blockwise")
            fused = m(x, impl="sdpa")  # single-branch schemes: fused SDPA; others fall back to blockwise
        assert relative_error(fast, ref) <= 1e-5
        assert relative_error(fused, ref) <= 1e-5


# a layer pattern's layers are covered through their own presets (chunked_attention, sliding_window, rope, nope,
# temperature_tuning): each compile costs seconds, so the patterns themselves are not compiled again here
@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(n for n in PositionScheme.presets()
                                        if _preset(n).layers is None))
def test_flex_equals_reference(name):
    """impl="flex" vs the materialised reference for every preset, at a length that is and one that is
    not a multiple of the 128-token block. Single-branch schemes run compiled FlexAttention (score_mod +
    block mask); multi-branch remaps and content-relative terms take the documented blockwise fallback."""
    torch.manual_seed(2)
    s = _preset(name)
    if s.max_positions is not None and s.max_positions < 256:
        s = PositionScheme.preset(name, train_len=256)
    m = PositionalAttention(32, 4, s).eval()
    for n in (256, 200):
        x = torch.randn(2, n, 32)
        with torch.no_grad():
            ref = m(x, impl="reference")
            fast = m(x, impl="flex")
        assert relative_error(fast, ref) <= 1e-5, (name, n)


def test_flex_falls_back_for_multi_branch_and_grad():
    from posenc.engine.backends import BY_NAME
    from posenc.engine.dispatch import make_call

    def why_not(name, grad):
        q, k, v = (t.requires_grad_(grad) for t in _qkv(N=8, D=8))
        return BY_NAME["flex"].why_not(make_call(PositionalAttention(32, 4, _preset(name)).parts, q, k, v))

    assert "branches" in why_not("rerope", False)
    assert "backward" in why_not("rope", True)
    assert why_not("rope", False) is None


@pytest.mark.parametrize("mask", [MaskSpec(window=70, n_sinks=3), MaskSpec(), MaskSpec(block=50),
                                  MaskSpec(window=64)])
@pytest.mark.parametrize("use_intervals", [False, True])
def test_block_mask_matches_dense(mask, use_intervals):
    from posenc.engine import build_block_mask

    p = torch.arange(300)[None]
    bm = build_block_mask(mask.allowed, p, p, block=64, key_intervals=mask.key_intervals if use_intervals else None)
    dense = materialize(mask, p, p)[0, 0]
    nb = (300 + 63) // 64
    for i in range(nb):
        rows = dense[i * 64:(i + 1) * 64]
        partial = {j for j in range(nb) if rows[:, j * 64:(j + 1) * 64].any()}
        full = {j for j in partial if rows.shape[0] == 64 and rows[:, j * 64:(j + 1) * 64].all()
                and (j + 1) * 64 <= 300}
        got_partial = set(bm.kv_indices[0, 0, i, : bm.kv_num_blocks[0, 0, i]].tolist())
        got_full = set(bm.full_kv_indices[0, 0, i, : bm.full_kv_num_blocks[0, 0, i]].tolist())
        assert got_full == full and got_partial == partial - full


@pytest.mark.parametrize("mask", [MaskSpec(window=7, n_sinks=2), MaskSpec(block=5), MaskSpec(window=3, block=4),
                                  MaskSpec(causal=False, window=6), MaskSpec()])
def test_key_intervals_cover_every_visible_key(mask):
    p = torch.arange(60)
    dense = mask.allowed(p[:, None], p[None])
    for q_lo in range(0, 60, 7):
        q_hi = min(59, q_lo + 9)
        visible = dense[q_lo:q_hi + 1].any(0).nonzero().flatten().tolist()
        ivs = mask.key_intervals(q_lo, q_hi)
        assert all(any(lo <= kp <= hi for lo, hi in ivs) for kp in visible), (q_lo, ivs)


# ------------------------------------------------------------------ gradients and learned parts
@pytest.mark.parametrize("name", ["t5", "kerple_power", "kerple_log", "shaw", "transformer_xl", "deberta",
                                  "infini"])
def test_gradients_reach_learned_parts(name):
    s = PositionScheme.preset(name, train_len=32)
    m = PositionalAttention(32, 4, s)
    x = torch.randn(2, 24, 32)
    m(x).pow(2).sum().backward()
    learned = [(n, p) for n, p in m.named_parameters() if not n.split(".")[0].endswith("proj")]
    assert learned, "scheme has no learned parameters"
    for n, p in learned:
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_ragged_positions_and_key_mask():
    """Per-row positions + padding keys: a left-padded row equals the unpadded computation."""
    q, k, v = _qkv(B=1, N=20)
    s = PositionScheme.preset("rerope", train_len=16, window=4)
    ref = attention(q, k, v, s, impl="reference")
    pad = 5
    qp = torch.cat([torch.zeros(pad, dtype=torch.long), torch.arange(20)])[None]
    z = torch.zeros(1, 4, pad, 16)
    qq, kk, vv = torch.cat([z, q], 2), torch.cat([z, k], 2), torch.cat([z, v], 2)
    km = torch.cat([torch.zeros(pad, dtype=torch.bool), torch.ones(20, dtype=torch.bool)])[None]
    for impl in ("reference", "blockwise"):
        out = attention(qq, kk, vv, s, q_pos=qp, k_pos=qp, key_mask=km, impl=impl)
        assert_close(out[:, :, pad:], ref, rtol=1e-5, atol=1e-6, name=impl)


def test_gqa_equals_repeated_heads():
    q = torch.randn(1, 4, 30, 16)
    k, v = torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16)
    s = PositionScheme.preset("yarn", train_len=16, factor=2)
    a = attention(q, k, v, s)
    b = attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), s)
    assert_close(a, b)


# ------------------------------------------------------------------ bad input
def test_bad_input_errors():
    with pytest.raises(ValueError, match="unknown"):
        PositionScheme.preset("no_such_method", train_len=16)
    with pytest.raises(ValueError, match="train_len"):
        PositionScheme.preset("yarn", factor=4)
    with pytest.raises(ValueError, match="factor"):
        PositionScheme.preset("yarn", train_len=16)
    with pytest.raises(ValueError, match="window"):
        PositionScheme.preset("rerope", train_len=16, window=0)
    with pytest.raises(ValueError, match="mask.window"):
        MaskSpec(window=-3)
    with pytest.raises(ValueError, match="no rotary part"):
        PositionScheme.preset("alibi", train_len=16).extend("yarn", factor=2)
    with pytest.raises(ValueError, match="impl"):
        attention(*_qkv(N=8), PositionScheme.preset("rope", train_len=8), impl="fast")
    with pytest.raises(ValueError, match="learned"):
        attention(*_qkv(N=8), PositionScheme.preset("t5", train_len=8))
    with pytest.raises(ValueError, match="not used"):
        PositionScheme.preset("rerope", train_len=16, window=4, factor=3)


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


@pytest.mark.parametrize("method,params", [("rerope", {"window": 48}), ("leaky_rerope", {"window": 24, "factor": 4}),
                                           ("selfextend", {"group": 4, "window": 40}), ("rerope+logn", {"window": 32})])
@pytest.mark.parametrize("N", [30, 300])
def test_band_merge_equals_reference(method, params, N):
    """The LSE merge of the near piece (window) and the far piece (minimum distance), each on the fused
    CPU flash kernel through the Toeplitz view, equals the materialised reference: a full forward, a run
    of queries continuing a cache, and a sequence shorter than the window (no far piece)."""
    from posenc.engine.backends import BY_NAME
    from posenc.engine.dispatch import make_call, run_backend
    from posenc.engine.parts import parts_for

    s = PositionScheme.preset(method, train_len=64, **params)
    q, k, v = _qkv(N=N)
    parts = parts_for(s.to_json(), 4, 16)
    for q0 in (0, N - 130 if N > 130 else N // 2):
        qq = q[:, :, q0:]
        qp, kp = torch.arange(q0, N)[None].expand(2, -1), torch.arange(N)[None].expand(2, -1)
        call = make_call(parts, qq, k, v, qp, kp)
        assert BY_NAME["band"].why_not(call) is None
        ref = attention(qq, k, v, s, q_pos=qp, k_pos=kp, impl="reference")
        out = run_backend(BY_NAME["band"], call)
        assert relative_error(out, ref) <= 1e-5, (q0, relative_error(out, ref))


@pytest.mark.compile
def test_flex_compile_says_so_once_per_shape(caplog, monkeypatch):
    """The first compiled-flex call of a shape announces the wait (the CLI shows posenc's INFO log);
    the second call of that shape is silent."""
    import logging

    import posenc.engine.backends.flex as flex_backend

    monkeypatch.setattr(flex_backend, "_FLEX_SEEN", set())  # as in a fresh process

    q, k, v = _qkv(B=1, N=200)
    s = PositionScheme.preset("alibi")
    with caplog.at_level(logging.INFO, logger="posenc"):
        attention(q, k, v, s, impl="flex")
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        attention(q, k, v, s, impl="flex")
        second = [r.getMessage() for r in caplog.records]
    assert any("compiling FlexAttention" in m and "200 x 200" in m for m in first), first
    assert any("ready in" in m for m in first) and second == []


@pytest.mark.compile
def test_flex_below_and_across_the_block_equals_reference():
    """Compiled CPU flex in torch 2.13 is wrong on blocks shorter than 128 (N=40 differed by 0.8-1.9, and
    5 queries after a 51-token prefix gave NaN); posenc pads to whole blocks. Lengths 1..128 and the
    decode-like 5 x 56 all pad to one 128 x 128 shape, 129 and 200 to 256: two compiles."""
    s = PositionScheme.preset("alibi")
    for nq, nk in [(1, 1), (40, 40), (127, 127), (128, 128), (129, 129), (200, 200), (5, 56)]:
        q, k, v = _qkv(B=2, N=nk, seed=nq)
        q = q[:, :, nk - nq:]
        ref = attention(q, k, v, s, impl="reference")
        for _ in range(2):  # identical calls agree (no uninitialised reads)
            assert relative_error(attention(q, k, v, s, impl="flex"), ref) <= 1e-5, (nq, nk)
    km = torch.ones(2, 40, dtype=torch.bool)
    km[1] = False  # a row of all padding: 0 on every path
    km[0, :30] = False
    q, k, v = _qkv(B=2, N=40)
    assert_close(attention(q, k, v, s, impl="flex", key_mask=km),
                 attention(q, k, v, s, impl="reference", key_mask=km), rtol=1e-5, atol=1e-6)
