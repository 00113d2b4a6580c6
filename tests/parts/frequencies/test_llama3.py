"""posenc.parts.frequencies.llama3: ``llama3`` equals Hugging Face's (whole tensors)."""

from __future__ import annotations

import pytest

from tests.support.hf_rope import GRID, TRAINED, _check_equal_hf

transformers = pytest.importorskip("transformers")



transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
@pytest.mark.parametrize("low,high", [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_equals_hf(head_dim, base, factor, prf, low, high):
    extra = {"factor": factor, "low_freq_factor": low, "high_freq_factor": high,
             "original_max_position_embeddings": TRAINED}
    _check_equal_hf("llama3", head_dim, base, prf, extra, max_pos=int(TRAINED * factor))
