"""RoPE / xPos (posenc.parts.rotary): equality with Hugging Face and rotary-embedding-torch, properties, precision,
validation; the fused C++ RoPE kernel equals the PyTorch path (and its build survives a killed build)."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import grid_positions
from posenc._util import assert_close
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.rotary import (
    _KERNEL_MIN_NUMEL,
    RopeAngleCache,
    _cached_cos_sin,
    _rotate_kernel,
    _rotate_torch,
    apply_rope,
    apply_rope_,
    apply_rope_cos_sin,
    rope_cos_sin,
    rope_kernel,
    xpos_scale,
)


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

needs_kernel = pytest.mark.skipif(rope_kernel() is None, reason="C++ extension unavailable (pure path is used)")


def _inv(rot: int) -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))


@needs_kernel
def test_a_build_killed_half_way_does_not_hang_later_processes():
    """A killed ``load_inline`` build leaves torch's baton file (``<build dir>/lock``); torch then waits
    for it forever. The kernel's own flock proves the baton stale and removes it, so a new process loads
    the kernel instead of sleeping (without the fix this subprocess never returns)."""
    import os
    import subprocess
    import sys

    from posenc.parts.rotary import _BuildLock, _extension_dir

    build_dir = _extension_dir()
    with _BuildLock(build_dir) as lock:  # no live build can be in progress while we hold it
        open(lock.baton, "w").close()  # what a build killed half-way leaves behind
    code = "from posenc.parts.rotary import rope_kernel; assert rope_kernel() is not None"
    done = subprocess.run([sys.executable, "-c", code], timeout=180, capture_output=True, text=True,
                          env={**os.environ, "POSENC_NO_EXT": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert not os.path.exists(os.path.join(build_dir, "lock"))


def test_each_torch_install_builds_the_kernel_in_its_own_folder(monkeypatch):
    """Two environments (two checkouts, two venvs) must not share a build folder: the build file names
    torch's include paths, so sharing makes each environment rebuild the kernel every time the other ran."""
    from posenc.parts.rotary import _extension_dir

    monkeypatch.setattr(torch, "__file__", "/env_a/site-packages/torch/__init__.py")
    a, a_again = _extension_dir(), _extension_dir()
    monkeypatch.setattr(torch, "__file__", "/env_b/site-packages/torch/__init__.py")
    assert a == a_again and _extension_dir() != a
    assert os.path.basename(a).startswith("posenc_rope_v1-py")


# ---------------------------------------------------------------------------------------------- kernel
@needs_kernel
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rot", [64, 32])
@pytest.mark.parametrize("batch_cos", [False, True])
def test_kernel_bit_identical_to_torch_path(layout, rot, batch_cos):
    g = torch.Generator().manual_seed(0)
    B, H, N, D = 2, 3, 50, 64
    x = torch.randn(B, H, N, D, generator=g) * 10
    pos = torch.randint(0, 100000, (B if batch_cos else 1, N), generator=g)
    cos, sin = rope_cos_sin(pos, _inv(rot))
    got = _rotate_kernel(x.contiguous(), cos, sin, layout, rot, torch.empty_like(x))
    want = _rotate_torch(x, cos, sin, layout, rot)
    assert torch.equal(got, want), (got - want).abs().max()


@needs_kernel
def test_public_api_uses_kernel_and_matches_pure_path():
    x = torch.randn(1, 8, 512, 64)
    assert x.numel() >= _KERNEL_MIN_NUMEL
    pos = torch.arange(3, 515)
    cos, sin = rope_cos_sin(pos, _inv(64))
    want = _rotate_torch(x, cos, sin, "half", 64)
    assert torch.equal(apply_rope(x, pos, _inv(64)), want)
    assert torch.equal(apply_rope_cos_sin(x, cos, sin), want)
    y = x.clone()
    out = apply_rope_(y, pos, _inv(64))
    assert out.data_ptr() == y.data_ptr() and torch.equal(y, want)


def test_cached_cos_sin_equals_direct():
    pos = torch.tensor([[0, 5, 4095, 17], [1, 2, 3, 100]])
    c1, s1 = _cached_cos_sin(pos, _inv(64))
    c2, s2 = rope_cos_sin(pos, _inv(64))
    assert torch.equal(c1, c2) and torch.equal(s1, s2)


