"""Content-relative parts (posenc.parts.relative): Shaw, Transformer-XL and DeBERTa against a naive loop over every
(query, key) pair, written from the papers' formulas (not from posenc.parts.relative): one logit at a time, then a
softmax over the visible keys; CoPE against x-transformers.

- Shaw et al. 2018 (arXiv 1803.02155), eqs. 3-5: e_ij = q_i.(k_j + a^K_ij) / sqrt(d),
  z_i = sum_j alpha_ij (v_j + a^V_ij), a_ij = w_clip(j - i, k).
- Dai et al. 2019 (arXiv 1901.02860), sec. 3.3: A_ij = q_i.k_j + q_i.W_R R_(i-j) + u.k_j + v.W_R R_(i-j),
  R the sinusoid encoding of Vaswani et al. (XL's code orders it sin | cos), scaled by 1/sqrt(d).
- He et al. 2021 (arXiv 2006.03654), eqs. 2-4: A_ij = Q^c_i.K^c_j + Q^c_i.K^r_delta(i,j)
  + K^c_j.Q^r_delta(j,i), scaled by 1/sqrt(3d); delta(i,j) = 0 if i-j <= -k, 2k-1 if i-j >= k,
  else i-j+k.

Small sizes (distances beyond the clip range are exercised), float64 inputs, every parameter random (the
zero initialisations of Shaw's a^V and XL's u, v would hide their terms). Tolerance 1e-6: the engine takes
its softmax in float32 (~1e-7 here); a wrong term or index moves the output by 1e-2 or more."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import PositionScheme
from posenc._util import assert_close
from posenc.engine import run_attention
from posenc.engine.parts import AttentionParts
from tests.support.tiny_lm import _randomize_, _scheme


# ============================================================================ CoPE
def _cope_parts(H, D, npos):
    parts = AttentionParts(_scheme("cope", npos_max=npos), H, D)
    return _randomize_(parts)


@pytest.mark.parametrize("npos", [4, 64])
def test_cope_equals_x_transformers(npos):
    """posenc's CoPE on the engine equals x-transformers' ``Attend(causal=True, cope=CoPE(...))`` on the same
    q, k, v and position table (npos 4: positions clipped; 64: interpolated everywhere), with and without
    padding keys."""
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import CoPE

    B, H, N, D = 2, 3, 24, 8
    parts = _cope_parts(H, D, npos)
    ref_cope = CoPE(dim=D, heads=H, max_pos=npos)
    with torch.no_grad():
        ref_cope.pos_emb.copy_(parts.relative.pos_emb)
    attend = Attend(causal=True, cope=ref_cope)
    torch.manual_seed(2)
    q, k, v = (torch.randn(B, H, N, D) * 2 for _ in range(3))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, :5] = False
    with torch.no_grad():
        for key_mask in (None, mask):
            ref, _ = attend(q, k, v, mask=None if key_mask is None else key_mask[:, None, None, :])
            ours = run_attention(parts, q, k, v, impl="reference", key_mask=key_mask)
            rows = slice(None) if key_mask is None else (slice(None), slice(None), slice(5, None))
            assert_close(ours[rows], ref[rows], rtol=1e-5, atol=1e-5, name=f"CoPE key_mask={key_mask is not None}")


def test_cope_refuses_unsorted_keys():
    parts = _cope_parts(1, 4, 8)
    q, k, v = (torch.randn(1, 1, 3, 4) for _ in range(3))
    with pytest.raises(ValueError, match="key positions"):
        run_attention(parts, q, k, v, torch.tensor([[2, 2, 2]]), torch.tensor([[0, 2, 1]]))

H, D = 2, 4


def _parts(kind, **params):
    parts = AttentionParts(PositionScheme(name=kind, relative=_part(kind, params)), H, D).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in parts.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return parts


def _part(kind, params):
    from posenc.scheme.core import Part

    return Part(kind, params)


def _clip(x, lo, hi):
    return max(lo, min(hi, x))


def _shaw_logit(rel, b, h, i, j, q, k, qp, kp):
    K = rel.max_distance
    a_k = rel.key_table[_clip(kp[b, j] - qp[b, i], -K, K) + K]
    return float(q[b, h, i] @ (k[b, h, j] + a_k)) / math.sqrt(D)


def _shaw_value(rel, b, i, j, v_j, qp, kp):
    K = rel.max_distance
    return v_j + rel.value_table[_clip(kp[b, j] - qp[b, i], -K, K) + K]


def _sinusoid(d, base=10000.0):
    """R_d: [sin(d w_0), ..., sin(d w_{D/2-1}), cos(d w_0), ..., cos(d w_{D/2-1})], w_t = base^(-2t/D)."""
    w = [base ** (-2 * t / D) for t in range(D // 2)]
    return torch.tensor([math.sin(d * x) for x in w] + [math.cos(d * x) for x in w], dtype=torch.float64)


def _xl_logit(rel, b, h, i, j, q, k, qp, kp):
    wr_r = rel.w_r[h].t() @ _sinusoid(int(qp[b, i] - kp[b, j]), rel.base)  # W_R R_(i-j), W_R stored transposed
    a = q[b, h, i] @ k[b, h, j]          # (a) content
    bb = q[b, h, i] @ wr_r               # (b) content-dependent position
    c = rel.u[h] @ k[b, h, j]            # (c) global content bias
    d = rel.v[h] @ wr_r                  # (d) global position bias
    return float(a + bb + c + d) / math.sqrt(D)


def _deberta_delta(i, j, kspan):
    if i - j <= -kspan:
        return 0
    if i - j >= kspan:
        return 2 * kspan - 1
    return i - j + kspan


def _deberta_logit(rel, b, h, i, j, q, k, qp, kp):
    kspan = rel.k_span
    qi, kj = int(qp[b, i]), int(kp[b, j])
    c2c = q[b, h, i] @ k[b, h, j]
    c2p = q[b, h, i] @ rel.k_rel[h, _deberta_delta(qi, kj, kspan)]
    p2c = k[b, h, j] @ rel.q_rel[h, _deberta_delta(kj, qi, kspan)]
    return float(c2c + c2p + p2c) / math.sqrt(3 * D)


LOGIT = {"shaw": _shaw_logit, "transformer_xl": _xl_logit, "deberta": _deberta_logit}


def _naive(kind, rel, q, k, v, qp, kp):
    """Causal attention (key position <= query position), one pair at a time."""
    B, _, Nq, _ = q.shape
    out = torch.zeros(B, H, Nq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Nq):
                seen = [j for j in range(k.shape[2]) if kp[b, j] <= qp[b, i]]
                logits = torch.tensor([LOGIT[kind](rel, b, h, i, j, q, k, qp, kp) for j in seen])
                alpha = torch.softmax(logits, dim=0)
                for a, j in zip(alpha, seen):
                    vj = _shaw_value(rel, b, i, j, v[b, h, j], qp, kp) if kind == "shaw" else v[b, h, j]
                    out[b, h, i] += a * vj
    return out


CASES = [("shaw", {"max_distance": 2}), ("transformer_xl", {}), ("transformer_xl", {"base": 7.0}),
         ("deberta", {"max_distance": 3})]


@pytest.mark.parametrize("impl", ["reference", "blockwise", "auto"])
@pytest.mark.parametrize("kind,params", CASES)
def test_relative_parts_equal_a_naive_loop(kind, params, impl):
    parts = _parts(kind, **params)
    g = torch.Generator().manual_seed(2)
    B, N = 2, 9
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(N).expand(B, N)
    with torch.no_grad():
        expected = _naive(kind, parts.relative, q, k, v, pos, pos)
        got = run_attention(parts, q, k, v, pos, pos, impl=impl)
    assert_close(got, expected, rtol=1e-6, atol=1e-6, name=f"{kind} {impl}")


@pytest.mark.parametrize("kind,params", CASES)
def test_relative_parts_equal_a_naive_loop_on_later_queries_and_shifted_positions(kind, params):
    """The last 3 queries against 8 keys (a cached step); the two rows hold the same q, k, v at positions
    offset by 5, so, every term depending on distances only, they give the same output."""
    parts = _parts(kind, **params)
    g = torch.Generator().manual_seed(3)
    B, Nk, Nq = 2, 8, 3
    q = torch.randn(1, H, Nq, D, generator=g, dtype=torch.float64).expand(B, -1, -1, -1)
    k, v = (torch.randn(1, H, Nk, D, generator=g, dtype=torch.float64).expand(B, -1, -1, -1) for _ in range(2))
    kp = torch.stack([torch.arange(Nk), torch.arange(Nk) + 5])
    qp = kp[:, -Nq:]
    with torch.no_grad():
        expected = _naive(kind, parts.relative, q, k, v, qp, kp)
        got = run_attention(parts, q, k, v, qp, kp, impl="reference")
    assert_close(got, expected, rtol=1e-6, atol=1e-6, name=kind)
    assert_close(got[1], got[0], rtol=1e-12, atol=1e-12, name=f"{kind} shifted row")
