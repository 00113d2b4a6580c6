"""posenc.parts.frequencies' entry points (api): real config blocks equal HF, every schedule positive, finite and
float32, dynamic schedules equal the default inside the trained length, overrides and ``None`` values, and
validation (``validate_rope_scaling``, bad input, finite values after validation)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from posenc._util import assert_close
from posenc.parts.frequencies import (
    ROPE_SCALINGS,
    RopeFrequencies,
    is_dynamic,
    rope_frequencies,
    scaling_factor,
    validate_rope_scaling,
)
from tests.support.hf_rope import ATOL, RTOL, TRAINED, _hf

transformers = pytest.importorskip("transformers")



transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


def _longrope_lists(n: int, seed: int) -> tuple[list[float], list[float]]:
    g = torch.Generator().manual_seed(seed)
    short = (1.0 + 0.2 * torch.rand(n, generator=g, dtype=torch.float64)).tolist()
    long = (1.0 + 20.0 * torch.rand(n, generator=g, dtype=torch.float64).cumsum(0) / n).tolist()
    return short, long


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


# ------------------------------------------------------------------------------------------------ rope_scaling
_L = {"original_max_position_embeddings": 64}


@pytest.mark.parametrize("scaling, match", [
    ([1, 2], r"scaling must be a dict"),
    ({"rope_type": "superrope", "factor": 2}, r"rope_type'\] must be one of .*'yarn'.*got 'superrope'"),
    ({"rope_type": "yarn", "factor": 2, "bogus": 1, **_L}, r"keys \['bogus'\] that rope_type 'yarn' does not use"),
    ({"rope_type": "linear"}, r"scaling\['factor'\] is required"),
    ({"rope_type": "llama3", "factor": 8, **_L}, r"scaling\['low_freq_factor'\] is required"),
    ({"rope_type": "dynamic", "factor": 2}, r"original_max_position_embeddings'\] .* is required"),
    ({"rope_type": "longrope", "factor": 2, **_L, "long_factor": [1.0] * 32}, r"short_factor'\] is required"),
    ({"rope_type": "longrope", "factor": 2, **_L, "short_factor": [1.0] * 32, "long_factor": [1.0] * 31},
     r"long_factor'\] must have rotary_dim // 2 = 32 entries, got 31"),
    ({"rope_type": "llama3", "factor": 8, **_L, "low_freq_factor": 4, "high_freq_factor": 1},
     r"high_freq_factor'\] must be > low_freq_factor"),
    ({"rope_type": "yarn", "factor": 4, **_L, "beta_fast": 1, "beta_slow": 32}, r"beta_fast'\] must be > beta_slow"),
    ({"rope_type": "yarn", "factor": 4, **_L, "mscale": -100, "mscale_all_dim": 1}, r"mscale'\] must be >= 0"),
    ({"rope_type": "yarn", "factor": 4, **_L, "attention_factor": -1}, r"attention_factor'\] must be > 0"),
    ({"rope_type": "yarn", "factor": 0, **_L}, r"factor'\] must be >= 1.0, got 0"),
    ({"rope_type": "yarn", "factor": -2, **_L}, r"factor'\] must be >= 1.0"),
    ({"rope_type": "yarn", "factor": 0.5, **_L}, r"factor'\] must be >= 1.0, got 0.5"),
    ({"rope_type": "yarn", "factor": float("nan"), **_L}, r"factor'\] must be finite"),
    ({"rope_type": "linear", "factor": float("inf")}, r"factor'\] must be finite"),
    ({"rope_type": "linear", "factor": "4"}, r"factor'\] must be a finite number, got '4'"),
    ({"rope_type": "ntk", "factor": 1e300}, r"overflows"),
    ({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 0}, r"must be an integer >= 1"),
    ({"rope_type": "yarn", "factor": 2, **_L, "truncate": "no"}, r"truncate'\] must be true or false"),
])
def test_malformed_rope_scaling_is_refused(scaling, match):
    with pytest.raises(ValueError, match=match):
        validate_rope_scaling(scaling, head_dim=64)
    with pytest.raises(ValueError, match=match):
        rope_frequencies(64, scaling=scaling, seq_len=128)


def test_validate_rope_scaling_without_head_dim_checks_longrope_lists_agree():
    bad = {"rope_type": "longrope", "factor": 2, **_L, "short_factor": [1.0] * 4, "long_factor": [1.0] * 3}
    with pytest.raises(ValueError, match=r"long_factor'\] must have rotary_dim // 2 = 4 entries, got 3"):
        validate_rope_scaling(bad)


def test_validate_rope_scaling_returns_the_normalised_dict():
    out = validate_rope_scaling({"type": "yarn", "factor": 4, "beta_fast": None, **_L}, head_dim=64)
    assert out == {"rope_type": "yarn", "factor": 4.0, **_L}
    assert validate_rope_scaling(None) == {"rope_type": "default"}


@pytest.mark.parametrize("head_dim, partial", [(63, 1.0), (7, 1.0), (64, 0.3), (1, 1.0)])
def test_odd_rotary_dims_are_refused(head_dim, partial):
    with pytest.raises(ValueError, match=r"must be an even integer >= 2"):
        rope_frequencies(head_dim, partial_rotary_factor=partial)
    with pytest.raises(ValueError, match=r"must be an even integer >= 2"):
        validate_rope_scaling(None, head_dim=head_dim, partial_rotary_factor=partial)


def test_finite_values_everywhere_after_validation():
    """A config that passes validation gives finite frequencies and a positive attention scale."""
    f = rope_frequencies(64, scaling={"rope_type": "yarn", "factor": 4, **_L, "mscale": 0.0, "mscale_all_dim": 0})
    assert bool(torch.isfinite(f.inv_freq).all()) and f.attention_scale > 0 and math.isfinite(f.attention_scale)