def test_inplace_fallbacks_noncontiguous_and_bf16():
    x = torch.randn(1, 64, 4, 32).transpose(1, 2)  # [1,4,64,32] non-contiguous
    want = apply_rope(x.clone(), torch.arange(64), _inv(32))
    y = x.clone()  # clone keeps the strides -> pure path + copy_
    assert torch.equal(apply_rope_(y, torch.arange(64), _inv(32)), want)
    xb = torch.randn(1, 2, 16, 32).bfloat16()
    assert torch.equal(apply_rope_(xb.clone(), torch.arange(16), _inv(32)), apply_rope(xb, torch.arange(16), _inv(32)))


def test_apply_rope_keeps_autograd():
    x = torch.randn(1, 8, 512, 64, requires_grad=True)  # big enough for the kernel, but grad -> torch path
    y = apply_rope(x, torch.arange(512), _inv(64))
    y.sum().backward()
    assert x.grad is not None and math.isfinite(float(x.grad.sum()))

hf_llama = pytest.importorskip("transformers.models.llama.modeling_llama")

hf_neox = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")

ret = pytest.importorskip("rotary_embedding_torch")


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """HF / RoFormer default: base^(-2i/d), float32 [rotary_dim // 2]."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def hf_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor):
    """cos/sin as HF builds them (emb = cat(freqs, freqs)), but with float64 angles: [B, N, rot]."""
    freqs = positions[..., None].double() * inv_freq.double()  # [B, N, rot/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, N, rot]
    return emb.cos().float(), emb.sin().float()


def reference_rope64(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, layout: str):
    """Independent float64 reference: each pair is a complex number multiplied by exp(i p w)."""
    x = x.double()
    d = x.shape[-1]
    if layout == "half":
        z = torch.complex(x[..., : d // 2], x[..., d // 2:])
    else:
        z = torch.complex(x[..., 0::2], x[..., 1::2])
    pos = positions if positions.dim() == 2 else positions.unsqueeze(0)  # [B, N]
    ang = pos.double()[:, None, :, None] * inv_freq.double()  # [B, 1, N, d/2]
    z = z * torch.polar(torch.ones_like(ang), ang)
    if layout == "half":
        return torch.cat((z.real, z.imag), dim=-1)
    return torch.stack((z.real, z.imag), dim=-1).flatten(-2)


# ------------------------------------------------------------------------------------------------------
# tier 1: equality with reference implementations


@pytest.mark.parametrize("shape,base",
                         [((2, 3, 7, 8), 10000.0), ((3, 2, 5, 64), 500000.0), ((1, 1, 4, 2), 10.0)])
def test_half_layout_equals_hf_llama(shape, base):
    torch.manual_seed(0)
    B, H, N, D = shape
    q, k = torch.randn(shape), torch.randn(shape)
    pos = torch.stack([torch.randperm(4000)[:N] for _ in range(B)])  # different positions per batch row
    inv_freq = default_inv_freq(D, base)
    cos, sin = hf_cos_sin(pos, inv_freq)
    q_ref, k_ref = hf_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert_close(apply_rope(q, pos, inv_freq, "half"), q_ref, rtol=1e-6, atol=1e-6, name="q")
    assert_close(apply_rope(k, pos, inv_freq, "half"), k_ref, rtol=1e-6, atol=1e-6, name="k")


def test_half_layout_equals_hf_llama_rotary_module():
    """End to end with HF's own LlamaRotaryEmbedding (float32 angles, so small positions)."""
    torch.manual_seed(1)
    B, H, N, D = 2, 4, 9, 16
    cfg = hf_llama.LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H,
                               rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    rope = hf_llama.LlamaRotaryEmbedding(cfg)
    q, k = torch.randn(B, H, N, D), torch.randn(B, H, N, D)
    pos = torch.tensor([list(range(N)), list(range(5, 5 + N))])
    cos, sin = rope(q, pos)
    q_ref, k_ref = hf_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert_close(apply_rope(q, pos, rope.inv_freq), q_ref, rtol=1e-5, atol=1e-5, name="q")
    assert_close(apply_rope(k, pos, rope.inv_freq), k_ref, rtol=1e-5, atol=1e-5, name="k")


@pytest.mark.parametrize("D,rot", [(16, 4), (32, 8), (64, 16), (8, 8)])
def test_partial_rotary_equals_hf_gpt_neox(D, rot):
    torch.manual_seed(2)
    B, H, N = 2, 3, 6
    q, k = torch.randn(B, H, N, D), torch.randn(B, H, N, D)
    pos = torch.stack([torch.arange(N) + 100, torch.arange(N) * 7])
    inv_freq = default_inv_freq(rot)
    cos, sin = hf_cos_sin(pos, inv_freq)
    q_ref, k_ref = hf_neox.apply_rotary_pos_emb(q, k, cos, sin)
    out_q = apply_rope(q, pos, inv_freq, "half", rotary_dim=rot)
    assert_close(out_q, q_ref, rtol=1e-6, atol=1e-6, name="q")
    assert_close(apply_rope(k, pos, inv_freq, "half", rotary_dim=rot), k_ref, rtol=1e-6, atol=1e-6, name="k")
    assert torch.equal(out_q[..., rot:], q[..., rot:])  # pass-through features untouched


