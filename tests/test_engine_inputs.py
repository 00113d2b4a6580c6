"""Bad input to the engine: a clear error naming the argument, or one documented answer on every path."""

import pytest
import torch

from posenc import PositionalAttention, PositionScheme, attention

ROPE = PositionScheme.preset("rope", train_len=64)
EAGER = ("reference", "sdpa", "blockwise", "auto")


def _qkv(B=2, H=4, Nq=24, Nk=24, D=16, Hk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Nq, D, generator=g), torch.randn(B, Hk or H, Nk, D, generator=g),
            torch.randn(B, Hk or H, Nk, D, generator=g))


@pytest.mark.parametrize("change,match", [
    (lambda q, k, v: (q, k, v[:, :, :3]), "same number of tokens"),      # k 24 keys, v 3
    (lambda q, k, v: (q[0], k, v), "q must be 4-D"),                      # 3-D q
    (lambda q, k, v: (q, k[..., :8], v), "head_dim"),                     # q/k head-dim mismatch
    (lambda q, k, v: (q[:1], k, v), "batch"),                             # batch-1 q against batch-2 k
    (lambda q, k, v: (q, k[:, :3], v[:, :3]), "heads"),                   # 4 query heads, 3 kv heads
    (lambda q, k, v: (q[:0], k[:0], v[:0]), "batch, heads, tokens"),      # B = 0
    (lambda q, k, v: (q[:, :, :0], k, v), "batch, heads, tokens"),       # N = 0
    (lambda q, k, v: (q, k.double(), v), "dtype"),
])
def test_shape_errors(change, match):
    with pytest.raises(ValueError if match != "dtype" else TypeError, match=match):
        attention(*change(*_qkv()), ROPE)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "x"])
def test_scale_must_be_finite_positive(scale):
    with pytest.raises(ValueError, match="scale"):
        attention(*_qkv(), ROPE, scale=scale)


@pytest.mark.parametrize("key_mask,err", [
    (torch.ones(2, 24), TypeError),                          # float mask
    (torch.ones(2, 23, dtype=torch.bool), ValueError),       # wrong length
    (torch.ones(24, dtype=torch.bool), ValueError),          # missing batch dim
])
def test_key_mask_type_and_shape(key_mask, err):
    with pytest.raises(err, match="key_mask"):
        attention(*_qkv(), ROPE, key_mask=key_mask)


def test_unknown_impl():
    with pytest.raises(ValueError, match="impl"):
        attention(*_qkv(), ROPE, impl="fast")


def test_explicit_scale_equals_reference_on_every_path():
    q, k, v = _qkv()
    ref = attention(q, k, v, ROPE, impl="reference", scale=0.3)
    for impl in EAGER:
        torch.testing.assert_close(attention(q, k, v, ROPE, impl=impl, scale=0.3), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["rope", "alibi", "sliding_window"])
def test_nan_query_row_gives_nan_row_on_every_path(name):
    s = PositionScheme.preset(name, train_len=64, **({"window": 8} if name == "sliding_window" else {}))
    q, k, v = _qkv(Nq=80, Nk=80)
    q[1, 2, 40, 3] = float("nan")
    for impl in EAGER + ("toeplitz",):
        out = attention(q, k, v, s, impl=impl)
        assert out[1, 2, 40].isnan().all(), impl
        keep = torch.ones(out.shape[:3], dtype=torch.bool)
        keep[1, 2, 40] = False
        assert out[keep].isfinite().all(), impl


def test_all_padding_row_gives_zero_on_every_path():
    q, k, v = _qkv()
    km = torch.ones(2, 24, dtype=torch.bool)
    km[1] = False  # every key of row 1 is padding
    km[0, :20] = False  # row 0: all but the last keys are padding
    for name in ("rope", "alibi", "rerope"):
        s = PositionScheme.preset(name, train_len=64, **({"window": 8} if name == "rerope" else {}))
        ref = attention(q, k, v, s, impl="reference", key_mask=km)
        assert (ref[1] == 0).all() and ref.isfinite().all()
        for impl in EAGER:
            torch.testing.assert_close(attention(q, k, v, s, impl=impl, key_mask=km), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("B,H,Hk,Nq,Nk", [(1, 2, 1, 1, 1), (3, 4, 2, 7, 7), (2, 6, 3, 5, 56), (1, 4, 4, 131, 131)])
def test_eager_paths_equal_reference_on_awkward_shapes(B, H, Hk, Nq, Nk):
    q, k, v = _qkv(B=B, H=H, Hk=Hk, Nq=Nq, Nk=Nk)
    for name in ("rope", "alibi", "rerope", "streaming_llm"):
        params = {"window": 8} if name in ("rerope", "streaming_llm") else {}
        s = PositionScheme.preset(name, train_len=64, **params)
        ref = attention(q, k, v, s, impl="reference")
        for impl in EAGER + ("toeplitz",):
            torch.testing.assert_close(attention(q, k, v, s, impl=impl), ref, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, impl=impl, name=name: f"{name}/{impl}: {m}")


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
