"""posenc.engine.module: PositionalAttention's gradients reach the scheme's learned parts; bad dims, input and
input dtypes are refused by name."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionalAttention, PositionScheme

torch.manual_seed(0)


# ------------------------------------------------------------------ gradients and learned parts
@pytest.mark.parametrize("name", ["t5", "kerple_power", "kerple_log", "shaw", "transformer_xl", "deberta",
                                  "infini"])
def test_gradients_reach_learned_parts(name):
    s = PositionScheme.preset(name, train_len=32)
    m = PositionalAttention(32, 4, s)
    x = torch.randn(2, 24, 32)
    m(x).pow(2).sum().backward()
    learned = [(n, p) for n, p in m.named_parameters() if not n.split(".")[0].endswith("proj")]
    assert learned, "scheme has no learned parameters"
    for n, p in learned:
        assert p.grad is not None and p.grad.abs().sum() > 0, n

ROPE = PositionScheme.preset("rope", train_len=64)


@pytest.mark.parametrize("kwargs,match", [
    ({"dim": 30, "n_heads": 4}, "divisible"),
    ({"dim": 32, "n_heads": 0}, "n_heads"),
    ({"dim": 32, "n_heads": 4, "n_kv_heads": 3}, "n_kv_heads"),
    ({"dim": 28, "n_heads": 4}, "even"),  # head_dim 7 with RoPE
])
def test_positional_attention_bad_dims(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PositionalAttention(scheme=ROPE, **kwargs)


def test_positional_attention_bad_input():
    m = PositionalAttention(32, 4, ROPE)
    with pytest.raises(ValueError, match="x must be"):
        m(torch.randn(2, 8, 16))
    with pytest.raises(ValueError, match="x must be"):
        m(torch.randn(8, 32))

P = PositionScheme


# ---------------------------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_positional_attention_names_a_wrong_input_dtype(dtype):
    layer = PositionalAttention(16, 2, P.preset("rope", train_len=16))
    x = torch.randn(1, 4, 16).to(dtype) if dtype.is_floating_point else torch.randint(0, 9, (1, 4, 16))
    with pytest.raises(TypeError, match=r"x must (have|be a floating-point tensor of) the layer's dtype torch.float32"):
        layer(x)
    if dtype.is_floating_point:  # the layer converted to the input's dtype runs it
        assert layer.to(dtype)(x).dtype == dtype
