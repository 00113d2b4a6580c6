"""Tests for posenc.parts.frequencies: equality with Hugging Face's ROPE_INIT_FUNCTIONS (whole tensors), properties
between schedules, hand-computed cases (plain ``math``, independent of the implementation), validation."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from posenc._util import assert_close
from posenc.parts.frequencies import ROPE_SCALINGS, RopeFrequencies, is_dynamic, rope_frequencies, scaling_factor

transformers = pytest.importorskip("transformers")
from transformers import GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402

transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch

# HF computes base ** (2i/d) in float32 (one rounding of pow, a few in YaRN's ramp blend / Llama-3's
# smoothing); we compute in float64 and round once. Measured worst gap over this grid: 2.3e-7 relative
# (about 2 float32 ulps), so 1e-6 (~8 ulps) is tight but not flaky. No absolute slack.
RTOL, ATOL = 1e-6, 0.0

HEAD_DIMS = (32, 64, 128)
BASES = (10000.0, 500000.0)
FACTORS = (2.0, 4.0, 8.5)
PARTIALS = (1.0, 0.5)
TRAINED = 1024
GRID = list(itertools.product(HEAD_DIMS, BASES, FACTORS, PARTIALS))


def _hf(rope_type: str, head_dim: int, params: dict, seq_len=None, max_pos: int = TRAINED):
    """HF 5.x: the functions take a config whose ``rope_parameters`` holds rope_type, rope_theta,
    partial_rotary_factor and the method's keys; head_dim comes from ``config.head_dim``."""
    if rope_type == "default":  # not in ROPE_INIT_FUNCTIONS in 5.x; GPT-NeoX's honours partial_rotary_factor
        cfg = GPTNeoXConfig(hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=max_pos,
                            rope_parameters=copy.deepcopy(params))
        inv, scale = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                          max_position_embeddings=max_pos, rope_parameters=copy.deepcopy(params))
        inv, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
    return inv, float(scale)


def _check_equal_hf(rope_type, head_dim, base, prf, extra, seq_len=None, max_pos=TRAINED, ours_extra=None):
    params = {"rope_type": rope_type, "rope_theta": base, "partial_rotary_factor": prf, **extra}
    hf_inv, hf_scale = _hf(rope_type, head_dim, params, seq_len=seq_len, max_pos=max_pos)
    ours = rope_frequencies(head_dim, scaling={**params, **(ours_extra or {})}, seq_len=seq_len)
    name = f"{rope_type} d={head_dim} base={base} prf={prf} {extra} seq_len={seq_len}"
    assert ours.inv_freq.dtype == torch.float32
    assert_close(ours.inv_freq, hf_inv, rtol=RTOL, atol=ATOL, name=name)
    assert ours.attention_scale == pytest.approx(hf_scale, rel=1e-12), name


# ----------------------------------------------------------------------------------------------------------
# tier 1: equality with Hugging Face

HF_TESTED = {"default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"}


def test_every_hf_rope_type_is_implemented_and_tested():
    hf_types = set(ROPE_INIT_FUNCTIONS) | {"default"}
    assert hf_types <= set(ROPE_SCALINGS), hf_types - set(ROPE_SCALINGS)
    assert hf_types <= HF_TESTED, f"new HF rope types without an equality test: {hf_types - HF_TESTED}"