@pytest.mark.parametrize("D,rot,offset", [(8, 8, 0), (32, 32, 3), (64, 64, 0), (16, 8, 0), (24, 12, 5)])
def test_interleaved_equals_rotary_embedding_torch(D, rot, offset):
    torch.manual_seed(3)
    B, H, N = 2, 3, 11
    x = torch.randn(B, H, N, D)
    rope = ret.RotaryEmbedding(dim=rot, theta=5000, cache_if_possible=False)
    expected = rope.rotate_queries_or_keys(x, offset=offset)  # positions offset .. offset+N-1
    got = apply_rope(x, torch.arange(N) + offset, rope.freqs.detach(), "interleaved", rotary_dim=rot)
    assert_close(got, expected, rtol=1e-5, atol=1e-5, name="interleaved")


@pytest.mark.parametrize("N,D,scale_base", [(8, 16, 512), (7, 32, 64), (13, 8, 16)])
def test_xpos_equals_rotary_embedding_torch(N, D, scale_base):
    """rotary-embedding-torch: positions 0..N-1, power = (t - N // 2) / scale_base, interleaved layout."""
    torch.manual_seed(4)
    B, H = 2, 3
    q, k = torch.randn(B, H, N, D), torch.randn(B, H, N, D)
    rope = ret.RotaryEmbedding(dim=D, use_xpos=True, xpos_scale_base=scale_base, cache_if_possible=False)
    q_ref, k_ref = rope.rotate_queries_and_keys(q, k)
    pos = torch.arange(N)
    scale = xpos_scale(pos, D, scale_base=scale_base, gamma=0.4, layout="interleaved", center=N // 2)
    assert scale.shape == (1, 1, N, D)
    inv_freq = rope.freqs.detach()
    assert_close(apply_rope(q, pos, inv_freq, "interleaved") * scale, q_ref, rtol=1e-5, atol=1e-5, name="q")
    assert_close(apply_rope(k, pos, inv_freq, "interleaved") / scale, k_ref, rtol=1e-5, atol=1e-5, name="k")


def test_xpos_zeta_and_layouts_by_hand():
    D, pos = 6, torch.tensor([[0, 3, 10]])
    zeta = [(2 * i / D + 0.4) / 1.4 for i in range(D // 2)]
    half = xpos_scale(pos, D, scale_base=4, layout="half", center=1)
    inter = xpos_scale(pos, D, scale_base=4, layout="interleaved", center=1)
    for n, p in enumerate(pos[0].tolist()):
        z = [zi ** ((p - 1) / 4) for zi in zeta]
        assert_close(half[0, 0, n], torch.tensor(z + z), rtol=1e-6, atol=0, name="half")
        assert_close(inter[0, 0, n], torch.tensor([v for v in z for _ in range(2)]), rtol=1e-6, atol=0,
                     name="interleaved")
    # per-row centres
    rows = xpos_scale(torch.tensor([[4, 5], [4, 5]]), D, scale_base=4, center=torch.tensor([4, 5]))
    assert_close(rows[0, 0, 0], torch.ones(D), name="row 0 centred")
    assert_close(rows[1, 0, 1], torch.ones(D), name="row 1 centred")


# ------------------------------------------------------------------------------------------------------
# tier 2: properties


@settings(max_examples=15, deadline=None)
@given(half_d=st.integers(1, 16), layout=st.sampled_from(["half", "interleaved"]),
       start=st.integers(0, 10**7), seed=st.integers(0, 1000))
def test_rotation_preserves_norm(half_d, layout, start, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, 5, 2 * half_d, generator=g, dtype=torch.float64)
    out = apply_rope(x, torch.arange(5) + start, default_inv_freq(2 * half_d), layout)
    assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-6, atol=1e-9, name="norms")


@settings(max_examples=15, deadline=None)
@given(m=st.integers(0, 2000), n=st.integers(0, 2000), layout=st.sampled_from(["half", "interleaved"]),
       seed=st.integers(0, 1000))
def test_qk_depends_only_on_relative_position(m, n, layout, seed):
    g = torch.Generator().manual_seed(seed)
    D = 32
    q, k = torch.randn(1, 2, 1, D, generator=g), torch.randn(1, 2, 1, D, generator=g)
    inv_freq = default_inv_freq(D)

    def dot(pm, pn):
        qr = apply_rope(q, torch.tensor([pm]), inv_freq, layout)
        kr = apply_rope(k, torch.tensor([pn]), inv_freq, layout)
        return (qr * kr).sum(-1)

    base = dot(m, n)
    bound = float(q.norm() * k.norm())
    for shift in (7, 10**5):
        assert_close(dot(m + shift, n + shift), base, rtol=0, atol=2e-6 * bound, name=f"shift {shift}")


def test_xpos_qk_depends_only_on_relative_position():
    torch.manual_seed(5)
    D, sb = 16, 64
    q, k = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)
    inv_freq = default_inv_freq(D)

    def dot(pm, pn, center):
        pm, pn = torch.tensor([pm]), torch.tensor([pn])
        qs = apply_rope(q, pm, inv_freq) * xpos_scale(pm, D, sb, center=center)
        ks = apply_rope(k, pn, inv_freq) / xpos_scale(pn, D, sb, center=center)
        return (qs * ks).sum()

    ref = dot(20, 5, 0)
    assert_close(dot(120, 105, 100), ref, rtol=1e-5, atol=1e-6, name="shifted with centre")
    assert_close(dot(20, 5, 11), ref, rtol=1e-5, atol=1e-6, name="centre cancels")
    assert float(dot(20, 5, 0).abs()) != pytest.approx(float(dot(5, 20, 0).abs()), rel=1e-3)  # decays one way


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_bf16_at_position_1e6_only_output_rounding(layout):
    """bf16 x at positions ~1e6: the error is bf16 rounding of the output (<= 1 ulp), not angle error."""
    torch.manual_seed(6)
    D, N = 64, 16
    x = torch.randn(2, 4, N, D).to(torch.bfloat16)
    pos = torch.stack([torch.arange(N) + 10**6, torch.arange(N) + 10**6 - 12345])
    inv_freq = default_inv_freq(D)
    got = apply_rope(x, pos, inv_freq, layout)
    assert got.dtype == torch.bfloat16
    exact = reference_rope64(x, pos, inv_freq, layout)  # float64 rotation of the bf16 values
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)  # bf16 ulp at |exact|
    err_ulps = (got.double() - exact).abs() / ulp
    assert float(err_ulps.max()) <= 1.0, f"max error {float(err_ulps.max()):.2f} bf16 ulps"
    # the rounded float64 result is matched to within one ulp (mostly exactly)
    assert float(((got.double() - exact.to(torch.bfloat16).double()).abs() / ulp).max()) <= 1.0
    # sanity: the test is sensitive: angles formed in bf16 would be wildly off
    naive = (pos[:, None, :, None].to(torch.bfloat16) * inv_freq.to(torch.bfloat16))
    naive_cos = naive.float().cos()
    true_cos = (pos[:, None, :, None].double() * inv_freq.double()).cos()
    assert float((naive_cos.double() - true_cos).abs().max()) > 0.1


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_float32_at_position_2_pow_24(layout):
    torch.manual_seed(7)
    D = 128
    x = torch.randn(1, 2, 3, D)
    pos = torch.tensor([2**24 - 3, 2**24 - 2, 2**24 - 1])
    inv_freq = default_inv_freq(D)
    assert_close(apply_rope(x, pos, inv_freq, layout), reference_rope64(x, pos, inv_freq, layout),
                 rtol=0, atol=1e-5, name="fp32 at 2^24-1")


