"""``sinks``: attention sinks + a causal window (StreamingLLM, LM-Infinite, a window under a ReRoPE-like
remap): the window piece on the Toeplitz kernel, the few sink keys scored like ``reference``, the two
merged by log-sum-exp."""

from __future__ import annotations

import torch

from posenc.engine import toeplitz as kernel
from posenc.engine.backends.base import (
    FEW_QUERIES,
    FUSED_CPU,
    Backend,
    distance_profile,
    first_reason,
    fixed_distance_bias,
    fused_reason,
)
from posenc.engine.call import AttentionCall
from posenc.engine.parts import AttentionParts
from posenc.engine.pieces import flash_lse
from posenc.engine.rotation import rotate_keys, rotate_queries
from posenc.engine.scores import scores_tile


def window_branch(parts: AttentionParts, q0: int, Nq: int) -> int | None:
    """Index of a branch whose region holds every pair of the window piece (``max(s, m - w + 1) <= n <= m``
    for the queries ``q0..q0+Nq-1``), or None. Evaluated on that band once per shape and memoised:
    regions are arbitrary elementwise functions, so this is checked, not assumed."""
    key = (q0, Nq)
    memo = parts.__dict__.setdefault("_window_branch_memo", {})
    if key not in memo:
        s, w = parts.mask.n_sinks, parts.mask.window
        rows = max(1, (1 << 22) // w)  # band evaluated in blocks of ~4M pairs

        def holds(region) -> bool:
            for a in range(q0, q0 + Nq, rows):
                qp = torch.arange(a, min(q0 + Nq, a + rows), device="cpu")[:, None]  # [r,1], checked on the CPU
                kp = qp - torch.arange(w, device="cpu")[None]  # [r,w] the band, d = 0..w-1
                if not bool((region(qp, kp) | (kp < s)).all()):
                    return False
            return True

        found = next((i for i, br in enumerate(parts.branches) if br.region is None or holds(br.region)), None)
        if len(memo) > 64:
            memo.clear()
        memo[key] = found
    return memo[key]


class SinksWindow(Backend):
    """A causal window (with or without attention sinks) whose window pairs all fall in one branch
    (StreamingLLM's re-indexing, LM-Infinite's distance ceiling, a window under a ReRoPE-like remap),
    a distance-only bias or none, nothing else in the scores, contiguous positions, inference on CPU.
    The window piece runs on the Toeplitz kernel, the sinks piece (n_sinks keys) is materialised."""

    name = "sinks"
    dtypes = FUSED_CPU  # the fused CPU flash kernel

    def why_not(self, call: AttentionCall) -> str | None:
        parts = call.parts
        mask, bias = parts.mask, parts.bias
        reason = first_reason(
            (mask.window is None, "no sliding window"),
            (not mask.causal, "the mask is not causal"),
            (mask.block is not None, "a block mask"),
            (mask.chunk is not None, "a chunk mask"),
            (parts.relative is not None, "content-relative terms"),
            (parts.scheme.softcap is not None, "a soft-cap"),
            (call.q_gate is not None, "a forget gate's bias depends on the tokens, not only the distance"),
            (parts.remap.restricts_keys, "the remap adds a mask"),
            (call.key_mask is not None, "padding keys break the positions-as-indices layout"),
            (call.needs_grad, "inference only"),
        ) or fused_reason(call) or first_reason(
            (not fixed_distance_bias(parts), "the bias is not a fixed function of the distance"),
            (bias is not None and parts.remap.remaps_distance, "the remap changes the distance the bias sees"))
        if reason is not None:
            return reason
        q0 = call.q_run
        if q0 is None:
            return "positions are not keys 0..Nk-1 with a contiguous run of queries in every row"
        if window_branch(parts, q0, call.Nq) is None:
            return "the window's pairs are not all in one branch"
        return None

    def gqa(self, call: AttentionCall) -> bool:
        return call.k_axes is None

    def run(self, call: AttentionCall):
        """Window piece (keys ``>= n_sinks`` within the window, one branch, Toeplitz kernel; only the keys from
        the first one a query reads are rotated and passed) and sinks piece (keys ``< n_sinks``, any branch
        mix, scored like the reference path), merged by log-sum-exp:
        ``out = o_win + exp(l_sink - logaddexp(l_win, l_sink)) * (o_sink - o_win)``."""
        parts, q, v = call.parts, call.q, call.v
        s, w = parts.mask.n_sinks, parts.mask.window
        Nq = call.Nq
        q0 = call.q_run
        br = parts.branches[window_branch(parts, q0, Nq)]
        first = min(max(s, q0 - w + 1), q0)  # the first key any query reads in the window piece
        if Nq < FEW_QUERIES and parts.bias is None and q0 >= s:
            o_win, l_win = few_queries(call, br, first)
        else:
            profile = distance_profile(parts, min(w, q0 + Nq), q.device)
            o_win, l_win = kernel.toeplitz_attention(rotate_queries(call, br), rotate_keys(call, br, first),
                                                     v[:, :, first:], profile, q_start=q0, window=w, key_start=s,
                                                     return_lse=True, key_offset=first)
        ks = min(s, call.Nk)
        if ks == 0:
            return o_win
        sinks = call.key_prefix(ks).expanded()  # the few sink keys, repeated to the query heads
        scores = scores_tile(sinks)  # [B,H,Nq,ks]
        allowed = parts.allowed(call.q_pos[:, None, :, None], sinks.k_pos[:, None, None, :])
        scores = scores.float().masked_fill(~allowed, float("-inf"))
        l_sink = torch.logsumexp(scores, dim=-1)  # [B,H,Nq]; -inf where no sink is visible
        probs = torch.nan_to_num(torch.exp(scores - l_sink[..., None]), nan=0.0)
        o_sink = probs.to(v.dtype) @ sinks.v
        total = torch.logaddexp(l_win, l_sink)  # every query sees itself in one of the pieces: finite
        w_sink = torch.exp(l_sink - total)[..., None].to(o_win.dtype)  # rows before n_sinks: l_win = -inf, w = 1
        return o_win.lerp_(o_sink.to(o_win.dtype), w_sink)


def few_queries(call: AttentionCall, br, first: int):
    """The window piece of a few queries at ``q0 ..`` (a decode step, every query past the sinks): the fused kernel
    straight on the cache's keys ``[first, q0 + Nq)`` (rotated through the call's key store when it has one), with
    a mask only for more than one query; no reversed copy of the window's keys and values, which the Toeplitz
    kernel makes. ``(out, lse)``."""
    s, w = call.parts.mask.n_sinks, call.parts.mask.window
    q0, Nq = call.q_run, call.Nq
    end = q0 + Nq
    mask = None
    if Nq > 1:
        qp = call.q_pos[:1, None, :, None]  # [1,1,Nq,1]; every row alike (position_run)
        kp = torch.arange(first, end, device=call.q.device)[None, None, None, :]
        mask = (kp <= qp) & (qp - kp < w) & (kp >= s)
    return flash_lse(rotate_queries(call, br), rotate_keys(call, br, first, end), call.v[:, :, first:end], mask)
