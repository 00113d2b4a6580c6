"""``blockwise``: the reference's computation tiled over queries. For each query tile only the key
blocks the mask allows are gathered, and each remap branch is evaluated only on the key columns its
region touches (boundary columns twice). Memory O(tile x keys visible), never N x N. Runs every call."""

from __future__ import annotations

import torch

from posenc.engine.backends.base import Backend
from posenc.engine.call import AttentionCall
from posenc.engine.scores import content_keys, finish, head_index, rotate_branch, softcap


def candidate_keys(key_intervals, qp_t, k_pos, keys_sorted: bool) -> torch.Tensor | None:
    """Indices of the keys a query tile may see according to ``key_intervals(q_lo, q_hi)`` (a mask's
    :meth:`~posenc.parts.masks.MaskSpec.key_intervals`), sorted and unique, or None for all keys. Needs
    key positions non-decreasing along each row."""
    if not keys_sorted or key_intervals is None:
        return None
    ivs = key_intervals(int(qp_t.min()), int(qp_t.max()))
    if ivs is None:
        return None
    Nk = k_pos.shape[1]
    bounds = torch.tensor([[lo, hi] for lo, hi in ivs], dtype=k_pos.dtype, device=k_pos.device)  # [I,2]
    vals = bounds.flatten()[None].expand(k_pos.shape[0], -1).contiguous()  # [B, 2I]
    k_pos = k_pos.contiguous()
    # an interval's keys, over the union of the rows: from the leftmost start to the rightmost end
    left = torch.searchsorted(k_pos, vals, right=False)[:, 0::2].min(dim=0).values  # [I]
    right = torch.searchsorted(k_pos, vals, right=True)[:, 1::2].max(dim=0).values
    pieces = [torch.arange(int(a), int(b), device=k_pos.device) for a, b in zip(left, right) if b > a]
    if not pieces:
        return k_pos.new_zeros(0)
    idx = torch.unique(torch.cat(pieces)) if len(pieces) > 1 else pieces[0]
    return None if idx.numel() == Nk else idx


def with_chosen(idx: torch.Tensor | None, c_idx: torch.Tensor | None, chosen: torch.Tensor):
    """The mask's candidate keys ``idx`` (None: all) cut to the keys a remap chose by content (``c_idx``, None:
    all, with ``chosen [B,H|1,t,len(c_idx)]`` over them, :func:`posenc.engine.scores.content_keys`): ``(keys,
    chosen over those keys)``. InfLLM's far branch then costs the retrieved blocks, not every far key."""
    if c_idx is None:
        return idx, (chosen if idx is None else chosen.index_select(-1, idx))
    if idx is None:
        return c_idx, chosen
    keep = torch.isin(c_idx, idx)
    return c_idx[keep], chosen[..., keep]


def keys_sorted(k_pos) -> bool:
    return k_pos.shape[1] < 2 or bool((k_pos[:, 1:] >= k_pos[:, :-1]).all())


class Blockwise(Backend):
    """Query tiles of ``tile`` rows. Per tile: the keys its mask intervals allow (a window costs
    O(window), not O(N)); per branch: q and k rotated once for the whole call, and the q.k product
    computed only on the contiguous key columns its region reaches (ReRoPE's near branch touches
    ~window keys per tile, the far branch the rest; boundary columns are computed by both)."""

    name = "blockwise"
    learned_sinks = True  # each query tile's softmax spans all its visible keys: the sink joins it there
    content_selection = True  # a remap's key choice is made per tile, against every key of the call
    tile = 256

    def run(self, call: AttentionCall):
        parts, q = call.parts, call.q
        B, H, Nq, _ = q.shape
        out = torch.empty(B, H, Nq, call.v.shape[-1], dtype=call.v.dtype, device=call.v.device)
        k_pos = call.k_pos.contiguous()  # searched once per tile
        rots = [rotate_branch(call, br) for br in parts.branches]
        ordered = keys_sorted(k_pos)
        for s in range(0, Nq, self.tile):
            e = min(Nq, s + self.tile)
            idx = candidate_keys(parts.mask.key_intervals, call.q_pos[:, s:e], k_pos, ordered)
            c_idx, chosen = content_keys(call, q[:, :, s:e], call.q_pos[:, s:e])  # (None, None): by position only
            if chosen is not None:
                idx, chosen = with_chosen(idx, c_idx, chosen)
            if idx is not None and idx.numel() == 0:
                out[:, :, s:e] = 0
                continue
            out[:, :, s:e] = self._tile(call, rots, s, e, k_pos, idx, chosen)
        return out

    @staticmethod
    def _tile(call: AttentionCall, rots, s: int, e: int, k_pos, idx, chosen):
        """Output rows ``s:e`` from the candidate keys ``idx`` (None: all keys), with the remap's content
        choice ``chosen`` over those keys (None: none)."""
        parts, q = call.parts, call.q
        B, H = q.shape[:2]

        def sel(t, dim):
            return t if idx is None else t.index_select(dim, idx)

        qp_t, kp_c = call.q_pos[:, s:e], sel(k_pos, 1)
        qg, kg = qp_t[:, None, :, None], kp_c[:, None, None, :]
        allowed = parts.allowed(qg, kg)  # [B,1,t,nc]
        if call.key_mask is not None:
            allowed = allowed & sel(call.key_mask, 1)[:, None, None, :]
        if chosen is not None:
            allowed = allowed & chosen
        scores = None
        for br, rot in zip(parts.branches, rots):
            q_b = rot.q[:, :, s:e]
            region = allowed if br.region is None else br.region(qg, kg) & allowed
            cols = region.any(dim=(0, 1, 2)).nonzero().flatten()
            if cols.numel() == 0:
                continue
            c0, c1 = int(cols[0]), int(cols[-1]) + 1  # the contiguous key columns this branch reaches
            k_b = sel(rot.k, 2)[:, :, c0:c1]
            s_b = q_b @ k_b.transpose(-1, -2)  # [B,H,t,c1-c0]
            if scores is None:
                scores = q_b.new_zeros(B, H, e - s, kp_c.shape[1])
            if br.region is None or bool(region[..., c0:c1].all()):
                scores[..., c0:c1] = s_b
            else:
                scores[..., c0:c1] = torch.where(region[..., c0:c1], s_b, scores[..., c0:c1])
        if scores is None:
            return 0
        scores = softcap(parts, scores)
        if parts.bias is not None:
            scores = scores + parts.bias.score(head_index(parts, q.device), parts.bias_query_pos(qg, kg),
                                               kg).to(scores.dtype)
        gate = call.gate_bias(qg, kg, slice(s, e), idx)
        if gate is not None:
            scores = scores + gate.to(scores.dtype)
        return finish(parts, scores, allowed, sel(call.v, 2), q[:, :, s:e], sel(call.k, 2), qp_t, kp_c,
                      call.q_scale[:, :, s:e], sink_logits=call.sink_logits)
