"""Hugging Face's ROPE_INIT_FUNCTIONS as the reference of posenc.parts.frequencies (tests/parts/frequencies/):
the grid of head dims, bases, factors and partial rotary factors, and the whole-tensor comparison."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from posenc._util import assert_close
from posenc.parts.frequencies import rope_frequencies

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
