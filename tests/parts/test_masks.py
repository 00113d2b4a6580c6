"""posenc.parts.masks: hand-written masks (BCA, lambda and sinks, chunked attention against a dense masked
reference) and the visible key intervals every mask states."""


import pytest
import torch

from posenc import PositionScheme
from posenc._util import assert_close
from posenc.engine import PositionalAttention
from posenc.parts.masks import MaskSpec, materialize
from tests.scheme.test_pattern import _dense_reference

torch.manual_seed(0)


# ------------------------------------------------------------------ masks against hand-written matrices
def _grid(mask, n):
    p = torch.arange(n)[None]
    return materialize(mask, p, p)[0, 0].int()


def test_bca_mask_hand_written():
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
    ])
    assert torch.equal(_grid(MaskSpec(block=2), 6), expected)


def test_lambda_and_sink_masks_hand_written():
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 1, 1, 0, 0],
        [1, 0, 0, 1, 1, 0],
        [1, 0, 0, 0, 1, 1],
    ])  # one global/sink token + window 2
    assert torch.equal(_grid(MaskSpec(window=2, n_sinks=1), 6), expected)
    window_only = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    assert torch.equal(_grid(MaskSpec(window=2), 4), window_only)


@pytest.mark.parametrize("mask", [MaskSpec(window=7, n_sinks=2), MaskSpec(block=5), MaskSpec(window=3, block=4),
                                  MaskSpec(causal=False, window=6), MaskSpec()])
def test_key_intervals_cover_every_visible_key(mask):
    p = torch.arange(60)
    dense = mask.allowed(p[:, None], p[None])
    for q_lo in range(0, 60, 7):
        q_hi = min(59, q_lo + 9)
        visible = dense[q_lo:q_hi + 1].any(0).nonzero().flatten().tolist()
        ivs = mask.key_intervals(q_lo, q_hi)
        assert all(any(lo <= kp <= hi for lo, hi in ivs) for kp in visible), (q_lo, ivs)

L = 16

PATTERNS = {"irope": {"every": 2}, "local_global": {"every": 2}, "nope_every4": {"every": 2}}


def pattern(name, **kw):
    return PositionScheme.preset(name, train_len=L, **{**PATTERNS[name], **kw})


@pytest.mark.parametrize("impl", ["auto", "reference", "blockwise", "sdpa"])
def test_chunked_attention_equals_a_dense_masked_reference(impl):
    torch.manual_seed(0)
    layer = pattern("irope", chunk=5).layers[0]
    attn = PositionalAttention(32, 4, layer)
    x, pos = torch.randn(2, 23, 32), torch.arange(23)[None].expand(2, -1)
    qp, kp = pos[:, :, None], pos[:, None, :]
    allowed = (kp <= qp) & (kp // 5 == qp // 5)
    with torch.no_grad():
        assert_close(attn(x, pos, impl=impl), _dense_reference(attn, x, pos, allowed, rope_base=1e4),
                     rtol=1e-4, atol=1e-5)
    mask = MaskSpec(chunk=5)
    for q_lo, q_hi in ((0, 4), (7, 13), (20, 22)):  # the engine's key intervals hold every visible key
        (lo, hi), = mask.key_intervals(q_lo, q_hi)
        vis = allowed[0, q_lo:q_hi + 1].any(0).nonzero().flatten()
        assert lo == int(vis.min()) and hi == int(vis.max())
