"""The surfaces reliability round 3 found unchecked: each bad value is refused when the object is built (or
when the call starts), by name, and each dtype either runs on a backend or is refused by name there.

Presets with a float period, range messages, learned sink logits, multi-axis parameters and positions,
PositionalAttention's input dtype, and the dtype of every backend (float64 exact on reference/blockwise)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch

from posenc import PositionalAttention, PositionScheme, attention, grid_positions
from posenc.engine import AttentionParts, run_attention
from posenc.engine.backends import BACKENDS, BY_NAME
from posenc.engine.dispatch import IMPLS, choose_backend, make_call

P = PositionScheme


# ---------------------------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", ["irope", "local_global", "nope_every4"])
def test_a_pattern_preset_takes_an_integral_float_period(name):
    assert P.preset(name, train_len=64, every=2.0) == P.preset(name, train_len=64, every=2)
    with pytest.raises(ValueError, match=rf"{name}.every must be an integer >= 1, got 2.5"):
        P.preset(name, train_len=64, every=2.5)
    assert P.preset("irope", train_len=64, chunk=16.0) == P.preset("irope", train_len=64, chunk=16)


@pytest.mark.parametrize("name, params, message", [
    ("fire", {"threshold": 0}, "fire.threshold must be a number >= 1, got 0"),
    ("fire", {"c": 0.0}, "fire.c must be a number > 0, got 0.0"),
    ("fox", {"bias_init": "x"}, "fox.bias_init must be a finite number, got 'x'"),
    ("fox", {"bias_init": math.inf}, "fox.bias_init must be a finite number, got inf"),
    ("cope", {"npos_max": 1.5}, "cope.npos_max must be an integer >= 2, got 1.5"),
    # refused when the scheme is built (they were a raw TypeError, accepted until a model was built, or 0 replaced
    # by the default)
    ("streaming_llm", {"n_sinks": "x"}, "streaming_llm.n_sinks must be an integer >= 0, got 'x'"),
    ("hierarchical", {"alpha": 1.0}, "hierarchical.alpha must be > 0 and < 1, got 1.0"),
    ("hierarchical", {"alpha": "x"}, "hierarchical.alpha must be > 0 and < 1, got 'x'"),
    ("learned", {"max_positions": 0}, "learned.max_positions must be an integer >= 1, got 0"),
    ("infini", {"segment_len": 0}, "infini.segment_len must be an integer >= 1, got 0"),
    ("infini", {"segment_len": "x"}, "infini.segment_len must be an integer >= 1, got 'x'"),
    ("infini", {"rope": "no"}, "infini.rope must be true or false, got 'no'"),
])
def test_range_messages_read_as_a_sentence(name, params, message):
    with pytest.raises(ValueError) as exc:
        P.preset(name, train_len=64, **params)
    assert str(exc.value) == message


def test_the_hierarchical_method_checks_alpha_when_applied():
    learned = P.preset("learned", train_len=64)
    assert learned.extend("hierarchical", alpha=0.25).embedding.params["alpha"] == 0.25
    for bad in (0.0, 1.0, "x", [0.4]):
        with pytest.raises(ValueError, match=rf"^hierarchical.alpha must be > 0 and < 1, got {re.escape(repr(bad))}$"):
            learned.extend("hierarchical", alpha=bad)


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


# ---------------------------------------------------------------------------------------------- multi-axis
@pytest.mark.parametrize("name, params, message", [
    ("rope_2d", {"freqs": "bogus"}, "axial.freqs must be 'lang' or 'pixel', got 'bogus'"),
    ("rope_2d", {"grid": [4, "a"]}, r"axial.grid\[1\] must be an integer >= 1, got 'a'"),
    ("rope_2d", {"grid": [4]}, "axial.grid must give the grid size of each of the 2 axes"),
    ("rope_2d", {"freqs": "pixel"}, "axial.grid must give the grid size of each of the 2 axes"),
    ("rope_2d", {"max_freq": 0}, "axial.max_freq must be > 0.0, got 0"),
    ("rope_2d", {"n_axes": 0}, "axial.n_axes must be an integer >= 1, got 0"),
    ("mrope", {"sections": [0, 4, 4]}, r"mrope.sections\[0\] must be an integer >= 1, got 0"),
    ("mrope", {"sections": "16,24,24"}, "mrope.sections must be a non-empty list"),
    ("rope_mixed", {"theta": -1.0}, "mixed.theta must be > 0.0, got -1.0"),
    ("rope_mixed", {"rotate": "yes"}, "mixed.rotate must be true or false, got 'yes'"),
])
def test_multi_axis_parameters_are_refused_when_the_scheme_is_built(name, params, message):
    with pytest.raises(ValueError, match=message):
        P.preset(name, train_len=16, **params)
    with pytest.raises(ValueError, match=message):  # and when it is read back from JSON
        P.from_dict({**P.preset(name, train_len=16).to_dict(),
                     "multiaxis": {"kind": P.preset(name, train_len=16).multiaxis.kind, "params": params}})


def test_grid_positions_as_seq_by_axes_are_read_as_coordinates():
    scheme = P.preset("rope_2d", train_len=16)
    q = torch.randn(1, 2, 16, 8)
    pos = grid_positions(4, 4)  # [16, 2]
    torch.testing.assert_close(attention(q, q, q, scheme, q_pos=pos, k_pos=pos),
                               attention(q, q, q, scheme, q_pos=pos[None], k_pos=pos[None]), rtol=0, atol=0)
    layer = PositionalAttention(16, 2, scheme)
    x = torch.randn(1, 16, 16)
    torch.testing.assert_close(layer(x, positions=pos), layer(x, positions=pos[None]), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"got shape \(16, 2\); a \[seq, n_axes\] tensor such as grid_positions"):
        attention(q, q, q, P.preset("rope", train_len=16), q_pos=pos, k_pos=pos)


@pytest.mark.parametrize("name, shape, batch", [("mrope", (16, 2), 1), ("rope_2d", (16, 3), 1),
                                               ("rope_2d", (1, 16, 3), 1), ("rope_2d", (3, 16, 2), 2)])
def test_axis_positions_of_the_wrong_shape_name_the_schemes_axes(name, shape, batch):
    """grid_positions(4, 4) given to mrope (3 axes) is refused naming its 3 axes, not read as a batch of 16 rows;
    the batch reads '1' or '1 or 2', never '1 or 1'."""
    scheme, axes = P.preset(name, train_len=16), 3 if name == "mrope" else 2
    pos = torch.zeros(shape, dtype=torch.long)
    rows = "1" if batch == 1 else "1 or 2"
    message = "^" + re.escape(f"positions of this multi-axis scheme ({axes} axes) must be [seq, {axes}] or [batch, "
                              f"seq, {axes}] with batch {rows} and seq 16, got shape {shape}")
    q = torch.randn(batch, 2, 16, 8)
    with pytest.raises(ValueError, match=message):
        attention(q, q, q, scheme, q_pos=pos, k_pos=pos)
    with pytest.raises(ValueError, match=message):
        PositionalAttention(16, 2, scheme)(torch.randn(batch, 16, 16), positions=pos)


@pytest.mark.parametrize("batch", [1, 2])
def test_apply_rope_names_the_batch_sizes_it_takes_and_the_grid_hint(batch):
    from posenc.parts.rotary import apply_rope

    x, inv = torch.randn(batch, 2, 16, 8), 1.0 / 10000.0 ** (torch.arange(0, 8, 2) / 8)
    rows = "1" if batch == 1 else "1 or 2"
    with pytest.raises(ValueError, match=rf"^positions has batch 3, expected {rows}$"):
        apply_rope(x, torch.zeros(3, 16, dtype=torch.long), inv)
    with pytest.raises(ValueError, match=r"^positions has length 2, expected 16; a \[seq, n_axes\] tensor such as "
                                         r"grid_positions\(...\) is for a scheme with a multi-axis part"):
        apply_rope(x, grid_positions(4, 4), inv)


# ---------------------------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_positional_attention_names_a_wrong_input_dtype(dtype):
    layer = PositionalAttention(16, 2, P.preset("rope", train_len=16))
    x = torch.randn(1, 4, 16).to(dtype) if dtype.is_floating_point else torch.randint(0, 9, (1, 4, 16))
    with pytest.raises(TypeError, match=r"x must (have|be a floating-point tensor of) the layer's dtype torch.float32"):
        layer(x)
    if dtype.is_floating_point:  # the layer converted to the input's dtype runs it
        assert layer.to(dtype)(x).dtype == dtype


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


def test_backends_declare_dtypes():
    assert {b.name for b in BACKENDS} == set(IMPLS) - {"auto"}
    for b in BACKENDS:
        assert torch.float32 in b.dtypes and torch.bfloat16 in b.dtypes
