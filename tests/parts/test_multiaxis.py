"""Multi-axis RoPE (posenc.parts.multiaxis; presets rope_2d, rope_mixed, mrope): equal to
rotary-embedding-torch's axial frequencies and to transformers' Qwen2-VL M-RoPE on identical inputs,
RoPE-Mixed equal to a hand-written complex rotation with learned frequencies that train, every backend
equal to ``reference``, positions ``[B, N, A]`` through the engine and the module, clear errors (parameters
refused when the scheme is built, positions of the wrong shape named by the scheme's axes)."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc import PositionalAttention, PositionScheme, attention
from posenc._util import relative_error
from posenc.models.cache import KVCache
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.multiaxis import AxialRope, MixedRope, MRope, apply_multiaxis_rope, grid_positions

P = PositionScheme


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


def _qkv(B, H, N, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g) for _ in range(3))


# ------------------------------------------------------------------ rope_2d vs rotary-embedding-torch
@pytest.mark.parametrize("freqs", ["lang", "pixel"])
def test_axial_rotation_equals_rotary_embedding_torch(freqs):
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

    h, w, R = 3, 5, 32
    x = _qkv(2, 4, h * w, R + 8)[0]  # 8 features pass through unrotated
    ref_rope = RotaryEmbedding(dim=R // 2, freqs_for=freqs, max_freq=7.0, theta=100.0)
    ref = apply_rotary_emb(ref_rope.get_axial_freqs(h, w).reshape(h * w, R), x)
    part = AxialRope(R, base=100.0, freqs=freqs, max_freq=7.0, grid=(h, w))
    out = apply_multiaxis_rope(x, grid_positions(h, w), part, rotary_dim=R)
    assert relative_error(out, ref) <= 1e-6


@pytest.mark.parametrize("freqs", ["lang", "pixel"])
def test_rope_2d_attention_equals_rotary_embedding_torch_plus_sdpa(freqs):
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

    h, w, D = 4, 6, 16
    q, k, v = _qkv(2, 2, h * w, D, seed=1)
    ref_rope = RotaryEmbedding(dim=D // 2, freqs_for=freqs, max_freq=9.0, theta=500.0)
    f = ref_rope.get_axial_freqs(h, w).reshape(h * w, D)
    ref = F.scaled_dot_product_attention(apply_rotary_emb(f, q), apply_rotary_emb(f, k), v)
    extra = dict(grid=[h, w], max_freq=9.0) if freqs == "pixel" else {}
    s = PositionScheme.preset("rope_2d", train_len=h * w, base=500.0, freqs=freqs, **extra)
    pos = grid_positions(h, w)[None]  # [1, h*w, 2]
    for impl in ("reference", "sdpa", "blockwise", "auto"):
        out = attention(q, k, v, s, q_pos=pos, k_pos=pos, impl=impl)
        assert relative_error(out, ref) <= 1e-5, impl


# ------------------------------------------------------------------ mrope vs transformers' Qwen2-VL
def _qwen2vl_rotary(head_dim, sections, base=10000.0):
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    cfg = Qwen2VLTextConfig(hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=2,
                            rope_parameters={"rope_type": "default", "rope_theta": base, "mrope_section": sections})
    return Qwen2VLRotaryEmbedding(cfg)


def test_mrope_equals_transformers_qwen2_vl():
    """transformers 5.23 folds Qwen2-VL's section recomposition (``mrope_section``) into
    ``Qwen2VLRotaryEmbedding`` and rotates with ``apply_rotary_pos_emb``: the same inputs give the same
    rotated q and k, and the same causal attention."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    B, N, D, sections = 2, 11, 32, [4, 6, 6]
    pos = torch.randint(0, 30, (3, B, N), generator=torch.Generator().manual_seed(2))  # t, h, w ids
    q, k, v = _qkv(B, 2, N, D, seed=3)
    cos, sin = _qwen2vl_rotary(D, sections)(q, pos)
    qe, ke = apply_rotary_pos_emb(q, k, cos, sin)
    ours = apply_multiaxis_rope(q, pos.permute(1, 2, 0), MRope(D, sections), rope_frequencies(D).inv_freq, "half")
    assert relative_error(ours, qe) <= 1e-6
    ref = F.scaled_dot_product_attention(qe, ke, v, is_causal=True)
    s = PositionScheme.preset("mrope", train_len=64, sections=sections)
    for impl in ("reference", "sdpa", "blockwise"):
        out = attention(q, k, v, s, q_pos=pos.permute(1, 2, 0), k_pos=pos.permute(1, 2, 0), impl=impl)
        assert relative_error(out, ref) <= 1e-5, impl


def test_mrope_text_positions_are_plain_rope():
    q, k, v = _qkv(1, 2, 20, 32, seed=4)
    a = attention(q, k, v, PositionScheme.preset("mrope", train_len=64))
    b = attention(q, k, v, PositionScheme.preset("rope", train_len=64))
    assert relative_error(a, b) <= 1e-6


def test_mrope_default_sections_follow_qwen2_vl():
    assert MRope(128).sections == (16, 24, 24)


