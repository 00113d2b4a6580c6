"""posenc.parts.frequencies.basic: ``default`` and ``linear`` equal Hugging Face's (whole tensors), linear is the
default over the factor, and changing the base."""

from __future__ import annotations

import itertools

import pytest
import torch

from posenc._util import assert_close
from posenc.parts.frequencies import rope_frequencies
from tests.support.hf_rope import ATOL, BASES, GRID, HEAD_DIMS, PARTIALS, RTOL, _check_equal_hf, _hf

transformers = pytest.importorskip("transformers")



transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


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
def test_linear_is_default_over_factor(head_dim, base, factor, prf):
    default = rope_frequencies(head_dim, base, partial_rotary_factor=prf).inv_freq.double()
    linear = rope_frequencies(head_dim, base, {"type": "linear", "factor": factor}, partial_rotary_factor=prf)
    assert_close(linear.inv_freq, default / factor, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("new_base", [500.0, 10000.0, 1e6])
def test_base_change_and_rope_theta_override(new_base):
    expected = rope_frequencies(64, new_base)
    for scaling in ({"rope_type": "base", "base": new_base}, {"rope_type": "base", "rope_theta": new_base},
                    {"rope_type": "default", "rope_theta": new_base}):
        out = rope_frequencies(64, 10000.0, scaling)  # the dict's base wins over the argument
        assert torch.equal(out.inv_freq, expected.inv_freq), scaling
