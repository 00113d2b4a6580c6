"""posenc.parts.frequencies.ntk: ``dynamic`` equals Hugging Face's (whole tensors); NTK-aware, NTK-mixed and Qwen's
dynamic NTK by hand."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from posenc._util import assert_close
from posenc.parts.frequencies import rope_frequencies, scaling_factor
from tests.support.hf_rope import ATOL, BASES, FACTORS, GRID, HEAD_DIMS, RTOL, TRAINED, _check_equal_hf

transformers = pytest.importorskip("transformers")



transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
@pytest.mark.parametrize("seq_len", [1, TRAINED // 2, TRAINED, TRAINED + 1, 3 * TRAINED, 17 * TRAINED + 5])
def test_dynamic_equals_hf(head_dim, base, factor, prf, seq_len):
    # HF reads the trained length from config.max_position_embeddings; we read it from the dict
    _check_equal_hf("dynamic", head_dim, base, prf, {"factor": factor}, seq_len=seq_len,
                    ours_extra={"original_max_position_embeddings": TRAINED})


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