@pytest.mark.parametrize("head_dim,base,prf", list(itertools.product(HEAD_DIMS, BASES, PARTIALS)))
def test_default_equals_hf(head_dim, base, prf):
    _check_equal_hf("default", head_dim, base, prf, {})
    # and the plain-argument form (no scaling dict) gives the same tensor
    ours = rope_frequencies(head_dim, base, partial_rotary_factor=prf)
    assert_close(ours.inv_freq, _hf("default", head_dim, {"rope_type": "default", "rope_theta": base,
                                                          "partial_rotary_factor": prf})[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
def test_linear_equals_hf(head_dim, base, factor, prf):
    _check_equal_hf("linear", head_dim, base, prf, {"factor": factor})


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
@pytest.mark.parametrize("seq_len", [1, TRAINED // 2, TRAINED, TRAINED + 1, 3 * TRAINED, 17 * TRAINED + 5])
def test_dynamic_equals_hf(head_dim, base, factor, prf, seq_len):
    # HF reads the trained length from config.max_position_embeddings; we read it from the dict
    _check_equal_hf("dynamic", head_dim, base, prf, {"factor": factor}, seq_len=seq_len,
                    ours_extra={"original_max_position_embeddings": TRAINED})


YARN_VARIANTS = [
    {},
    {"beta_fast": 16.0, "beta_slow": 2.0},
    {"attention_factor": 0.7},
    {"mscale": 1.0, "mscale_all_dim": 0.8},  # DeepSeek-style ratio
    {"mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek-V3's config: ratio 1
    {"mscale": 1.0},  # mscale alone is ignored (HF needs both)
    {"truncate": False},  # gpt-oss
    {"truncate": False, "beta_fast": 64.0, "beta_slow": 0.5},
]


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
@pytest.mark.parametrize("variant", YARN_VARIANTS, ids=lambda v: ",".join(v) or "plain")
def test_yarn_equals_hf(head_dim, base, factor, prf, variant):
    extra = {"factor": factor, "original_max_position_embeddings": TRAINED, **variant}
    _check_equal_hf("yarn", head_dim, base, prf, extra, max_pos=int(TRAINED * factor))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_yarn_factor_inferred_like_hf(head_dim):
    # no 'factor': HF uses max_position_embeddings / original_max_position_embeddings
    extra = {"original_max_position_embeddings": TRAINED}
    _check_equal_hf("yarn", head_dim, 10000.0, 1.0, {**extra, "factor": None}, max_pos=6 * TRAINED,
                    ours_extra={"max_position_embeddings": 6 * TRAINED})


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
@pytest.mark.parametrize("low,high", [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_equals_hf(head_dim, base, factor, prf, low, high):
    extra = {"factor": factor, "low_freq_factor": low, "high_freq_factor": high,
             "original_max_position_embeddings": TRAINED}
    _check_equal_hf("llama3", head_dim, base, prf, extra, max_pos=int(TRAINED * factor))


def _longrope_lists(n: int, seed: int) -> tuple[list[float], list[float]]:
    g = torch.Generator().manual_seed(seed)
    short = (1.0 + 0.2 * torch.rand(n, generator=g, dtype=torch.float64)).tolist()
    long = (1.0 + 20.0 * torch.rand(n, generator=g, dtype=torch.float64).cumsum(0) / n).tolist()
    return short, long


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
@pytest.mark.parametrize("seq_len", [TRAINED // 2, TRAINED, TRAINED + 1, 8 * TRAINED])
def test_longrope_equals_hf(head_dim, base, factor, prf, seq_len):
    short, long = _longrope_lists(int(head_dim * prf) // 2, seed=head_dim)
    extra = {"factor": factor, "short_factor": short, "long_factor": long,
             "original_max_position_embeddings": TRAINED}
    _check_equal_hf("longrope", head_dim, base, prf, extra, seq_len=seq_len, max_pos=int(TRAINED * factor))


@pytest.mark.parametrize("variant", [{"attention_factor": 1.3}, {"factor": None}])
def test_longrope_attention_variants_equal_hf(variant):
    short, long = _longrope_lists(32, seed=0)
    extra = {"short_factor": short, "long_factor": long, "original_max_position_embeddings": 4096, **variant}
    # Phi-3 style: no factor, HF infers it from max_position_embeddings / original (here 32)
    _check_equal_hf("longrope", 64, 10000.0, 1.0, extra, seq_len=5000, max_pos=131072,
                    ours_extra={"max_position_embeddings": 131072})


@pytest.mark.parametrize("head_dim,base", list(itertools.product((64, 128, 256), BASES)))
@pytest.mark.parametrize("prf", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("factor", [1.0, 8.5])
def test_proportional_equals_hf(head_dim, base, prf, factor):
    ours = rope_frequencies(head_dim, base, {"rope_type": "proportional", "factor": factor,
                                             "partial_rotary_factor": prf})
    assert ours.rotary_dim == head_dim  # whole head rotated; the tail has zero frequency
    _check_equal_hf("proportional", head_dim, base, prf, {"factor": factor})


def test_real_config_blocks_equal_hf():
    """rope_scaling blocks as they appear in config.json files (legacy 'type' key included)."""
    llama31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    hf_inv, _ = _hf("llama3", 128, {**llama31, "rope_theta": 500000.0}, max_pos=131072)
    assert_close(rope_frequencies(128, 500000.0, llama31).inv_freq, hf_inv, rtol=RTOL, atol=ATOL)

    qwen25 = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
    hf_inv, hf_scale = _hf("yarn", 128, {**qwen25, "rope_theta": 1000000.0}, max_pos=131072)
    ours = rope_frequencies(128, 1000000.0, qwen25)
    assert_close(ours.inv_freq, hf_inv, rtol=RTOL, atol=ATOL)
    assert ours.attention_scale == pytest.approx(hf_scale, rel=1e-12)

    deepseek = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096, "type": "yarn"}
    hf_inv, hf_scale = _hf("yarn", 64, {**deepseek, "rope_theta": 10000.0}, max_pos=163840)
    ours = rope_frequencies(64, 10000.0, deepseek)
    assert_close(ours.inv_freq, hf_inv, rtol=RTOL, atol=ATOL)
    assert ours.attention_scale == pytest.approx(hf_scale, rel=1e-12) == 1.0


# ----------------------------------------------------------------------------------------------------------
# tier 2: properties


def _example(rope_type: str, head_dim: int) -> dict:
    """One valid scaling dict per rope_type."""
    half = head_dim // 2
    short, long = _longrope_lists(half, seed=1)
    return {
        "default": {}, "linear": {"factor": 4.0}, "ntk": {"factor": 4.0}, "ntk_mixed": {"factor": 8.0},
        "dynamic": {"factor": 4.0}, "dynamic_qwen": {}, "dynamic_yarn": {},
        "yarn": {"factor": 8.0}, "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        "longrope": {"factor": 4.0, "short_factor": short, "long_factor": long},
        "proportional": {"factor": 2.0, "partial_rotary_factor": 0.5}, "base": {"base": 500.0},
    }[rope_type] | {"rope_type": rope_type, "original_max_position_embeddings": TRAINED}


@pytest.mark.parametrize("rope_type", sorted(ROPE_SCALINGS))
@pytest.mark.parametrize("seq_len", [1, TRAINED, 64 * TRAINED + 3])
def test_every_schedule_is_positive_finite_float32(rope_type, seq_len):
    for head_dim in (8, 64, 128):
        out = rope_frequencies(head_dim, 10000.0, _example(rope_type, head_dim), seq_len=seq_len)
        assert isinstance(out, RopeFrequencies)
        assert out.inv_freq.dtype == torch.float32 and out.inv_freq.dim() == 1
        assert bool(torch.isfinite(out.inv_freq).all())
        assert math.isfinite(out.attention_scale) and out.attention_scale > 0
        rotated = out.inv_freq[: head_dim // 4] if rope_type == "proportional" else out.inv_freq
        assert bool((rotated > 0).all()), rope_type
        if rope_type != "proportional":
            assert out.inv_freq.numel() == head_dim // 2 == out.rotary_dim // 2


def test_proportional_tail_is_zero():
    out = rope_frequencies(256, 1e6, {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert out.inv_freq.shape == (128,)
    assert bool((out.inv_freq[32:] == 0).all())
    # the rotated quarter keeps the full head's ladder: theta_i = base^(-2i/256), i < 32 (not 2i/64)
    ladder = torch.tensor([1e6 ** (-2 * i / 256) for i in range(32)], dtype=torch.float64)
    assert_close(out.inv_freq[:32], ladder, rtol=1e-6, atol=0, name="rotated ladder")
    assert out.attention_scale == 1.0


@example(half=2, trained=443, frac=1.0, factor=37.068914539030985, base=100.0)  # t = L rounded to 1 + 7e-15
@settings(max_examples=60, deadline=None)
@given(half=st.integers(2, 96), trained=st.integers(1, 70000), frac=st.floats(0.0, 1.0),
       factor=st.floats(1.0, 64.0), base=st.sampled_from([100.0, 10000.0, 500000.0, 1e7]))
def test_dynamic_schedules_equal_default_inside_trained_length(half, trained, frac, factor, base):
    head_dim = 2 * half
    seq_len = max(1, int(round(frac * trained)))
    default = rope_frequencies(head_dim, base)
    for rope_type in ("dynamic", "dynamic_qwen", "dynamic_yarn"):
        scaling = {"rope_type": rope_type, "factor": factor, "original_max_position_embeddings": trained}
        if rope_type != "dynamic":
            del scaling["factor"]
        out = rope_frequencies(head_dim, base, scaling, seq_len=seq_len)
        assert torch.equal(out.inv_freq, default.inv_freq), rope_type
        assert out.attention_scale == 1.0
        assert scaling_factor(scaling, seq_len) == 1.0


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
def test_linear_is_default_over_factor(head_dim, base, factor, prf):
    default = rope_frequencies(head_dim, base, partial_rotary_factor=prf).inv_freq.double()
    linear = rope_frequencies(head_dim, base, {"type": "linear", "factor": factor}, partial_rotary_factor=prf)
    assert_close(linear.inv_freq, default / factor, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("head_dim,base,factor", list(itertools.product(HEAD_DIMS, BASES, FACTORS)))
def test_ntk_mixed_ends(head_dim, base, factor):
    """Lowest frequency divided by exactly factor; highest multiplied by exp(-a), a = ln(factor)/(d/2)^0.75."""
    default = rope_frequencies(head_dim, base).inv_freq.double()
    out = rope_frequencies(head_dim, base, {"rope_type": "ntk_mixed", "factor": factor}).inv_freq
    a = math.log(factor) / (head_dim / 2) ** 0.75
    assert_close(out[-1], default[-1] / factor, rtol=RTOL, atol=ATOL)
    assert_close(out[0], default[0] * math.exp(-a), rtol=RTOL, atol=ATOL)
    ratio = out.double() / default
    assert bool((ratio[1:] < ratio[:-1]).all())  # monotone: higher index, more interpolation


@pytest.mark.parametrize("head_dim,base,factor", list(itertools.product(HEAD_DIMS, BASES, FACTORS)))
def test_ntk_lowest_frequency_divided_by_factor_and_alpha_alias(head_dim, base, factor):
    default = rope_frequencies(head_dim, base).inv_freq.double()
    by_factor = rope_frequencies(head_dim, base, {"rope_type": "ntk", "factor": factor})
    by_alpha = rope_frequencies(head_dim, base, {"rope_type": "ntk", "alpha": factor})
    assert torch.equal(by_factor.inv_freq, by_alpha.inv_freq)
    assert_close(by_factor.inv_freq[-1], default[-1] / factor, rtol=RTOL, atol=ATOL)
    assert by_factor.inv_freq[0] == 1.0  # highest frequency untouched
    # dynamic NTK at seq_len = factor * L equals fixed NTK with that factor (HF's formula gives factor^2 - ...)
    hf_scale = factor * factor - (factor - 1)
    dyn = rope_frequencies(head_dim, base, {"rope_type": "dynamic", "factor": factor,
                                            "original_max_position_embeddings": 1000},
                           seq_len=int(factor * 1000))
    assert_close(dyn.inv_freq, rope_frequencies(head_dim, base, {"rope_type": "ntk", "factor": hf_scale}).inv_freq,
                 rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("new_base", [500.0, 10000.0, 1e6])
def test_base_change_and_rope_theta_override(new_base):
    expected = rope_frequencies(64, new_base)
    for scaling in ({"rope_type": "base", "base": new_base}, {"rope_type": "base", "rope_theta": new_base},
                    {"rope_type": "default", "rope_theta": new_base}):
        out = rope_frequencies(64, 10000.0, scaling)  # the dict's base wins over the argument
        assert torch.equal(out.inv_freq, expected.inv_freq), scaling


def test_partial_rotary_factor_in_dict_overrides_argument():
    a = rope_frequencies(64, scaling={"rope_type": "default", "partial_rotary_factor": 0.5})
    b = rope_frequencies(64, partial_rotary_factor=0.5)
    assert torch.equal(a.inv_freq, b.inv_freq) and a.rotary_dim == 32


def test_is_dynamic_and_scaling_factor():
    dynamic = {name for name in ROPE_SCALINGS if is_dynamic(_example(name, 64))}
    assert dynamic == {"dynamic", "dynamic_qwen", "dynamic_yarn", "longrope"}
    assert not is_dynamic(None) and not is_dynamic({"type": "linear", "factor": 2.0})
    assert scaling_factor(None) == 1.0
    assert scaling_factor({"rope_type": "linear", "factor": 3.0}) == 3.0
    assert scaling_factor({"rope_type": "ntk", "alpha": 5.0}) == 5.0
    assert scaling_factor({"rope_type": "base", "base": 1e6}) == 1.0
    assert scaling_factor({"rope_type": "yarn", "original_max_position_embeddings": 4096,
                           "max_position_embeddings": 32768}) == 8.0
    assert scaling_factor({"rope_type": "dynamic_qwen", "original_max_position_embeddings": 100}, 201) == 7.0
    assert scaling_factor({"rope_type": "dynamic_yarn", "original_max_position_embeddings": 100}, 250) == 2.5
    assert scaling_factor({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 100},
                          300) == pytest.approx(5.0)


# ----------------------------------------------------------------------------------------------------------
# hand-computed cases (plain math, written independently of the implementation)


def _default_py(d: int, base: float) -> list[float]:
    return [base ** (-2 * i / d) for i in range(d // 2)]


def test_ntk_mixed_hand_computed():
    d, base, k, b = 8, 10000.0, 4.0, 0.75
    a = math.log(k) / (d / 2) ** b
    expected = [base ** (-2 * i / d) * math.exp(-a * (i + 1) ** b) for i in range(d // 2)]
    # i = 0: 1 * exp(-ln4 / 4^0.75) = exp(-0.490129...) ; i = 3: 10000^-0.75 / 4
    assert expected[3] == pytest.approx(10000 ** -0.75 / 4, rel=1e-14)
    out = rope_frequencies(d, base, {"rope_type": "ntk_mixed", "factor": k})
    assert_close(out.inv_freq, torch.tensor(expected, dtype=torch.float64), rtol=RTOL, atol=ATOL)
    out_b = rope_frequencies(d, base, {"rope_type": "ntk_mixed", "factor": k, "b": 0.5})
    a5 = math.log(k) / 2.0
    expected_b = [base ** (-2 * i / d) * math.exp(-a5 * math.sqrt(i + 1)) for i in range(d // 2)]
    assert_close(out_b.inv_freq, torch.tensor(expected_b, dtype=torch.float64), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("t,alpha", [(1, 1), (1023, 1), (1024, 1), (1025, 3), (2048, 3), (2049, 7),
                                     (3000, 7), (4096, 7), (4097, 15), (8192, 15), (8193, 31)])
def test_dynamic_qwen_hand_computed(t, alpha):
    T, d, base = 1024, 64, 10000.0
    new_base = base * alpha ** (d / (d - 2))
    expected = _default_py(d, new_base)
    out = rope_frequencies(d, base, {"rope_type": "dynamic_qwen", "original_max_position_embeddings": T},
                           seq_len=t)
    assert_close(out.inv_freq, torch.tensor(expected, dtype=torch.float64), rtol=RTOL, atol=ATOL)
    assert out.attention_scale == 1.0
    assert scaling_factor({"rope_type": "dynamic_qwen", "original_max_position_embeddings": T}, t) == alpha


def _yarn_py(d: int, base: float, s: float, L: int, beta_fast: float = 32, beta_slow: float = 1):
    """YaRN by hand: ramp r_i = clip((i - lo) / (hi - lo), 0, 1) over pairs, theta_i' = theta_i (r/s + 1 - r)."""
    def pair(rotations):
        return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = max(math.floor(pair(beta_fast)), 0), min(math.ceil(pair(beta_slow)), d - 1)
    out = []
    for i, theta in enumerate(_default_py(d, base)):
        r = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        out.append(theta * (r / s + (1 - r)))
    return out, 0.1 * math.log(s) + 1.0


@pytest.mark.parametrize("t", [8192, 3000, 2049, 100000])
def test_dynamic_yarn_hand_computed(t):
    d, base, L = 32, 10000.0, 2048
    s = t / L
    expected, mscale = _yarn_py(d, base, s, L)
    out = rope_frequencies(d, base, {"rope_type": "dynamic_yarn", "original_max_position_embeddings": L},
                           seq_len=t)
    assert_close(out.inv_freq, torch.tensor(expected, dtype=torch.float64), rtol=RTOL, atol=ATOL)
    assert out.attention_scale == pytest.approx(mscale, rel=1e-12)
    # equals static yarn with factor = t / L
    static = rope_frequencies(d, base, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L})
    assert torch.equal(out.inv_freq, static.inv_freq) and out.attention_scale == static.attention_scale


def test_dynamic_yarn_hand_computed_bounds():
    # d=32, base=1e4, L=2048: pair(32) = 32 ln(2048/(64 pi)) / (2 ln 1e4) = 4.03 -> 4; pair(1) = 10.05 -> 11
    expected, _ = _yarn_py(32, 10000.0, 4.0, 2048)
    theta = _default_py(32, 10000.0)
    assert expected[:5] == theta[:5]  # pairs 0..4 untouched (fast)
    assert expected[11:] == pytest.approx([x / 4 for x in theta[11:]], rel=1e-15)  # pairs >= 11 / s
    out = rope_frequencies(32, 10000.0, {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 2048},
                           seq_len=8192).inv_freq
    assert_close(out[:5], torch.tensor(theta[:5]), rtol=RTOL, atol=ATOL)
    assert_close(out[11:], torch.tensor(theta[11:]) / 4, rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------------------------------------
# validation: every bad input raises ValueError naming the parameter

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
NAN = float("nan")
INF = float("inf")

BAD = [
    (dict(head_dim=0), "head_dim"),
    (dict(head_dim=-64), "head_dim"),
    (dict(head_dim=63), "rotary_dim"),
    (dict(head_dim=64, partial_rotary_factor=0.3), "rotary_dim"),  # int(19.2) = 19, odd
    (dict(head_dim=64, partial_rotary_factor=0.0), "partial_rotary_factor"),
    (dict(head_dim=64, partial_rotary_factor=1.5), "partial_rotary_factor"),
    (dict(head_dim=64, partial_rotary_factor=NAN), "partial_rotary_factor"),
    (dict(head_dim=64, scaling={"partial_rotary_factor": 2.0}), "partial_rotary_factor"),
    (dict(head_dim=64, base=0.0), "base"),
    (dict(head_dim=64, base=-10000.0), "base"),
    (dict(head_dim=64, base=INF), "base"),
    (dict(head_dim=64, base=NAN), "base"),
    (dict(head_dim=64, scaling={"rope_theta": 0.0}), "rope_theta"),
    (dict(head_dim=64, scaling={"rope_theta": NAN}), "rope_theta"),
    (dict(head_dim=64, scaling={"type": "linear", "factor": 0.5}), "factor"),
    (dict(head_dim=64, scaling={"type": "linear", "factor": INF}), "factor"),
    (dict(head_dim=64, scaling={"type": "linear", "factor": NAN}), "factor"),
    (dict(head_dim=64, scaling={"type": "linear"}), "factor"),
    (dict(head_dim=64, scaling={"rope_type": "ntk", "alpha": 0.5}), "alpha"),
    (dict(head_dim=64, scaling={"rope_type": "ntk", "alpha": 2.0, "factor": 2.0}), "alpha"),
    (dict(head_dim=64, scaling={**YARN, "beta_fast": NAN}), "beta_fast"),
    (dict(head_dim=64, scaling={**YARN, "mscale": INF}), "mscale"),
    (dict(head_dim=64, scaling={**YARN, "attention_factor": 0.0}), "attention_factor"),
    (dict(head_dim=64, scaling={**YARN, "beta_fast": 1.0, "beta_slow": 2.0}), "beta_fast"),
    (dict(head_dim=64, scaling={**YARN, "truncate": "no"}), "truncate"),
    (dict(head_dim=64, scaling={"rope_type": "magic"}), r"rope_type.*'yarn'"),
    (dict(head_dim=64, scaling={"rope_type": "yarn", "type": "linear", "factor": 2.0}), "type"),
    (dict(head_dim=64, scaling={"type": "linear", "facotr": 2.0}), "facotr"),
    (dict(head_dim=64, scaling={"type": "linear", "factor": 2.0, "beta_fast": 32}), "beta_fast"),
    (dict(head_dim=64, scaling={"full_attention": {"rope_type": "default"}}), "nested"),
    (dict(head_dim=64, scaling=[("rope_type", "linear")]), "scaling"),
    (dict(head_dim=64, scaling={"rope_type": "yarn", "factor": 4.0}), "original_max_position_embeddings"),
    (dict(head_dim=64, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0}), "original_max_position_embeddings"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic", "factor": 2.0}, seq_len=10),
     "original_max_position_embeddings"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic_qwen"}, seq_len=10), "original_max_position_embeddings"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic_yarn"}, seq_len=10), "original_max_position_embeddings"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic_qwen", "original_max_position_embeddings": 0},
          seq_len=10), "original_max_position_embeddings"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic_qwen", "original_max_position_embeddings": 1024.5},
          seq_len=10), "original_max_position_embeddings"),
    (dict(head_dim=64, seq_len=0), "seq_len"),
    (dict(head_dim=64, seq_len=-3), "seq_len"),
    (dict(head_dim=64, seq_len=2.5), "seq_len"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}),
     "seq_len is required"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic_qwen", "original_max_position_embeddings": 8}),
     "seq_len is required"),
    (dict(head_dim=64, scaling={"rope_type": "dynamic_yarn", "original_max_position_embeddings": 8}),
     "seq_len is required"),
    (dict(head_dim=64, scaling={**_example("longrope", 64)}), "seq_len is required"),
    (dict(head_dim=64, scaling={**_example("longrope", 64), "short_factor": [1.0] * 5}, seq_len=8),
     "short_factor"),
    (dict(head_dim=64, scaling={**_example("longrope", 64), "long_factor": [NAN] * 32}, seq_len=8),
     "long_factor"),
    (dict(head_dim=64, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
     "high_freq_factor"),
    (dict(head_dim=64, scaling={"rope_type": "base"}), "base"),
    (dict(head_dim=64, scaling={"rope_type": "base", "base": 5.0, "rope_theta": 6.0}), "base"),
    (dict(head_dim=2, scaling={"rope_type": "ntk", "factor": 2.0}), "rotary_dim"),
]


@pytest.mark.parametrize("kwargs,match", BAD, ids=[f"{i}-{m}" for i, (_, m) in enumerate(BAD)])
def test_bad_input_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rope_frequencies(**kwargs)


def test_validation_in_helpers():
    with pytest.raises(ValueError, match="rope_type"):
        is_dynamic({"rope_type": "nope"})
    with pytest.raises(ValueError, match="seq_len is required"):
        scaling_factor({"rope_type": "dynamic_yarn", "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match="factor"):
        scaling_factor({"rope_type": "linear"})


def test_none_values_mean_absent_and_tensor_seq_len():
    """JSON nulls (``"attention_factor": null``) count as absent; the dict is not mutated; 0-d tensor seq_len."""
    given = {**YARN, "attention_factor": None, "mscale": None}
    before = copy.deepcopy(given)
    a = rope_frequencies(64, scaling=given)
    assert given == before  # the caller's dict is not modified (HF's standardize_rope_params mutates it)
    b = rope_frequencies(64, scaling=YARN)
    assert torch.equal(a.inv_freq, b.inv_freq) and a.attention_scale == b.attention_scale
    dyn = {"rope_type": "dynamic_qwen", "original_max_position_embeddings": 16}
    assert torch.equal(rope_frequencies(64, scaling=dyn, seq_len=torch.tensor(40)).inv_freq,
                       rope_frequencies(64, scaling=dyn, seq_len=40).inv_freq)
