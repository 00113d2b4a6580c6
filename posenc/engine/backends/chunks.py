"""``chunks``: remaps whose three branches are the query's own chunk, the previous chunk and every earlier
chunk (Dual Chunk Attention, :class:`posenc.parts.remap.DualChunk`): per query chunk, each branch on the
fused CPU flash kernel over only the keys it covers, merged by the rows' log-sum-exp. Memory linear in
the length: the largest piece is one chunk of queries against the keys before it."""

from __future__ import annotations

from posenc.engine import toeplitz as kernel
from posenc.engine.backends.base import FUSED_CPU, Backend, distance_profile, merged_pieces_reason
from posenc.engine.call import AttentionCall
from posenc.engine.pieces import flash_lse, lse_merge  # noqa: F401 - lse_merge: re-exported
from posenc.engine.rotation import rotate_queries, rotated_keys_once

CHUNK_KINDS = ("same_chunk", "previous_chunk", "earlier_chunks")


class ChunkMerge(Backend):
    """Three chunked branches (same / previous / earlier chunks), nothing else in the scores, plain causal
    mask, keys at positions ``0..Nk-1`` and a contiguous run of queries (a full forward, a prefill, one
    decode step), on CPU, at inference."""

    name = "chunks"
    dtypes = FUSED_CPU  # the fused CPU flash kernel

    def why_not(self, call: AttentionCall) -> str | None:
        br = call.parts.branches
        return merged_pieces_reason(
            call,
            (tuple(b.kind for b in br) != CHUNK_KINDS or len({b.window for b in br}) != 1,
             "the remap is not a same / previous / earlier chunk split"))

    def gqa(self, call: AttentionCall) -> bool:
        return call.k_axes is None

    def run(self, call: AttentionCall):
        """For the queries of chunk j (positions ``[j c, (j + 1) c)``): the same-chunk piece is causal
        attention over keys ``[j c, qp]`` (:func:`posenc.engine.toeplitz.toeplitz_attention` with a zero
        profile), the previous-chunk piece full attention over ``[(j - 1) c, j c)``, the earlier-chunks piece
        full attention over ``[0, (j - 1) c)``, each on the fused CPU flash kernel with its row log-sum-exp;
        :func:`lse_merge` joins them. Nothing of size N x N is built."""
        parts, q = call.parts, call.q
        c = parts.branches[0].window
        q0, Nq = call.q_run, call.Nq
        same_k, prev_k, early_k = rotated_keys_once(call, parts.branches)  # one rotation: they share kp mod c
        same_q, prev_q, early_q = (rotate_queries(call, br) for br in parts.branches)
        v = call.v
        out = q.new_empty(q.shape[0], q.shape[1], Nq, v.shape[-1])
        for j in range(q0 // c, (q0 + Nq - 1) // c + 1):
            a, b = max(q0, j * c), min(q0 + Nq, (j + 1) * c)  # query positions of chunk j in this call
            rows = slice(a - q0, b - q0)
            ks = j * c  # the chunk's first key
            zeros = distance_profile(parts, b - ks, q.device)
            pieces = [kernel.toeplitz_attention(same_q[:, :, rows], same_k[:, :, ks:b], v[:, :, ks:b], zeros,
                                                q_start=a - ks, return_lse=True)]
            if j >= 1:
                pieces.append(flash_lse(prev_q[:, :, rows], prev_k[:, :, ks - c:ks], v[:, :, ks - c:ks]))
            if j >= 2:
                pieces.append(flash_lse(early_q[:, :, rows], early_k[:, :, :ks - c], v[:, :, :ks - c]))
            out[:, :, rows] = pieces[0][0] if len(pieces) == 1 else lse_merge(pieces)
        return out
