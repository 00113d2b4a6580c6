"""``flex``: ``torch.compile(flex_attention)`` with the scheme's soft-cap and bias as ``score_mod`` and its
mask as a block mask (fully masked blocks skipped): linear memory at any length. In torch 2.13 compiled
CPU flex has no backward and no ``return_lse``, so one flex call covers a single-branch scheme without
content-relative terms at inference."""

from __future__ import annotations

import logging
import time
from functools import lru_cache

import torch

from posenc.engine.backends.base import Backend, first_reason
from posenc.engine.backends.blockwise import candidate_keys, keys_sorted
from posenc.engine.call import AttentionCall
from posenc.engine.parts import AttentionParts
from posenc.engine.scores import rotate_branch

log = logging.getLogger("posenc")
FLEX_BLOCK = 128  # the block size of the block masks and of the compiled kernel
_FLEX_SEEN: set = set()  # (scheme, shapes, dtype, padding) already run by the compiled flex callable


@lru_cache(maxsize=1)
def _compiled_flex():
    import torch._dynamo.config as dynamo_config
    from torch.nn.attention.flex_attention import flex_attention

    # One compiled callable serves every scheme; each distinct score_mod/mask_mod/shape family is a
    # graph in its cache. The default limit (8) would silently drop a lab run with many schemes
    # to eager flex, which materialises the scores.
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 256)
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 256)
    return torch.compile(flex_attention, dynamic=False)


def build_block_mask(allowed_fn, q_pos, k_pos, block: int = 128, key_intervals=None):
    """BlockMask for ``allowed_fn(qp, kp)`` built one query block row at a time, evaluating the mask
    only on the keys ``key_intervals(q_lo, q_hi)`` admits (all keys when None or when key positions
    are not sorted). Memory O(block x candidate keys); a sliding window costs O(N x window)."""
    from torch.nn.attention.flex_attention import BlockMask

    B, Nq = q_pos.shape
    Nk = k_pos.shape[1]
    nqb, nkb = (Nq + block - 1) // block, (Nk + block - 1) // block
    partial = torch.zeros(B, 1, nqb, nkb, dtype=torch.bool)
    full = torch.zeros(B, 1, nqb, nkb, dtype=torch.bool)
    ordered = key_intervals is not None and keys_sorted(k_pos)
    kidx_all = torch.arange(Nk)
    for i in range(nqb):
        s, e = i * block, min(Nq, (i + 1) * block)
        qp = q_pos[:, s:e]
        idx = candidate_keys(key_intervals, qp, k_pos, ordered)
        kidx = kidx_all if idx is None else idx
        if kidx.numel() == 0:
            continue
        a = allowed_fn(qp[:, :, None], k_pos.index_select(1, kidx)[:, None, :])  # [B,t,nc]
        blk = torch.div(kidx, block, rounding_mode="floor")  # key block of each candidate
        counts = torch.zeros(B, nkb, dtype=torch.long).index_add_(1, blk, a.sum(dim=1).long())  # [B,nkb]
        sizes = torch.full((nkb,), block, dtype=torch.long)
        sizes[-1] = Nk - (nkb - 1) * block
        # "full" (mask_mod skipped) only for complete blocks whose every pair is visible
        allb = (counts == (e - s) * sizes[None]) & (sizes[None] == block) & (e - s == block)
        partial[:, 0, i] = (counts > 0) & ~allb
        full[:, 0, i] = allb

    def to_idx(m):
        num = m.sum(-1).to(torch.int32)
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num, order

    kv_num, kv_idx = to_idx(partial)
    f_num, f_idx = to_idx(full)
    qp_c, kp_c = q_pos.contiguous(), k_pos.contiguous()

    def mask_mod(b, h, qi, ki):
        return allowed_fn(qp_c[b, qi], kp_c[b, ki])

    return BlockMask.from_kv_blocks(kv_num, kv_idx, f_num, f_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(Nq, Nk))


