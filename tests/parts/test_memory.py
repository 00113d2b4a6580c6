"""Infini-attention's compressive memory (posenc.parts.memory), segment by segment, against the paper's formulas
written as scalar loops (Munkhdalai et al. 2024, arXiv 2404.07143, sec. 2.1):

    sigma(x) = ELU(x) + 1
    A_mem    = sigma(Q) M_{s-1} / (sigma(Q) z_{s-1})                                   (eq. 3)
    linear:  M_s = M_{s-1} + sigma(K)^T V,  z_s = z_{s-1} + sum_t sigma(K_t)            (eq. 4)
    delta:   M_s = M_{s-1} + sigma(K)^T (V - sigma(K) M_{s-1} / (sigma(K) z_{s-1}))     (eq. 5)
    A        = sigmoid(beta) A_mem + (1 - sigmoid(beta)) A_dot                          (eq. 6)

M_0 = 0, z_0 = 0, and on the first segment A_mem = 0 (posenc's convention for the empty memory, where
eq. 3 is 0/0; the delta rule's retrieval is then 0 too). The local attention A_dot is replaced by a
recording stub, so these tests see the memory alone. Through the engine: one segment is gated softmax, the
memory carries across segments, padding, a cache or a context are refused."""

import math

import pytest
import torch

from posenc import PositionalAttention, PositionScheme, attention
from posenc._util import assert_close
from posenc.parts.memory import InfiniMemory

torch.manual_seed(0)


def test_infini_single_segment_is_gated_softmax():
    s = PositionScheme.preset("infini", train_len=64, segment_len=64)
    m = PositionalAttention(32, 4, s)
    with torch.no_grad():
        m.memory.beta.copy_(torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    x = torch.randn(2, 40, 32)
    out = m(x, impl="reference")
    q, k, v = m.project(x)
    dot = attention(q, k, v, PositionScheme.preset("rope", train_len=64), impl="reference")
    gate = torch.sigmoid(m.memory.beta)[None, :, None, None]
    ref = m.o_proj(((1 - gate) * dot).transpose(1, 2).reshape(2, 40, 32))
    assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_infini_memory_carries_across_segments():
    s = PositionScheme.preset("infini", train_len=64, segment_len=8)
    m = PositionalAttention(32, 4, s)
    with torch.no_grad():
        m.memory.beta.fill_(3.0)
    x = torch.randn(1, 24, 32)
    x2 = x.clone()
    x2[:, :4] += 1.0  # change the first segment only
    a, b = m(x), m(x2)
    assert not torch.allclose(a[:, 8:], b[:, 8:])  # later segments see the first through memory


def test_infini_refuses_padding_cache_and_context():
    """The compressive memory folds every token into its state: padding, a cache or a context would be read
    wrongly, so each is refused by name; an all-True key mask is no padding and runs."""
    m = PositionalAttention(32, 4, PositionScheme.preset("infini", train_len=64, segment_len=8))
    x = torch.randn(2, 16, 32)
    mask = torch.ones(2, 16, dtype=torch.bool)
    assert_close(m(x, key_mask=mask), m(x))
    mask[0, :3] = False
    with pytest.raises(ValueError, match="infini.*padding"):
        m(x, key_mask=mask)
    with pytest.raises(ValueError, match="no KV cache or context"):
        m(x, context=(torch.zeros(2, 4, 4, 8), torch.zeros(2, 4, 4, 8), torch.zeros(2, 4, dtype=torch.long)))

B, H, D = 2, 2, 3


def _sigma(x: float) -> float:
    return math.exp(x) if x < 0 else x + 1.0


def _naive(q, k, v, beta, seg, a_dot, delta_rule):
    """The formulas above, one scalar at a time. q, k, v [B,H,N,D] float64, a_dot [B,H,N,D]."""
    N = q.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            g = 1.0 / (1.0 + math.exp(-float(beta[h])))
            M = [[0.0] * D for _ in range(D)]
            z = [0.0] * D
            for s in range(0, N, seg):
                ts = range(s, min(N, s + seg))
                sq = {t: [_sigma(float(q[b, h, t, d])) for d in range(D)] for t in ts}
                sk = {t: [_sigma(float(k[b, h, t, d])) for d in range(D)] for t in ts}
                for t in ts:
                    for e in range(D):
                        a_mem = 0.0 if s == 0 else (sum(sq[t][d] * M[d][e] for d in range(D))
                                                    / sum(sq[t][d] * z[d] for d in range(D)))
                        out[b, h, t, e] = g * a_mem + (1 - g) * a_dot[b, h, t, e]
                target = {t: [float(v[b, h, t, e]) for e in range(D)] for t in ts}
                if delta_rule and s > 0:
                    for t in ts:
                        den = sum(sk[t][d] * z[d] for d in range(D))
                        for e in range(D):
                            target[t][e] -= sum(sk[t][d] * M[d][e] for d in range(D)) / den
                M = [[M[d][e] + sum(sk[t][d] * target[t][e] for t in ts) for e in range(D)] for d in range(D)]
                z = [z[d] + sum(sk[t][d] for t in ts) for d in range(D)]
    return out


def _stub(calls):
    """A stand-in for the scheme's local attention: a fixed function of its inputs, calls recorded."""
    def local(qs, ks, vs, qp, kp):
        calls.append((qs.shape[2], qp.clone(), kp.clone()))
        return vs.flip(-1) * 0.5 + qp[:, None, :, None].to(vs.dtype)

    return local


def _inputs(N, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) * 1.5 for _ in range(3))
    return q, k, v


