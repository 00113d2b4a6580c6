"""posenc.training.s2: LongLoRA's shifted sparse attention covers every token once, is plain attention inside each
group, and trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from posenc._util import assert_close
from posenc.engine.module import PositionalAttention
from posenc.scheme.core import PositionScheme
from posenc.training.s2 import s2_attention, s2_forward, s2_groups
from posenc.training.train import train
from tests.training.test_train import tiny  # noqa: F401  (the fixture)


# ------------------------------------------------------------------------------------------------ S^2
@pytest.mark.parametrize("n,groups", [(16, 4), (32, 2), (12, 3), (8, 1)])
def test_s2_shifted_groups_cover_every_token_once(n, groups):
    g = n // groups
    for shifted in (False, True):
        ranges = s2_groups(n, groups, shifted)
        tokens = [t for s, e in ranges for t in range(s, e)]
        assert tokens == list(range(n))  # a partition of 0..n-1, in order
    plain, shift = s2_groups(n, groups, False), s2_groups(n, groups, True)
    assert all(e - s == g for s, e in plain)
    assert [s for s, _ in shift[1:]] == [s + g // 2 for s, _ in plain]  # boundaries moved by G/2
    with pytest.raises(ValueError, match="n_groups"):
        s2_groups(16, 3, False)
    with pytest.raises(ValueError, match="even"):
        s2_groups(12, 4, True)


def test_s2_forward_is_plain_attention_inside_each_group():
    """Heads [0, H/2) of S^2 equal plain attention run on each plain group's tokens alone (same true positions),
    heads [H/2, H) on each shifted group's: checked against the layer's own forward on sliced inputs."""
    torch.manual_seed(0)
    H, D, N, G = 4, 8, 16, 4
    attn = PositionalAttention(H * D, H, PositionScheme.preset("rope", train_len=N)).double()
    attn.o_proj = nn.Identity()  # compare per-head outputs
    x = torch.randn(2, N, H * D, dtype=torch.float64)
    pos = torch.arange(N)[None].expand(2, N) + 5
    out = s2_forward(attn, G, x, pos)  # [B,N,H*D]
    half = H // 2 * D
    for cols, shifted in ((slice(0, half), False), (slice(half, H * D), True)):
        for s, e in s2_groups(N, G, shifted):
            ref = attn(x[:, s:e], pos[:, s:e])
            assert_close(out[:, s:e, cols], ref[:, :, cols], rtol=1e-10, atol=1e-10)
    full = attn(x, pos)
    assert not torch.allclose(out[:, N // 2:], full[:, N // 2:])  # later tokens do lose the far keys


def test_s2_attention_context_restores_full_attention_and_trains(corpus, tmp_path):
    from posenc.models.tinylm import LMConfig, TinyLM

    torch.manual_seed(0)
    model = TinyLM(LMConfig(50, 16, 1, 2, PositionScheme.preset("rope", train_len=16), 16))
    x = torch.randint(0, 50, (2, 16))
    before = model(x)
    with s2_attention(model, 4):
        inside = model(x)
    assert torch.equal(model(x), before) and not torch.allclose(inside, before)
    with pytest.raises(ValueError, match="n_heads must be even"):
        odd = TinyLM(LMConfig(50, 18, 1, 3, PositionScheme.preset("rope", train_len=16), 16))
        with s2_attention(odd, 4):
            odd(x)
    summary = train(tiny(corpus, tmp_path / "s2", s2_groups=4), progress=False)
    assert summary["finished"] and np.isfinite(summary["val_loss"])