# ------------------------------------------------------------------ RoPE-Mixed
def _mixed_reference(x, freqs, pos):
    """rope-vit's mixed rotation written out: per head the complex factor exp(i (t_x f_x + t_y f_y)) on
    interleaved pairs (view_as_complex)."""
    t_x, t_y = pos[:, 0].double(), pos[:, 1].double()
    angles = t_x[None, :, None] * freqs[:, 0, None, :].double() + t_y[None, :, None] * freqs[:, 1, None, :].double()
    cis = torch.polar(torch.ones_like(angles), angles)  # [H, N, R/2]
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis[None]).flatten(-2).to(x.dtype)


def test_rope_mixed_equals_complex_rotation_and_inits_like_the_paper():
    torch.manual_seed(0)
    m = PositionalAttention(32, 4, PositionScheme.preset("rope_mixed", train_len=16))
    part = m.parts.multiaxis
    assert tuple(part.freqs.shape) == (4, 2, 4) and part.freqs.requires_grad  # [H, (x, y), R/2]
    mag = 1.0 / (10.0 ** (torch.arange(0, 8, 4).float() / 8))
    fixed = MixedRope(8, n_heads=1, rotate=False).freqs[0]
    assert torch.allclose(fixed[0], torch.cat([mag, mag * math.cos(math.pi / 2)]), atol=1e-7)  # theta_x
    assert torch.allclose(fixed[1], torch.cat([torch.zeros(2), mag]), atol=1e-7)  # theta_y
    x = _qkv(2, 4, 12, 8, seed=5)[0]
    pos = grid_positions(3, 4)
    assert relative_error(apply_multiaxis_rope(x, pos, part), _mixed_reference(x, part.freqs, pos)) <= 1e-6


def test_rope_mixed_frequencies_train():
    torch.manual_seed(0)
    m = PositionalAttention(32, 4, PositionScheme.preset("rope_mixed", train_len=16))
    pos = grid_positions(4, 4)[None]
    x = torch.randn(2, 16, 32)
    m(x, positions=pos).square().mean().backward()
    g = m.parts.multiaxis.freqs.grad
    assert g is not None and bool(g.abs().sum() > 0)


# ------------------------------------------------------------------ the engine with [B, N, A] positions
MULTI = [("rope_2d", {}), ("rope_mixed", {}), ("mrope", {"sections": [2, 1, 1]})]


def _grid_case(name, params, h=10, w=20):
    torch.manual_seed(0)
    m = PositionalAttention(32, 4, PositionScheme.preset(name, train_len=16, **params)).eval()
    pos = torch.stack([grid_positions(h, w), grid_positions(w, h)])  # [2, h*w, 2]
    if name == "mrope":
        pos = torch.cat([torch.arange(h * w).expand(2, h * w)[..., None], pos], dim=-1)  # [2, h*w, 3]
    return m, pos, torch.randn(2, h * w, 32)


@pytest.mark.parametrize("name, params", MULTI)
@pytest.mark.parametrize("impl", ["sdpa", "blockwise", "auto"])
def test_backends_equal_reference_with_grid_positions(name, params, impl):
    m, pos, x = _grid_case(name, params)
    with torch.no_grad():
        ref = m(x, positions=pos, impl="reference")
        assert relative_error(m(x, positions=pos, impl=impl), ref) <= 1e-5


@pytest.mark.compile
@pytest.mark.parametrize("name, params", MULTI)
def test_flex_equals_reference_with_grid_positions(name, params):
    m, pos, x = _grid_case(name, params, 16, 16)
    with torch.no_grad():
        ref = m(x, positions=pos, impl="reference")
        assert relative_error(m(x, positions=pos, impl="flex"), ref) <= 1e-5


def test_mrope_cached_decode_equals_full_forward():
    """A text-only Qwen2-VL-style stream ([B, N] positions) decodes with the cache like any RoPE model."""
    torch.manual_seed(0)
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, train_len=16,
                                          scheme=PositionScheme.preset("mrope", train_len=16))).eval()
    ids = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache.for_model(model, 2)
        outs = [model(ids[:, :6], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(6, 20)]
    assert relative_error(torch.cat(outs, dim=1), full) <= 1e-5


def test_bad_input():
    m = PositionalAttention(32, 4, PositionScheme.preset("rope_2d", train_len=16))
    x = torch.randn(1, 6, 32)
    with pytest.raises(ValueError, match=r"positions of this multi-axis scheme \(2 axes\) must be"):
        m(x, positions=torch.zeros(1, 6, 3, dtype=torch.long))  # three axes for a 2-axis scheme
    with pytest.raises(ValueError, match="integers"):
        m(x, positions=torch.zeros(1, 6, 2))
    with pytest.raises(ValueError, match="cache"):
        m(x, positions=grid_positions(2, 3)[None], cache=object(), layer=0)
    with pytest.raises(ValueError, match="multiaxis part"):
        attention(*_qkv(1, 2, 6, 16), PositionScheme.preset("rope", train_len=16), q_pos=grid_positions(2, 3)[None],
                  k_pos=grid_positions(2, 3)[None])
    with pytest.raises(ValueError, match="sum to"):
        PositionalAttention(32, 4, PositionScheme.preset("mrope", train_len=16, sections=[1, 1, 1]))
    with pytest.raises(ValueError, match="grid"):
        PositionalAttention(32, 4, PositionScheme.preset("rope_2d", train_len=16, freqs="pixel"))
    with pytest.raises(ValueError, match="remap"):
        PositionScheme.preset("rope_2d", train_len=16).extend("rerope")
    with pytest.raises(ValueError, match="parameter"):
        PositionScheme.preset("rope_2d", train_len=16, sections=[1, 1])
