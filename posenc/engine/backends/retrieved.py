"""``retrieved``: a near/far split whose far branch sees only the keys the remap retrieves by content
(InfLLM's block retrieval, :class:`posenc.parts.retrieval.BlockRetrieval`). The near band runs on the fused
CPU flash kernel over its window; the far piece, per query tile, over only the keys some query of the tile
retrieved, with each query's own choice as the mask; the two merge by the rows' log-sum-exp. Cost per query:
the window plus the tile's retrieved blocks, where :mod:`~posenc.engine.backends.blockwise` scores every far
key; memory: one tile against those keys."""

from __future__ import annotations

import torch

from posenc.engine import toeplitz as kernel
from posenc.engine.backends.band import FEW_QUERIES, merge_two
from posenc.engine.backends.base import FUSED_CPU, Backend, distance_profile, merged_pieces_reason
from posenc.engine.call import AttentionCall
from posenc.engine.pieces import flash_lse
from posenc.engine.rotation import rotate_keys, rotate_queries
from posenc.engine.scores import content_keys


class Retrieved(Backend):
    """Two branches split at one distance ``w`` (near at true distance, far at the remap's far rotation),
    a remap that chooses keys by content but never hides a key nearer than ``w``
    (:attr:`~posenc.parts.branches.Remap.selects_far_only`), nothing else in the scores, plain causal mask,
    keys at positions ``0..Nk-1`` and a contiguous run of queries, on CPU, at inference."""

    name = "retrieved"
    dtypes = FUSED_CPU  # the fused CPU flash kernel
    content_selection = True
    tile = 256  # query rows per far piece: the union of their retrieved keys is what the tile pays for

    def why_not(self, call: AttentionCall) -> str | None:
        remap, br = call.parts.remap, call.parts.branches
        return merged_pieces_reason(
            call,
            (not remap.reads_content or not remap.selects_far_only,
             "the remap does not choose only among the far keys by content"),
            (len(br) != 2 or br[0].kind != "near" or br[1].kind != "far" or br[0].window != br[1].window,
             "the remap is not a near/far split at one distance"),
            (call.q_gate is not None, "a forget gate's bias"))

    def gqa(self, call: AttentionCall) -> bool:
        return call.k_axes is None  # the kernels and the block representatives read grouped keys as they are

    def run(self, call: AttentionCall):
        """``merge_two(near, far)``: the near piece is every key at distance ``d < w`` (the fused kernel with
        a window, or for a few queries a key slice); the far piece, for each tile of queries, the keys at
        ``d >= w`` that :meth:`~posenc.parts.branches.Remap.select` keeps for some query of the tile, each
        query masked to its own choice (:func:`posenc.engine.pieces.flash_lse`). The remap's key summary
        (InfLLM's block representatives) is computed once per call."""
        near_br, far_br = call.parts.branches
        w = near_br.window
        o_near, l_near = _near_piece(call, near_br, w)
        q0, Nq = call.q_run, call.Nq
        first = max(0, w - q0)  # queries before it have no key at distance >= w
        if first >= Nq:
            return o_near
        fq, fk = rotate_queries(call, far_br), rotate_keys(call, far_br)
        o_far = torch.zeros_like(o_near)
        l_far = torch.full(l_near.shape, float("-inf"), dtype=l_near.dtype, device=l_near.device)
        for s in range(first, Nq, self.tile):
            e = min(Nq, s + self.tile)
            qp_t = call.q_pos[:, s:e]
            n = q0 + e - w  # the tile's far keys are keys 0..n-1 (keys at their indices)
            idx, chosen = content_keys(call, call.q[:, :, s:e], qp_t, n)
            if idx is not None and idx.numel() == 0:
                continue
            kp = call.k_pos[:, :n] if idx is None else call.k_pos.index_select(1, idx)
            far = chosen & (kp[:, None, None, :] <= (qp_t - w)[:, None, :, None])  # d >= w
            k_t = fk[:, :, :n] if idx is None else fk.index_select(2, idx)
            v_t = call.v[:, :, :n] if idx is None else call.v.index_select(2, idx)
            o_far[:, :, s:e], l_far[:, :, s:e] = flash_lse(fq[:, :, s:e], k_t, v_t, far)
        return merge_two(o_near, l_near, o_far, l_far)


def _near_piece(call: AttentionCall, near_br, w: int):
    """``(out, lse)`` of every query against its keys at distance ``0 <= d < w``, at true distance: the fused
    kernel with a window over the whole call, or for fewer than ``FEW_QUERIES`` queries (a decode step) the
    flash kernel on the window's key slice."""
    q0, Nq = call.q_run, call.Nq
    if Nq >= FEW_QUERIES:
        zeros = distance_profile(call.parts, q0 + Nq, call.q.device)  # no bias on this path: zeros
        nq, nk = rotate_queries(call, near_br), rotate_keys(call, near_br)
        return kernel.toeplitz_attention(nq, nk.flip(2), call.v.flip(2), zeros, q_start=q0, window=w,
                                         return_lse=True, reversed_keys=True)
    lo, end = max(0, q0 - w + 1), q0 + Nq
    mask = None
    if Nq > 1:
        qp = call.q_pos[:1, None, :, None]
        kp = torch.arange(lo, end, device=call.q.device)[None, None, None, :]
        mask = (qp >= kp) & (qp - kp < w)
    return flash_lse(rotate_queries(call, near_br), rotate_keys(call, near_br, lo, end), call.v[:, :, lo:end], mask)
