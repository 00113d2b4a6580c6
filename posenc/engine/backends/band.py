"""``band``: multi-branch remaps whose regions are two distance bands split at one distance ``w`` (ReRoPE,
Leaky ReRoPE, SelfExtend, distance ceiling): each branch on the fused CPU flash kernel over only the keys
it covers, merged by the rows' log-sum-exp."""

from __future__ import annotations

import torch

from posenc.engine import toeplitz as kernel
from posenc.engine.backends.base import (
    FUSED_CPU,
    Backend,
    distance_profile,
    first_reason,
    fused_cpu_reason,
    position_run,
)
from posenc.engine.call import AttentionCall
from posenc.engine.scores import rotate_branch


class BandMerge(Backend):
    """Two branches split at one distance ``w``, nothing else in the scores, plain causal mask, positions
    ``0..Nk-1`` for keys and a contiguous run of them for queries (a full forward, a prefill, or one
    decode step), on CPU, at inference."""

    name = "band"
    dtypes = FUSED_CPU  # the fused CPU flash kernel

    def why_not(self, call: AttentionCall) -> str | None:
        parts = call.parts
        br = parts.branches
        reason = first_reason(
            (len(br) != 2 or br[0].kind != "near" or br[1].kind != "far" or br[0].window != br[1].window,
             "the remap is not a near/far split at one distance"),
            (parts.bias is not None, "a bias would need the remapped distance per piece"),
            (parts.relative is not None, "content-relative terms"),
            (parts.scheme.softcap is not None, "a soft-cap"),
            (call.q_gate is not None, "a forget gate's bias"),
            (not parts.mask.is_plain_causal, "the mask is not plain causal"),
            (parts.remap.restricts_keys, "the remap adds a mask"),
            (call.key_mask is not None, "padding keys break the positions-as-indices layout"),
            (call.needs_grad, "the in-place merge has no backward"),
        ) or fused_cpu_reason(call)
        if reason is None and position_run(call.q_pos, call.k_pos) is None:
            reason = "positions are not keys 0..Nk-1 with a contiguous run of queries in every row"
        return reason

    def run(self, call: AttentionCall):
        """Near branch (d < w) and far branch (d >= w) each computed by the fused CPU flash kernel on only
        the keys it covers (:func:`posenc.engine.toeplitz.toeplitz_attention` with a window, and with a
        minimum distance), merged by their rows' log-sum-exp ``l``:
        ``out = o_near + sigmoid(l_far - l_near) * (o_far - o_near)``. Nothing of size N x N is built;
        values are reversed once for both pieces."""
        parts, q = call.parts, call.q
        w = parts.branches[0].window
        near, far = (rotate_branch(call, br) for br in parts.branches)
        Nq = call.Nq
        q0 = int(call.q_pos[0, 0])
        vr = call.v.flip(2)  # key n at index Nk - 1 - n
        zeros = distance_profile(parts, q0 + Nq, q.device)  # no bias on this path: zeros
        o_near, l_near = kernel.toeplitz_attention(near.q, near.k.flip(2), vr, zeros, q_start=q0, window=w,
                                                   return_lse=True, reversed_keys=True)
        if q0 + Nq <= w:  # no query reaches the far branch
            return o_near
        o_far, l_far = kernel.toeplitz_attention(far.q, far.k.flip(2), vr, zeros, q_start=q0, min_distance=w,
                                                 return_lse=True, reversed_keys=True)
        # weights exp(l_i) / (exp(l_near) + exp(l_far)): the far one is sigmoid(l_far - l_near) (l_near is finite,
        # every row sees its own key; l_far = -inf gives 0), and one fused lerp merges in place
        w_far = torch.sigmoid(l_far - l_near)[..., None].to(o_near.dtype)  # [B,H,Nq] -> [B,H,Nq,1]
        return o_near.lerp_(o_far, w_far)
