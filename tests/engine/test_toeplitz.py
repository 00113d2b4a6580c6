"""posenc.engine.toeplitz: the Toeplitz kernel (distance-only biases on the fused CPU flash kernel through an O(N)
strided view) against a dense softmax written here (bias matrix built entry by entry from the profile), its
minimum distance and log-sum-exp, and its input checks."""

import pytest
import torch

from posenc._util import relative_error
from posenc.engine.toeplitz import toeplitz_attention


def _dense(q, k, v, profile, q_start, window, min_distance=0, key_start=0):
    """softmax(q k^T + B) v with B[m, n] = profile[h, m - n] for min_distance <= m - n < window and
    n >= key_start, -inf otherwise; also the rows' log-sum-exp (rows without a key: output 0, lse -inf)."""
    Nq, Nk = q.shape[2], k.shape[2]
    m = torch.arange(q_start, q_start + Nq)[:, None]
    n = torch.arange(Nk)[None]
    d = m - n
    ok = (d >= min_distance) if window is None else (d >= min_distance) & (d < window)
    ok = ok & (n >= key_start)
    bias = profile[:, d.clamp(min=0, max=profile.shape[1] - 1)]  # [H,Nq,Nk]
    scores = (q @ k.transpose(-1, -2) + bias).masked_fill(~ok, float("-inf"))
    out = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0) @ v
    return out, torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("Nq,Nk,q_start", [(50, 50, 0), (37, 80, 43), (1, 64, 63), (64, 64, 0), (20, 90, 30)])
@pytest.mark.parametrize("window", [None, 1, 9, 200])
@pytest.mark.parametrize("chunk", [None, 7, 16])
def test_kernel_equals_dense(Nq, Nk, q_start, window, chunk):
    g = torch.Generator().manual_seed(Nq + Nk + (window or 0))
    B, H, D = 2, 3, 8
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (Nq, Nk, Nk))
    profile = torch.randn(H, Nk, generator=g) * 3  # an arbitrary function of the distance
    out = toeplitz_attention(q, k, v, profile, q_start=q_start, window=window, chunk=chunk)
    ref, _ = _dense(q, k, v, profile, q_start, window)
    assert relative_error(out, ref) <= 1e-6


@pytest.mark.parametrize("Nq,Nk,q_start", [(50, 50, 0), (37, 80, 43), (1, 64, 63), (20, 90, 30), (40, 40, 0)])
@pytest.mark.parametrize("window,min_distance", [(None, 5), (None, 45), (30, 8), (9, 1), (None, 0)])
@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("key_start", [0, 4, 40])
def test_kernel_min_distance_and_lse_equal_dense(Nq, Nk, q_start, window, min_distance, chunk, key_start):
    """A piece of the keys (``min_distance <= d < window``, positions ``>= key_start``) with its log-sum-exp:
    rows that see no key (queries before ``min_distance`` or ``key_start``) give 0 and -inf, so pieces
    merge exactly."""
    g = torch.Generator().manual_seed(Nq * 7 + min_distance)
    B, H, D = 2, 3, 8
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (Nq, Nk, Nk))
    profile = torch.randn(H, Nk, generator=g)
    out, lse = toeplitz_attention(q, k, v, profile, q_start=q_start, window=window, chunk=chunk,
                                  min_distance=min_distance, return_lse=True, key_start=key_start)
    ref, ref_lse = _dense(q, k, v, profile, q_start, window, min_distance, key_start)
    assert relative_error(out, ref) <= 1e-6
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_kernel_validates_inputs():
    q, k, v = (torch.randn(1, 2, 10, 4) for _ in range(3))
    with pytest.raises(ValueError, match="profile"):
        toeplitz_attention(q, k, v, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="queries"):
        toeplitz_attention(q, k, v, torch.zeros(2, 20), q_start=3)
    with pytest.raises(ValueError, match="window"):
        toeplitz_attention(q, k, v, torch.zeros(2, 20), window=0)
    with pytest.raises(ValueError, match="min_distance"):
        toeplitz_attention(q, k, v, torch.zeros(2, 20), window=4, min_distance=4)
    with pytest.raises(ValueError, match="key_start"):
        toeplitz_attention(q, k, v, torch.zeros(2, 20), key_start=-1)
    with pytest.raises(ValueError, match="shapes"):
        toeplitz_attention(q, k[:, :1], v, torch.zeros(2, 20))
