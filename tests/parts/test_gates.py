"""posenc.parts.gates: FoX's forget-gate bias equals x-transformers' ``DataDependentAlibi``; the engine needs its
gates."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import PositionalAttention, PositionScheme
from posenc._util import assert_close
from posenc.engine import run_attention
from posenc.engine.parts import AttentionParts
from tests.support.tiny_lm import _scheme


# ============================================================================ FoX
def test_fox_gate_equals_x_transformers_data_dependent_alibi():
    """The forget-gate bias c_i - c_j equals x-transformers' ``DataDependentAlibi(x)`` on the same weights,
    and attention with it equals ``Attend(causal=True)`` given that bias; through PositionalAttention, the
    gate reads the layer input x."""
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import DataDependentAlibi

    from posenc.parts.gates import forget_bias

    B, H, N, dim = 2, 4, 20, 32
    torch.manual_seed(3)
    m = PositionalAttention(dim, H, _scheme("fox"))
    ref = DataDependentAlibi(dim, H)
    with torch.no_grad():
        m.gate.weight.copy_(torch.randn(H, dim))  # strong, varied gates
        m.gate.bias.copy_(torch.randn(H))
        ref.to_forget_gates[0].weight.copy_(m.gate.weight)
        ref.to_forget_gates[0].bias.copy_(m.gate.bias)
    x = torch.randn(B, N, dim)
    with torch.no_grad():
        c = m.gate(x).cumsum(-1)  # [B,H,N]
        pos = torch.arange(N)
        ours = forget_bias(c[..., :, None], c[..., None, :], pos[:, None], pos[None])
        theirs = ref(x)
        causal = torch.ones(N, N, dtype=torch.bool).tril()
        assert_close(ours[..., causal], theirs[..., causal], rtol=1e-5, atol=1e-5, name="FoX bias")
        assert float(theirs[..., causal].min()) < -5  # the decay is far from negligible here
        q, k, v = m.project(x)
        expected, _ = Attend(causal=True)(q, k, v, attn_bias=theirs)
        assert_close(m(x), m.o_proj(expected.transpose(1, 2).reshape(B, N, dim)), rtol=1e-5, atol=1e-6,
                     name="PositionalAttention")


def test_fox_needs_its_gates():
    s = _scheme("fox")
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    with pytest.raises(ValueError, match="forget gate"):
        posenc.attention(q, k, v, s)
    with pytest.raises(ValueError, match="gates"):
        run_attention(AttentionParts(s, 2, 8), q, k, v, gates=(torch.zeros(1, 2, 4), torch.zeros(1, 2, 5)))
    with pytest.raises(ValueError, match="no forget gate"):
        run_attention(AttentionParts(_scheme("rope"), 2, 8), q, k, v, gates=(torch.zeros(1, 2, 5),) * 2)
    with pytest.raises(ValueError, match="memory"):
        PositionScheme(gate=s.gate, memory=_scheme("infini").memory, train_len=16)
