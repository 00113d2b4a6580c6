"""posenc.parts.frequencies.proportional: ``proportional`` (p-RoPE) equals Hugging Face's and Gemma 4's rotation;
its tail is zero."""

from __future__ import annotations

import itertools

import pytest
import torch

from posenc import PositionScheme
from posenc._util import assert_close
from posenc.engine import make_call
from posenc.engine.parts import AttentionParts
from posenc.engine.scores import rotate_branch
from posenc.parts.frequencies import rope_frequencies
from tests.support.hf_rope import BASES, _check_equal_hf

transformers = pytest.importorskip("transformers")



transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


@pytest.mark.parametrize("head_dim,base", list(itertools.product((64, 128, 256), BASES)))
@pytest.mark.parametrize("prf", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("factor", [1.0, 8.5])
def test_proportional_equals_hf(head_dim, base, prf, factor):
    ours = rope_frequencies(head_dim, base, {"rope_type": "proportional", "factor": factor,
                                             "partial_rotary_factor": prf})
    assert ours.rotary_dim == head_dim  # whole head rotated; the tail has zero frequency
    _check_equal_hf("proportional", head_dim, base, prf, {"factor": factor})


def test_proportional_tail_is_zero():
    out = rope_frequencies(256, 1e6, {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert out.inv_freq.shape == (128,)
    assert bool((out.inv_freq[32:] == 0).all())
    # the rotated quarter keeps the full head's ladder: theta_i = base^(-2i/256), i < 32 (not 2i/64)
    ladder = torch.tensor([1e6 ** (-2 * i / 256) for i in range(32)], dtype=torch.float64)
    assert_close(out.inv_freq[:32], ladder, rtol=1e-6, atol=0, name="rotated ladder")
    assert out.attention_scale == 1.0


# ============================================================================ p-RoPE
def _gemma4_rotary(head_dim=64, p=0.25, theta=1e6):
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    cfg = Gemma4TextConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=head_dim,
                           layer_types=["sliding_attention", "full_attention"],
                           rope_parameters={"full_attention": {"rope_type": "proportional", "rope_theta": theta,
                                                               "partial_rotary_factor": p},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    return Gemma4TextRotaryEmbedding(cfg)


@pytest.mark.parametrize("p", [0.25, 0.5, 1.0])
def test_p_rope_equals_gemma4_proportional_rope(p):
    """Same inv_freq, cos/sin and rotated q/k as transformers' ``proportional`` rope type in Gemma 4, on
    identical inputs (the engine's own rotation path, rotate_branch)."""
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb

    D, H, N = 64, 2, 40
    hf = _gemma4_rotary(D, p)
    parts = AttentionParts(PositionScheme.preset("rope", base=1e6).extend("p_rope", p=p), H, D)
    freqs = parts.frequencies(None)
    assert_close(freqs.inv_freq, hf.full_attention_inv_freq, rtol=1e-6, atol=0, name="inv_freq")
    assert int((freqs.inv_freq > 0).sum()) == int(p * D // 2)  # the highest frequencies stay, the rest are 0

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D) for _ in range(3))
    pos = torch.arange(N)[None] + 7
    cos, sin = hf(q.transpose(1, 2), pos, "full_attention")  # [1,N,D]
    from posenc.parts.rotary import rope_cos_sin

    ours_cos, ours_sin = rope_cos_sin(pos, freqs.inv_freq)  # [1,1,N,D/2]
    assert_close(torch.cat([ours_cos, ours_cos], -1)[:, 0], cos, rtol=0, atol=1e-5, name="cos")
    assert_close(torch.cat([ours_sin, ours_sin], -1)[:, 0], sin, rtol=0, atol=1e-5, name="sin")

    call = make_call(parts, q, k, v, pos, pos).scheduled(freqs, torch.ones(1, 1, N, 1))
    rot = rotate_branch(call, parts.branches[0])
    assert_close(rot.q, apply_rotary_pos_emb(q, cos, sin), rtol=0, atol=1e-5, name="rotated q")
    assert_close(rot.k, apply_rotary_pos_emb(k, cos, sin), rtol=0, atol=1e-5, name="rotated k")
    rotated = int(p * D // 2)
    nope = torch.cat([torch.arange(rotated, D // 2), torch.arange(D // 2 + rotated, D)])
    assert torch.equal(rot.k[..., nope], k[..., nope])  # NoPE pairs: not rotated at all
