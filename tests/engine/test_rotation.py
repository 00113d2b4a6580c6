"""posenc.engine.rotation: the engine's RoPE equals HF's apply_rotary_pos_emb (float64) plus SDPA."""

import torch
import torch.nn.functional as F

from posenc import PositionScheme, attention
from posenc._util import assert_close
from posenc.parts.frequencies import rope_frequencies
from tests.support.attention import _hf_rotate, _qkv

torch.manual_seed(0)


# ------------------------------------------------------------------ RoPE and its remaps vs references
def test_rope_equals_hf_rotation_plus_sdpa():
    q, k, v = _qkv()
    N, D = q.shape[2], q.shape[3]
    inv = rope_frequencies(D).inv_freq
    pos = torch.arange(N)
    ref = F.scaled_dot_product_attention(_hf_rotate(q, pos, inv), _hf_rotate(k, pos, inv), v, is_causal=True)
    s = PositionScheme.preset("rope", train_len=64)
    for impl in ("reference", "sdpa", "blockwise"):
        assert_close(attention(q, k, v, s, impl=impl), ref, rtol=1e-5, atol=1e-6, name=impl)
