"""posenc.parts.frequencies.yarn: ``yarn`` equals Hugging Face's (whole tensors, every variant, the factor inferred
like HF), and dynamic YaRN by hand."""

from __future__ import annotations

import math

import pytest
import torch

from posenc._util import assert_close
from posenc.parts.frequencies import rope_frequencies
from tests.support.hf_rope import ATOL, GRID, HEAD_DIMS, RTOL, TRAINED, _check_equal_hf

transformers = pytest.importorskip("transformers")



transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


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


# ----------------------------------------------------------------------------------------------------------
# hand-computed cases (plain math, written independently of the implementation)


def _default_py(d: int, base: float) -> list[float]:
    return [base ** (-2 * i / d) for i in range(d // 2)]


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