def _pad_to_block(n: int) -> int:
    return -(-n // FLEX_BLOCK) * FLEX_BLOCK


def _flex_score_mod(parts: AttentionParts, qp_c, kp_c, gates=None):
    """The scheme's soft-cap, bias and forget gate (``gates``: padded ``(q_gate, k_gate)`` or None) as a flex
    ``score_mod`` over padded positions, or None."""
    cap, bias = parts.scheme.softcap, parts.bias
    if bias is None and cap is None and gates is None:
        return None

    def score_mod(score, b, h, qi, ki):
        if cap is not None:
            score = torch.tanh(score / cap) * cap
        if bias is None and gates is None:
            return score
        qp, kp = qp_c[b, qi], kp_c[b, ki]
        if bias is not None:
            score = score + bias.score(h, parts.bias_query_pos(qp, kp), kp).to(score.dtype)
        if gates is not None:
            from posenc.parts.gates import forget_bias

            score = score + forget_bias(gates[0][b, h, qi], gates[1][b, h, ki], qp, kp).to(score.dtype)
        return score

    return score_mod


class Flex(Backend):
    name = "flex"
    dtypes = (torch.float32, torch.bfloat16, torch.float16)  # torch 2.13 inductor: no float64 FlexAttention

    def why_not(self, call: AttentionCall) -> str | None:
        parts = call.parts
        return first_reason(
            (not parts.single_branch, f"the remap has {len(parts.branches)} branches and compiled CPU flex "
                                      "returns no log-sum-exp to merge them"),
            (parts.relative is not None, "content-relative terms are not a score_mod"),
            (call.needs_grad, "compiled CPU flex has no backward"),
            (parts.bias is not None and any(p.requires_grad for p in parts.bias.parameters())
             and torch.is_grad_enabled(), "the bias is learned and autograd is on (compiled CPU flex has no backward)"),
            (parts.multiaxis is not None and any(p.requires_grad for p in parts.multiaxis.parameters())
             and torch.is_grad_enabled(), "the RoPE frequencies are learned and autograd is on"))

    def run(self, call: AttentionCall):
        """Compiled FlexAttention with the queries and keys padded to whole 128-token blocks.

        Why the padding: in torch 2.13, compiled CPU ``flex_attention`` gives wrong, run-to-run different
        answers whenever a query or key length leaves a block shorter than 128 (it reads past the valid
        rows of the last block: uninitialised memory). Minimal reproduction, no posenc involved::

            import torch
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            q, k, v = (torch.randn(1, 1, 40, 16) for _ in range(3))
            bm = create_block_mask(lambda b, h, i, j: j <= i, 1, 1, 40, 40, device="cpu")
            out = torch.compile(flex_attention)(q, k, v, block_mask=bm)
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            (out - ref).abs().max()  # 0.8-1.9 here, and a different value in each process

        (also with Nq < Nk, e.g. 5 queries after a 51-token prefix). So Nq and Nk are padded independently
        to multiples of 128: padded keys get position -1, which the mask refuses (the same encoding as
        padding keys from ``key_mask``); padded queries repeat the last query position and are dropped from
        the output. Every block the kernel sees is then complete. Positions, not indices, carry the query
        offset, so a decode step or a prefix stays right."""
        parts, q, k_pos, key_mask = call.parts, call.q, call.k_pos, call.key_mask
        B, H, Nq, D = q.shape
        Nk = call.Nk
        Pq, Pk = _pad_to_block(Nq) - Nq, _pad_to_block(Nk) - Nk
        rot = rotate_branch(call, parts.branches[0])
        if key_mask is not None:  # padding keys: encode validity in the key position (-1 is never a real position)
            k_pos = torch.where(key_mask, k_pos, torch.full_like(k_pos, -1))
        qp = torch.cat([call.q_pos, call.q_pos[:, -1:].expand(B, Pq)], dim=1)  # [B,Nq+Pq]
        kp = torch.cat([k_pos, k_pos.new_full((B, Pk), -1)], dim=1)  # [B,Nk+Pk]
        if key_mask is None and Pk == 0:
            bm = build_block_mask(parts.allowed, qp, kp, key_intervals=parts.mask.key_intervals)
        else:
            bm = build_block_mask(lambda a, b: parts.allowed(a, b) & (b >= 0), qp, kp)

        def pad(t, n):  # [B,H,N,D] -> [B,H,N+n,D], zeros appended
            return torch.cat([t, t.new_zeros(B, H, n, t.shape[-1])], dim=2) if n else t.contiguous()

        gates = None
        if call.q_gate is not None:  # padded like the positions (padded keys are masked, padded queries dropped)
            gates = (torch.cat([call.q_gate, call.q_gate.new_zeros(B, H, Pq)], dim=2).contiguous(),
                     torch.cat([call.k_gate, call.k_gate.new_zeros(B, H, Pk)], dim=2).contiguous())
        score_mod = _flex_score_mod(parts, qp.contiguous(), kp.contiguous(), gates)
        # the softmax scale is already folded into q; compiled once per padded shape
        key = (parts.scheme.to_json(), (B, H, Nq + Pq, D), (B, H, Nk + Pk, call.v.shape[-1]), q.dtype,
               key_mask is None)
        first = key not in _FLEX_SEEN
        if first:  # torch.compile specialises on shapes: say so before the wait (seconds), not after
            _FLEX_SEEN.add(key)
            log.info("compiling FlexAttention for %s, %d x %d tokens (first call of this shape; later calls reuse it)",
                     parts.scheme.name or "this scheme", Nq, Nk)
            t0 = time.perf_counter()
        out = _compiled_flex()(pad(rot.q, Pq), pad(rot.k, Pk), pad(call.v, Pk), score_mod=score_mod, block_mask=bm,
                               scale=1.0)
        if first:
            log.info("FlexAttention ready in %.1f s", time.perf_counter() - t0)
        return out[:, :, :Nq]