def test_apply_rope_is_cos_sin_composition_and_cache_is_exact():
    torch.manual_seed(8)
    x = torch.randn(2, 2, 6, 16)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [40, 41, 42, 43, 44, 45]])
    inv_freq = default_inv_freq(12, base=100.0)
    cos, sin = rope_cos_sin(pos, inv_freq)
    assert cos.shape == (2, 1, 6, 6) and cos.dtype == torch.float32
    for layout in ("half", "interleaved"):
        assert torch.equal(apply_rope(x, pos, inv_freq, layout, rotary_dim=12),
                           apply_rope_cos_sin(x, cos, sin, layout, rotary_dim=12))
    cache = RopeAngleCache(inv_freq, max_position=8)
    c2, s2 = cache.cos_sin(pos)  # grows past 8 to cover position 45
    assert cache.capacity >= 46
    assert torch.equal(c2, cos) and torch.equal(s2, sin)
    c3, _ = cache.cos_sin(torch.arange(3))  # [N] positions -> batch 1
    assert torch.equal(c3, cos[:1, :, :3])


def test_rope_cos_sin_scale_and_freq_scale():
    pos, inv_freq = torch.arange(10), default_inv_freq(8)
    cos, sin = rope_cos_sin(pos, inv_freq, scale=1.3, freq_scale=0.25)
    ang = pos.double()[:, None] * inv_freq.double() * 0.25
    assert_close(cos[0, 0], 1.3 * ang.cos(), rtol=1e-6, atol=1e-7, name="cos")
    assert_close(sin[0, 0], 1.3 * ang.sin(), rtol=1e-6, atol=1e-7, name="sin")
    c64, _ = rope_cos_sin(pos, inv_freq, dtype=torch.float64)
    assert c64.dtype == torch.float64


