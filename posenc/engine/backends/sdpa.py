"""``sdpa``: single-branch schemes; rotate once, then PyTorch's fused ``scaled_dot_product_attention``
with the bias and mask as one additive mask (or its own ``is_causal``, which needs no mask at all), on the
key heads as they are (GQA, :mod:`posenc.engine.pieces`). The training path."""

from __future__ import annotations

import torch

from posenc.engine.backends.base import Backend, first_reason
from posenc.engine.call import AttentionCall, memo_positions
from posenc.engine.parts import AttentionParts
from posenc.engine.pieces import flash_lse, key_span, lse_merge, sdpa_gqa
from posenc.engine.rotation import rotate_keys, rotate_queries
from posenc.engine.scores import head_index

SDPA_MASK_ELEMENTS = 1 << 26  # largest materialised additive mask the auto choice accepts (256 MB fp32)


def needs_no_mask(parts: AttentionParts) -> bool:
    """No bias, a plain causal mask and no remap mask: SDPA's own ``is_causal`` may do (positions allowing)."""
    return parts.bias is None and parts.mask.is_plain_causal and not parts.remap.restricts_keys


class Sdpa(Backend):
    name = "sdpa"

    def why_not(self, call: AttentionCall) -> str | None:
        parts = call.parts
        return first_reason(
            (not parts.single_branch, f"the remap has {len(parts.branches)} branches (one rotation per call)"),
            (parts.relative is not None, "content-relative terms are not one additive mask"),
            (parts.scheme.softcap is not None, "SDPA cannot soft-cap the logits"))

    def gqa(self, call: AttentionCall) -> bool:
        return call.k_axes is None  # multi-axis RoPE may rotate keys per query head

    def run(self, call: AttentionCall):
        """Rotate once (only the keys the mask's intervals can reach, when keys sit at their indices), then
        fused SDPA on the key heads as they are (GQA): its own causal mask when positions are the indices up
        to a shift, no mask when every query sees every key it reads (a decode step), else one mask."""
        parts, key_mask = call.parts, call.key_mask
        br = parts.branches[0]
        rq = rotate_queries(call, br)
        if _plain_square(call):  # positions are the indices (up to a shift): SDPA's own causal mask is the same mask
            return sdpa_gqa(rq, rotate_keys(call, br), call.v, is_causal=True)
        lo, hi = key_span(call)
        if hi <= lo:  # no query sees any key
            return rq.new_zeros(call.B, call.H, call.Nq, call.v.shape[-1])
        rk, v, k_pos = rotate_keys(call, br, lo, hi), call.v[:, :, lo:hi], call.k_pos[:, lo:hi]
        key_mask = None if key_mask is None else key_mask[:, lo:hi]
        q0 = call.q_run
        if (needs_no_mask(parts) and call.q_gate is None and key_mask is None and q0 is not None
                and q0 >= hi - 1):  # every key read is at or before the first query: all visible
            return sdpa_gqa(rq, rk, v)
        if _causal_tail(call, lo, hi):
            return _prefix_and_square(rq, rk, v, q0 - lo)
        q_pos = call.q_pos
        if key_mask is None and call.q_gate is None and q_pos.shape[0] > 1 and bool(
                (q_pos == q_pos[:1]).all() and (k_pos == k_pos[:1]).all()):
            q_pos, k_pos = q_pos[:1], k_pos[:1]  # every row alike: one [1,H,Nq,Nk] mask, broadcast over the batch
        qp, kp = q_pos[:, None, :, None], k_pos[:, None, None, :]
        allowed = parts.allowed(qp, kp)  # [B,1,Nq,Nk]
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]
        bias = None
        if parts.bias is not None:
            bias = parts.bias.score(head_index(parts, call.q.device), parts.bias_query_pos(qp, kp), kp).to(call.q.dtype)
        gate = call.gate_bias(qp, kp)  # FoX: data of each row, [B,H,Nq,Nk] (never with a key slice: key_span)
        if gate is not None:
            bias = gate.to(call.q.dtype) if bias is None else bias + gate.to(call.q.dtype)
        mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))  # [B,H|1,Nq,Nk]
        out = sdpa_gqa(rq, rk, v, mask)
        if not bool(allowed.any(dim=-1).all()):
            out = torch.nan_to_num(out, nan=0.0)
        return out


def _causal_tail(call: AttentionCall, lo: int, hi: int) -> bool:
    """A plain causal call without autograd whose queries are the positions of its last ``Nq`` keys (keys at their
    indices ``lo .. hi-1``, queries at ``hi-Nq .. hi-1``) and some keys come before the first query: a dynamic
    schedule's query group (``posenc.engine.dispatch.run_backend`` cuts its keys after its last query), or a chunk
    of a chunked prefill after the cache."""
    q0 = call.q_run
    return (needs_no_mask(call.parts) and call.q_gate is None and call.key_mask is None and not call.needs_grad
            and q0 is not None and call.keys_are_indices and lo < q0 and hi == q0 + call.Nq)


_TRIANGLES: dict = {}  # (n, device) -> bool [1,1,n,n] lower triangle, the most recent few kept


def _prefix_and_square(rq: torch.Tensor, rk: torch.Tensor, v: torch.Tensor, n_before: int) -> torch.Tensor:
    """Causal attention of ``Nq`` queries over keys whose first ``n_before`` all come before the first query and
    whose last ``Nq`` sit at the queries' own positions, as two fused calls merged by log-sum-exp: the keys before
    with no mask, the square with its lower triangle (``Nq x Nq``). The one-call form needs an ``Nq x Nk`` mask,
    built, checked and read per call (a 512-query group at 32k: 16M entries)."""
    Nq = rq.shape[2]
    key = (Nq, str(rq.device))
    tri = _TRIANGLES.get(key)
    if tri is None:
        if len(_TRIANGLES) >= 4:
            _TRIANGLES.pop(next(iter(_TRIANGLES)))
        tri = _TRIANGLES[key] = torch.ones(Nq, Nq, dtype=torch.bool, device=rq.device).tril()[None, None]
    before = flash_lse(rq, rk[:, :, :n_before], v[:, :, :n_before])
    square = flash_lse(rq, rk[:, :, n_before:], v[:, :, n_before:], tri)
    return lse_merge([before, square])


def _plain_square(call: AttentionCall) -> bool:
    """A plain causal call whose query and key positions are the same run ``p0 .. p0+N-1`` in every row."""
    if not (needs_no_mask(call.parts) and call.q_gate is None and call.key_mask is None and call.Nq == call.Nk):
        return False
    q_pos, k_pos = call.q_pos, call.k_pos

    def compute() -> bool:
        return bool((q_pos == k_pos).all()) and bool(
            (q_pos == torch.arange(call.Nq, device=q_pos.device)[None] + q_pos[:, :1]).all())
    return memo_positions("square", (q_pos, k_pos), compute)