@pytest.mark.parametrize("delta_rule", [False, True])
@pytest.mark.parametrize("N,seg", [(10, 3), (6, 2), (4, 4), (1, 3)])
def test_infini_memory_update_equals_the_paper_by_hand(N, seg, delta_rule):
    mem = InfiniMemory(H, D, segment_len=seg, delta_rule=delta_rule).double()
    with torch.no_grad():
        mem.beta.copy_(torch.tensor([0.7, -1.3]))
    q, k, v = _inputs(N, seed=N + seg)
    pos = torch.arange(N).expand(B, N) + torch.tensor([[0], [4]])
    calls = []
    with torch.no_grad():
        got = mem(q, k, v, pos, _stub(calls))
    a_dot = v.flip(-1) * 0.5 + pos[:, None, :, None].double()
    assert_close(got, _naive(q, k, v, mem.beta.detach(), seg, a_dot, delta_rule), rtol=1e-12, atol=1e-12)
    # local attention runs once per segment, on that segment's queries and keys at their own positions
    starts = list(range(0, N, seg))
    assert [c[0] for c in calls] == [min(N, s + seg) - s for s in starts]
    for (_, qp, kp), s in zip(calls, starts):
        assert torch.equal(qp, pos[:, s:s + seg]) and torch.equal(kp, qp)


def test_delta_rule_differs_from_linear_only_after_the_second_segment():
    """Segment 1 writes the same memory under both rules; segment 2 reads it (equal outputs) and then
    writes differently, so segment 3 is the first whose output differs."""
    q, k, v = _inputs(9, seed=5)
    pos = torch.arange(9).expand(B, 9)
    outs = []
    for rule in (False, True):
        mem = InfiniMemory(H, D, segment_len=3, delta_rule=rule).double()
        with torch.no_grad():
            mem.beta.fill_(0.4)
            outs.append(mem(q, k, v, pos, _stub([])))
    assert torch.equal(outs[0][:, :, :6], outs[1][:, :, :6])
    assert (outs[0][:, :, 6:] - outs[1][:, :, 6:]).abs().min() > 1e-6


def test_delta_rule_does_not_rewrite_a_stored_association():
    """Eq. 5's point: writing a value the memory already retrieves for that key changes nothing. Segment 2
    repeats segment 1's single key with the value the memory returns for it, so M and z differ from a
    linear update's but the delta rule leaves M unchanged, and segment 3 (the same key as a query)
    retrieves segment 1's value under the delta rule."""
    k1 = torch.tensor([0.3, -0.2, 1.1], dtype=torch.float64)
    v1 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    x = torch.stack([k1, k1, k1])[None, None].expand(B, H, 3, D).contiguous()
    v = torch.stack([v1, v1, torch.zeros(D, dtype=torch.float64)])[None, None].expand(B, H, 3, D).contiguous()
    pos = torch.arange(3).expand(B, 3)
    mem = InfiniMemory(H, D, segment_len=1, delta_rule=True).double()
    with torch.no_grad():
        mem.beta.fill_(50.0)  # gate ~1: the output is A_mem
        out = mem(x, x, v, pos, lambda qs, ks, vs, qp, kp: torch.zeros_like(vs))
    # M_1 = sigma(k1)^T v1, z_1 = sigma(k1): retrieving k1 gives v1 exactly; segment 2 writes
    # v1 - v1 = 0 to M (z still grows), so segment 3 retrieves sigma(k1).M / (sigma(k1).z_2) = v1 / 2
    assert_close(out[:, :, 1], v1.expand(B, H, D), rtol=1e-12, atol=1e-12)
    assert_close(out[:, :, 2], (v1 / 2).expand(B, H, D), rtol=1e-12, atol=1e-12)


def test_infini_expands_grouped_keys_and_values():
    mem = InfiniMemory(H, D, segment_len=2).double()
    q, k, v = _inputs(5, seed=9)
    k1, v1 = k[:, :1], v[:, :1]
    pos = torch.arange(5).expand(B, 5)
    with torch.no_grad():
        grouped = mem(q, k1, v1, pos, _stub([]))
        full = mem(q, k1.expand(B, H, 5, D), v1.expand(B, H, 5, D), pos, _stub([]))
    assert torch.equal(grouped, full)