# ------------------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("kwargs,param", [
    ({"rotary_dim": 7}, "rotary_dim"),
    ({"rotary_dim": 16}, "rotary_dim"),
    ({"rotary_dim": 6}, "inv_freq"),
    ({"layout": "sideways"}, "layout"),
    ({"positions": torch.tensor([0, -1, 2, 3])}, "positions"),
    ({"positions": torch.tensor([0.0, 1.0, 2.0, 3.0])}, "positions"),
    ({"positions": torch.zeros(3, 4, dtype=torch.long)}, "positions"),
    ({"inv_freq": torch.ones(4, 1)}, "inv_freq"),
])
def test_apply_rope_validation(kwargs, param):
    args = {"x": torch.randn(2, 1, 4, 8), "positions": torch.arange(4), "inv_freq": default_inv_freq(8)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=param):
        apply_rope(**args)


def test_other_validation():
    with pytest.raises(ValueError, match="inv_freq"):
        apply_rope(torch.randn(1, 1, 4, 8), torch.arange(4), default_inv_freq(6))  # 3 != 8 // 2
    with pytest.raises(ValueError, match="x must be"):
        apply_rope(torch.randn(4, 8), torch.arange(4), default_inv_freq(8))
    cos, sin = rope_cos_sin(torch.arange(5), default_inv_freq(8))
    with pytest.raises(ValueError, match="seq"):
        apply_rope_cos_sin(torch.randn(1, 1, 4, 8), cos, sin)
    cos, sin = rope_cos_sin(torch.zeros(3, 4, dtype=torch.long), default_inv_freq(8))
    with pytest.raises(ValueError, match="broadcast"):
        apply_rope_cos_sin(torch.randn(2, 1, 4, 8), cos, sin)
    with pytest.raises(ValueError, match="head_dim"):
        xpos_scale(torch.arange(4), 7)
    with pytest.raises(ValueError, match="scale_base"):
        xpos_scale(torch.arange(4), 8, scale_base=0)
    with pytest.raises(ValueError, match="layout"):
        xpos_scale(torch.arange(4), 8, layout="x")
    with pytest.raises(ValueError, match="center"):
        xpos_scale(torch.arange(4), 8, center=1.5)
    with pytest.raises(ValueError, match="freq_scale"):
        rope_cos_sin(torch.arange(4), default_inv_freq(8), freq_scale=math.nan)


# ------------------------------------------------------------------------------------------------ apply_rope
_INV = rope_frequencies(8).inv_freq


@pytest.mark.parametrize("fn", [apply_rope, apply_rope_])
@pytest.mark.parametrize("x, positions, match", [
    (torch.ones(1, 1, 4, 8, dtype=torch.long), torch.arange(4), r"x must be a floating-point tensor.*int64"),
    (torch.ones(1, 1, 4, 8, dtype=torch.int32), torch.arange(4), r"x must be a floating-point tensor"),
    (torch.ones(1, 1, 4, 8), torch.ones(4, dtype=torch.bool), r"positions must be integers, got a bool"),
    (torch.ones(1, 1, 4, 8), torch.arange(4.0), r"positions must be integers"),
    (torch.ones(1, 1, 4, 8), torch.tensor([0, 1, -2, 3]), r"positions must be >= 0"),
    (torch.ones(4, 8), torch.arange(4), r"x must be a tensor \[batch, heads, seq, head_dim\]"),
])
def test_apply_rope_refuses_bad_inputs(fn, x, positions, match):
    before = x.clone()
    with pytest.raises(ValueError, match=match):
        fn(x, positions, _INV)
    assert torch.equal(x, before)  # nothing changed, even for the in-place version
