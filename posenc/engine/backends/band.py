"""``band``: multi-branch remaps whose regions are two distance bands split at one distance ``w`` (ReRoPE,
Leaky ReRoPE, SelfExtend, distance ceiling): each branch on the fused CPU flash kernel over only the keys
it covers, merged by the rows' log-sum-exp."""

from __future__ import annotations

import torch

from posenc.engine import toeplitz as kernel
from posenc.engine.backends.base import FEW_QUERIES, FUSED_CPU, Backend, distance_profile, merged_pieces_reason
from posenc.engine.call import AttentionCall
from posenc.engine.pieces import flash_lse
from posenc.engine.rotation import rotate_branch, rotate_keys, rotate_queries


class BandMerge(Backend):
    """Two branches split at one distance ``w``, nothing else in the scores, plain causal mask, positions
    ``0..Nk-1`` for keys and a contiguous run of them for queries (a full forward, a prefill, or one
    decode step), on CPU, at inference."""

    name = "band"
    dtypes = FUSED_CPU  # the fused CPU flash kernel

    def why_not(self, call: AttentionCall) -> str | None:
        br = call.parts.branches
        return merged_pieces_reason(
            call,
            (len(br) != 2 or br[0].kind != "near" or br[1].kind != "far" or br[0].window != br[1].window,
             "the remap is not a near/far split at one distance"),
            (call.q_gate is not None, "a forget gate's bias"))

    def gqa(self, call: AttentionCall) -> bool:
        return call.k_axes is None

    def run(self, call: AttentionCall):
        """Near branch (d < w) and far branch (d >= w) each computed by the fused CPU flash kernel on only
        the keys it covers (:func:`posenc.engine.toeplitz.toeplitz_attention` with a window, and with a
        minimum distance), merged by their rows' log-sum-exp ``l``:
        ``out = o_near + sigmoid(l_far - l_near) * (o_far - o_near)``. Nothing of size N x N is built;
        values are reversed once for both pieces. A few queries (a decode step) take :func:`few_queries`."""
        if call.Nq < FEW_QUERIES:
            return few_queries(call)
        parts, q = call.parts, call.q
        w = parts.branches[0].window
        near, far = (rotate_branch(call, br) for br in parts.branches)
        Nq = call.Nq
        q0 = call.q_run
        vr = call.v.flip(2)  # key n at index Nk - 1 - n
        zeros = distance_profile(parts, q0 + Nq, q.device)  # no bias on this path: zeros
        o_near, l_near = kernel.toeplitz_attention(near.q, near.k.flip(2), vr, zeros, q_start=q0, window=w,
                                                   return_lse=True, reversed_keys=True)
        if q0 + Nq <= w:  # no query reaches the far branch
            return o_near
        o_far, l_far = kernel.toeplitz_attention(far.q, far.k.flip(2), vr, zeros, q_start=q0, min_distance=w,
                                                 return_lse=True, reversed_keys=True)
        return merge_two(o_near, l_near, o_far, l_far)


def merge_two(o_near, l_near, o_far, l_far):
    """The softmax over the union of two pieces' keys from each piece's output and rows' log-sum-exp, when
    every row sees a key of the first piece (its own): weights ``exp(l_i) / (exp(l_near) + exp(l_far))``, the
    far one ``sigmoid(l_far - l_near)`` (0 where ``l_far = -inf``: that row's far output is never read)."""
    w_far = torch.sigmoid(l_far - l_near)[..., None].to(o_near.dtype)  # [B,H,Nq] -> [B,H,Nq,1]
    o_far = torch.where(w_far > 0, o_far, torch.zeros_like(o_far))  # a row without far keys may hold NaN
    return o_near.lerp_(o_far, w_far)


def few_queries(call: AttentionCall):
    """A few queries at ``q0 .. q0+Nq-1`` (a decode step): the near piece reads (and rotates) only the keys
    ``[q0 - w + 1, q0 + Nq)``, the far piece the keys ``[0, q0 + Nq - w)``, each straight from the cache (no
    reversed copy) with a mask only for more than one query, and the pieces merge by log-sum-exp."""
    parts = call.parts
    near_br, far_br = parts.branches
    w = near_br.window
    q0, Nq = call.q_run, call.Nq
    end = q0 + Nq
    lo = max(0, q0 - w + 1)
    qp = call.q_pos[:1, None, :, None]  # [1,1,Nq,1]; every row alike (position_run)
    kp = torch.arange(call.Nk, device=call.q.device)[None, None, None, :]  # keys at their indices

    def mask(a: int, b: int, region):
        return None if Nq == 1 else region(qp, kp[..., a:b])  # [1,1,Nq,b-a] bool

    o_near, l_near = flash_lse(rotate_queries(call, near_br), rotate_keys(call, near_br, lo, end),
                               call.v[:, :, lo:end], mask(lo, end, lambda a, b: (a >= b) & (a - b < w)))
    if end - w <= 0:  # no query reaches the far branch
        return o_near
    o_far, l_far = flash_lse(rotate_queries(call, far_br), rotate_keys(call, far_br, 0, end - w),
                             call.v[:, :, :end - w], mask(0, end - w, lambda a, b: a - b >= w))
    return merge_two(o_near, l_near, o_far, l_far)
