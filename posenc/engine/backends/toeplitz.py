"""``toeplitz``: a bias that depends only on the distance (ALiBi, KERPLE, T5, Sandwich) and/or a causal
sliding window, on the fused CPU flash kernel with the bias as an O(N) strided view
(:mod:`posenc.engine.toeplitz`): no N x N bias in memory and no compiled kernel, which is why ``auto``
prefers it to a materialised SDPA mask or compiled flex (measurements: ``docs/results/performance.md``,
``benchmarks/``)."""

from __future__ import annotations

from posenc.engine import toeplitz as kernel
from posenc.engine.backends.base import (
    FUSED_CPU,
    Backend,
    distance_profile,
    first_reason,
    fixed_distance_bias,
    fused_reason,
)
from posenc.engine.call import AttentionCall
from posenc.engine.scores import rotate_branch

TOEPLITZ_MIN_QUERIES = 64  # below this (decode steps) a materialised [B,H,Nq,Nk] mask is as cheap


class Toeplitz(Backend):
    """One branch, a bias (if any) that depends only on the distance (``translation_invariant``) and needs no
    gradient, a causal mask with at most a sliding window (no sinks, no blocks), nothing else in the
    scores, contiguous positions (:func:`~posenc.engine.backends.base.position_run`), on CPU. Gradients
    reach q, k and v through the flash kernel's backward (ALiBi training). Plain causal attention without a
    bias is SDPA's."""

    name = "toeplitz"
    dtypes = FUSED_CPU  # the fused CPU flash kernel

    def why_not(self, call: AttentionCall) -> str | None:
        parts = call.parts
        mask = parts.mask
        reason = first_reason(
            (not parts.single_branch, f"the remap has {len(parts.branches)} branches"),
            (parts.relative is not None, "content-relative terms are not a distance profile"),
            (parts.scheme.softcap is not None, "a soft-cap is not a distance profile"),
            (call.q_gate is not None, "a forget gate's bias depends on the tokens, not only the distance"),
            (parts.remap.restricts_keys, "the remap adds a mask"),
            (parts.remap.remaps_distance, "the remap changes the distance the bias sees"),
            (not mask.causal, "the mask is not causal"),
            (bool(mask.n_sinks), "attention sinks are not a distance profile"),
            (mask.block is not None, "a block mask is not a distance profile"),
            (mask.chunk is not None, "a chunk mask is not a distance profile"),
            (call.key_mask is not None, "padding keys break the positions-as-indices layout"),
        ) or fused_reason(call) or first_reason(
            (parts.bias is None and mask.window is None, "no bias and no window: plain causal is SDPA's"),
            # (a learned table's gradient would have to flow through the strided view)
            (not fixed_distance_bias(parts), "the bias is not a fixed function of the distance"))
        if reason is None and call.q_run is None:
            reason = "positions are not keys 0..Nk-1 with a contiguous run of queries in every row"
        return reason

    def gqa(self, call: AttentionCall) -> bool:
        return call.k_axes is None

    def run(self, call: AttentionCall):
        """Rotate once, then :func:`posenc.engine.toeplitz.toeplitz_attention`: the bias's distance profile
        (and the window) as a strided O(N) view read by the fused CPU flash kernel."""
        rot = rotate_branch(call, call.parts.branches[0])
        q0 = call.q_run
        window = call.parts.mask.window
        reach = q0 + call.Nq if window is None else min(window, q0 + call.Nq)
        return kernel.toeplitz_attention(rot.q, rot.k, call.v, distance_profile(call.parts, reach, call.q.device),
                                         q_start=q0, window=window)
