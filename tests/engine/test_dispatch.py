"""posenc.engine.dispatch: which backend runs a call and what every path answers.

The backend registry (every backend named in IMPLS and selectable, says why it cannot run a call it cannot
compute exactly, ``auto`` walks the documented order), the dtype each backend runs or refuses by name, bad input
(a clear error naming the argument, or one documented answer on every path), learned sink logits refused when
NaN or +inf, dynamic schedules per query (and per ``step``), ragged positions, GQA, and every backend equal to
``reference`` on the training-free methods of 2024 (STRING, Resonance, InfLLM-style retrieval, DuoAttention,
DCA's temperatures)."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import assert_close, relative_error
from posenc.engine import AUTO_ORDER, FALLBACKS, AttentionParts, run_attention
from posenc.engine.backends import BACKENDS, BY_NAME
from posenc.engine.dispatch import IMPLS, choose_backend, make_call
from posenc.engine.parts import parts_for
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.masks import MaskSpec
from tests.support.attention import _qkv, _qkv_typed

torch.manual_seed(0)


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


def _call(scheme, N=80, Nq=None, B=1, H=2, D=8, grad=False, key_mask=None):
    g = torch.Generator().manual_seed(0)
    Nq = N if Nq is None else Nq
    q = torch.randn(B, H, Nq, D, generator=g).requires_grad_(grad)
    k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(2))
    return make_call(parts_for(scheme.to_json(), H, D), q, k, v, key_mask=key_mask)


def _preset(name, **params):
    return PositionScheme.preset(name, train_len=64, **params)


def test_every_backend_is_in_impls_and_selectable_by_name():
    assert IMPLS == ("auto",) + tuple(b.name for b in BACKENDS)
    assert len({b.name for b in BACKENDS}) == len(BACKENDS) and set(FALLBACKS) == set(BY_NAME)
    q, k, v = (torch.randn(1, 2, 70, 8) for _ in range(3))
    ref = attention(q, k, v, _preset("rope"), impl="reference")
    for name in IMPLS:
        if name != "flex":  # (compiled: tested in tests/engine/backends/test_flex.py)
            torch.testing.assert_close(attention(q, k, v, _preset("rope"), impl=name), ref, rtol=1e-5, atol=1e-6)


# (backend, a scheme/call it runs, one it cannot run exactly)
CASES = {
    "reference": (dict(scheme=_preset("rope")), None),
    "blockwise": (dict(scheme=_preset("rope")), None),
    "sdpa": (dict(scheme=_preset("alibi")), dict(scheme=_preset("rerope", window=16))),
    "flex": (dict(scheme=_preset("alibi")), dict(scheme=_preset("rope"), grad=True)),
    "band": (dict(scheme=_preset("rerope", window=16)), dict(scheme=_preset("rope"))),
    "toeplitz": (dict(scheme=_preset("alibi")),
                 dict(scheme=_preset("alibi"), key_mask=torch.ones(1, 80, dtype=torch.bool))),
    "sinks": (dict(scheme=_preset("streaming_llm", window=20, n_sinks=2)), dict(scheme=_preset("rope"))),
    "chunks": (dict(scheme=_preset("dca", chunk=24, local=4)), dict(scheme=_preset("rerope", window=16))),
    "retrieved": (dict(scheme=_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2)),
                  dict(scheme=_preset("rerope", window=16))),
}


@pytest.mark.parametrize("name", [b.name for b in BACKENDS])
def test_why_not_says_why(name):
    can, cannot = CASES[name]
    assert BY_NAME[name].why_not(_call(**can)) is None
    if cannot is None:  # reference and blockwise run every call
        return
    why = BY_NAME[name].why_not(_call(**cannot))
    assert isinstance(why, str) and why, (name, why)


def test_auto_order_is_the_documented_one():
    assert [(r.backend, r.prefer is None) for r in AUTO_ORDER] == [
        ("toeplitz", False), ("sinks", False), ("sdpa", False), ("flex", False), ("band", False),
        ("sinks", False), ("chunks", False), ("retrieved", False), ("blockwise", False), ("band", False),
        ("chunks", False), ("retrieved", False), ("reference", True)]
    assert [r.backend for r in FALLBACKS["flex"]] == ["band", "sinks", "chunks", "retrieved", "blockwise"]
    assert [r.backend for r in FALLBACKS["sdpa"]] == ["blockwise"]
    assert FALLBACKS["toeplitz"] == AUTO_ORDER[2:]


@pytest.mark.parametrize("scheme,kw,impl,expected", [
    (_preset("rope"), {}, "auto", "sdpa"),
    (_preset("alibi"), {}, "auto", "toeplitz"),
    (_preset("alibi"), dict(N=40), "auto", "sdpa"),  # below TOEPLITZ_MIN_QUERIES
    (_preset("streaming_llm", window=20, n_sinks=2), dict(N=300), "auto", "sinks"),
    (_preset("rerope", window=16), {}, "auto", "reference"),  # small: materialised
    (_preset("rerope", window=16), dict(N=300), "auto", "band"),  # Nq * Nk > 256^2: flex's stand-in
    (_preset("rerope", window=16), dict(N=300, grad=True), "auto", "reference"),
    (_preset("rerope", window=16), {}, "flex", "band"),
    (_preset("rerope", window=16), dict(grad=True), "flex", "blockwise"),
    (_preset("rerope", window=16), {}, "sdpa", "blockwise"),
    (_preset("rope"), {}, "toeplitz", "sdpa"),
    (_preset("rope"), {}, "band", "blockwise"),
    (_preset("dca", chunk=24, local=4), dict(N=300), "auto", "chunks"),
    (_preset("dca", chunk=24, local=4), {}, "flex", "chunks"),
    (_preset("dca", chunk=24, local=4), dict(grad=True), "chunks", "blockwise"),
    (_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2), dict(N=300), "auto", "retrieved"),
    (_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2), dict(N=300, Nq=1), "auto", "retrieved"),
    (_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2), dict(grad=True), "retrieved", "blockwise"),
    (_preset("duo", streaming=[1]), dict(N=300), "auto", "blockwise"),
])
def test_choice(scheme, kw, impl, expected):
    backend, declined = choose_backend(_call(scheme, **kw), impl)
    assert backend.name == expected, declined
    assert all(isinstance(why, str) and why for _, why in declined)


def test_debug_log_names_the_backend_and_the_reasons(caplog):
    q, k, v = (torch.randn(1, 2, 80, 8) for _ in range(3))
    with caplog.at_level(logging.DEBUG, logger="posenc"):
        attention(q, k, v, _preset("alibi").extend("pcw", window=20, n_windows=2))
    msg = [r.getMessage() for r in caplog.records if "ran" in r.getMessage()]
    assert msg and "ran sdpa" in msg[-1] and "toeplitz: the remap adds a mask" in msg[-1], msg

ROPE = PositionScheme.preset("rope", train_len=64)

EAGER = ("reference", "sdpa", "blockwise", "auto")


def _qkv_gqa(B=2, H=4, Nq=24, Nk=24, D=16, Hk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Nq, D, generator=g), torch.randn(B, Hk or H, Nk, D, generator=g),
            torch.randn(B, Hk or H, Nk, D, generator=g))


@pytest.mark.parametrize("change,match", [
    (lambda q, k, v: (q, k, v[:, :, :3]), "same number of tokens"),      # k 24 keys, v 3
    (lambda q, k, v: (q[0], k, v), "q must be 4-D"),                      # 3-D q
    (lambda q, k, v: (q, k[..., :8], v), "head_dim"),                     # q/k head-dim mismatch
    (lambda q, k, v: (q[:1], k, v), "batch"),                             # batch-1 q against batch-2 k
    (lambda q, k, v: (q, k[:, :3], v[:, :3]), "heads"),                   # 4 query heads, 3 kv heads
    (lambda q, k, v: (q[:0], k[:0], v[:0]), "batch, heads, tokens"),      # B = 0
    (lambda q, k, v: (q[:, :, :0], k, v), "batch, heads, tokens"),       # N = 0
    (lambda q, k, v: (q, k.double(), v), "dtype"),
])
def test_shape_errors(change, match):
    with pytest.raises(ValueError if match != "dtype" else TypeError, match=match):
        attention(*change(*_qkv_gqa()), ROPE)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "x"])
def test_scale_must_be_finite_positive(scale):
    with pytest.raises(ValueError, match="scale"):
        attention(*_qkv_gqa(), ROPE, scale=scale)


@pytest.mark.parametrize("key_mask,err", [
    (torch.ones(2, 24), TypeError),                          # float mask
    (torch.ones(2, 23, dtype=torch.bool), ValueError),       # wrong length
    (torch.ones(24, dtype=torch.bool), ValueError),          # missing batch dim
])
def test_key_mask_type_and_shape(key_mask, err):
    with pytest.raises(err, match="key_mask"):
        attention(*_qkv_gqa(), ROPE, key_mask=key_mask)


def test_unknown_impl():
    with pytest.raises(ValueError, match="impl"):
        attention(*_qkv_gqa(), ROPE, impl="fast")


def test_explicit_scale_equals_reference_on_every_path():
    q, k, v = _qkv_gqa()
    ref = attention(q, k, v, ROPE, impl="reference", scale=0.3)
    for impl in EAGER:
        torch.testing.assert_close(attention(q, k, v, ROPE, impl=impl, scale=0.3), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["rope", "alibi", "sliding_window"])
def test_nan_query_row_gives_nan_row_on_every_path(name):
    s = PositionScheme.preset(name, train_len=64, **({"window": 8} if name == "sliding_window" else {}))
    q, k, v = _qkv_gqa(Nq=80, Nk=80)
    q[1, 2, 40, 3] = float("nan")
    for impl in EAGER + ("toeplitz",):
        out = attention(q, k, v, s, impl=impl)
        assert out[1, 2, 40].isnan().all(), impl
        keep = torch.ones(out.shape[:3], dtype=torch.bool)
        keep[1, 2, 40] = False
        assert out[keep].isfinite().all(), impl


def test_all_padding_row_gives_zero_on_every_path():
    q, k, v = _qkv_gqa()
    km = torch.ones(2, 24, dtype=torch.bool)
    km[1] = False  # every key of row 1 is padding
    km[0, :20] = False  # row 0: all but the last keys are padding
    for name in ("rope", "alibi", "rerope"):
        s = PositionScheme.preset(name, train_len=64, **({"window": 8} if name == "rerope" else {}))
        ref = attention(q, k, v, s, impl="reference", key_mask=km)
        assert (ref[1] == 0).all() and ref.isfinite().all()
        for impl in EAGER:
            torch.testing.assert_close(attention(q, k, v, s, impl=impl, key_mask=km), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("B,H,Hk,Nq,Nk", [(1, 2, 1, 1, 1), (3, 4, 2, 7, 7), (2, 6, 3, 5, 56), (1, 4, 4, 131, 131)])
def test_eager_paths_equal_reference_on_awkward_shapes(B, H, Hk, Nq, Nk):
    q, k, v = _qkv_gqa(B=B, H=H, Hk=Hk, Nq=Nq, Nk=Nk)
    for name in ("rope", "alibi", "rerope", "streaming_llm"):
        params = {"window": 8} if name in ("rerope", "streaming_llm") else {}
        s = PositionScheme.preset(name, train_len=64, **params)
        ref = attention(q, k, v, s, impl="reference")
        for impl in EAGER + ("toeplitz",):
            torch.testing.assert_close(attention(q, k, v, s, impl=impl), ref, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, impl=impl, name=name: f"{name}/{impl}: {m}")

P = PositionScheme


# ---------------------------------------------------------------------------------------------- sink logits
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_plus_inf_sink_logits_are_refused(bad):
    parts = AttentionParts(P.preset("rope", train_len=16), 2, 8)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=rf"sink_logits must be finite, or -inf .* got \[{bad}\] at head\(s\) \[1\]"):
        run_attention(parts, q, q, q, sink_logits=torch.tensor([0.0, bad]))


@pytest.mark.parametrize("impl", ["reference", "blockwise", "auto"])
def test_a_minus_inf_sink_is_no_sink_and_an_all_padding_row_gives_zero(impl):
    parts = AttentionParts(P.preset("rope", train_len=16), 2, 8)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :4] = False  # row 1: its first 4 queries see only padding keys
    sinks = torch.tensor([-math.inf, -math.inf])
    out = run_attention(parts, q, k, v, impl=impl, key_mask=mask, sink_logits=sinks)
    plain = run_attention(parts, q, k, v, impl="reference", key_mask=mask)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1, :, :4], torch.zeros_like(out[1, :, :4]))  # what the docstring promises
    torch.testing.assert_close(out, plain, rtol=1e-6, atol=1e-6)


SCHEMES = {"rope": P.preset("rope", train_len=64), "alibi": P.preset("alibi", train_len=64),
           "rerope": P.preset("rerope", train_len=64, window=16), "softcap": replace(P.preset("rope", train_len=64),
                                                                                 softcap=30.0)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("impl", IMPLS)
def test_every_backend_runs_a_dtype_or_refuses_it_by_name(impl, dtype):
    """A named backend: runs the dtype it declares (on itself or its documented fallback), else a TypeError
    naming the backends that run it. ``auto`` never picks a backend that does not run the dtype."""
    for scheme in SCHEMES.values():
        parts = AttentionParts(scheme, 2, 8)
        q = torch.randn(1, 2, 300, 8).to(dtype)
        call = make_call(parts, q, q, q)
        if impl != "auto" and dtype not in BY_NAME[impl].dtypes:
            with pytest.raises(TypeError, match=rf"impl='{impl}' does not run {dtype} inputs .* runs on impl="):
                choose_backend(call, impl)
            continue
        backend, _ = choose_backend(call, impl)
        assert dtype in backend.dtypes, (impl, backend.name)
    assert all(torch.float64 in BY_NAME[n].dtypes for n in ("reference", "sdpa", "blockwise"))
    assert torch.float64 not in BY_NAME["flex"].dtypes  # inductor has no float64 FlexAttention on CPU


@pytest.mark.parametrize("name", ["rope", "alibi", "nope", "p_rope", "rope_2d", "mrope"])
def test_float64_named_flex_is_refused_not_an_inductor_error(name):
    q = torch.randn(1, 2, 40, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="impl='flex' does not run torch.float64 inputs"):
        attention(q, q, q, P.preset(name, train_len=64), impl="flex")


@pytest.mark.parametrize("scheme, n", [(replace(P.preset("rope", train_len=64), softcap=30.0), 300),
                                       (P.preset("chunked_attention", train_len=64), 4200)])
def test_float64_under_auto_runs_where_flex_would_have_been_chosen(scheme, n):
    q = torch.randn(1, 1, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = attention(q, q, q, scheme)
    assert out.dtype == torch.float64 and torch.isfinite(out).all()
    tail = slice(n - 64, n)  # the last queries against the reference (a full one at 4200 is 18M scores)
    ref = attention(q[:, :, tail], q, q, scheme, q_pos=torch.arange(n)[tail], impl="reference")
    torch.testing.assert_close(out[:, :, tail], ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", ["reference", "blockwise"])
def test_float64_stays_exact_on_reference_and_blockwise(impl):
    """Against the formula in float64 (frequencies as the library defines them, float32 inv_freq): no float32
    rounding left in cos/sin or the softmax."""
    B, H, N, D = 1, 2, 70, 16
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    inv = (1.0 / 10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).float().double()
    ang = torch.arange(N, dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(x):
        return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

    s = (rot(q) @ rot(k).transpose(-1, -2) / math.sqrt(D)).masked_fill(
        torch.triu(torch.ones(N, N, dtype=torch.bool), 1), -math.inf)
    want = torch.softmax(s, -1) @ v
    got = attention(q, k, v, P.preset("rope", train_len=64), impl=impl)
    assert float((got - want).abs().max()) < 1e-13

CHECKED_IMPLS = ("blockwise", "auto", "flex", "band", "sinks", "sdpa")


# ============================================================================ every backend, cache, transformers
NEW = [("string", dict(shift=20, local=5, attention_factor=1.07)), ("resonance+yarn", dict(factor=4.0)),
       ("retrieval", dict(window=16, n_sinks=2, block=8, top_k=2)), ("retrieval", dict(window=9, block=3,
                                                                                       top_k=3, per_head=True)),
       ("duo", dict(streaming=[0, 2], n_sinks=2, window=10)), ("dca", dict(chunk=40, local=8, temperature="qwen")),
       ("dca", dict(chunk=40, local=8, temperature="chunkllama", temperature_length="sequence"))]


@pytest.mark.parametrize("spec, kw", NEW)
def test_every_backend_equals_reference(spec, kw):
    s = PositionScheme.preset(spec, train_len=64, **kw)
    q, k, v = _qkv_typed(300, B=1, H=4, seed=1, dtype=torch.float32)
    ref = attention(q, k, v, s, impl="reference")
    for impl in CHECKED_IMPLS:
        assert relative_error(attention(q, k, v, s, impl=impl), ref) <= 1e-5, impl
    for n in (1, 37):  # a decode step and a prefill continuation
        ref = attention(q[:, :, -n:], k, v, s, impl="reference")
        for impl in CHECKED_IMPLS:
            assert relative_error(attention(q[:, :, -n:], k, v, s, impl=impl), ref) <= 1e-5, (impl, n)
