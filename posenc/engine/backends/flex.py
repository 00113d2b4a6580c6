"""``flex``: ``torch.compile(flex_attention)`` with the scheme's soft-cap and bias as ``score_mod`` and its
mask as a block mask (fully masked blocks skipped): linear memory at any length.

On CUDA compiled flex returns each row's log-sum-exp and has a backward, so one flex call per remap branch
(the branch's region, minus the regions of later branches, as its mask) covers every multi-branch remap at
inference, merged by log-sum-exp (:func:`posenc.engine.pieces.lse_merge`): ReRoPE, SelfExtend, DCA, STRING,
... in linear memory on the device's own kernel. In torch 2.13 compiled CPU flex has neither, so there one
flex call covers a single-branch scheme without content-relative terms at inference.

Block masks are built on the call's device in groups of query blocks, only over the key blocks the mask's
``key_intervals`` admit, and remembered for the position tensors of one forward
(:func:`posenc.engine.call.memo_positions`): the layers of a model share one build.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from functools import lru_cache

import torch

from posenc.engine.backends.base import Backend, first_reason
from posenc.engine.backends.blockwise import keys_sorted
from posenc.engine.call import AttentionCall, memo_positions
from posenc.engine.parts import AttentionParts
from posenc.engine.pieces import lse_merge
from posenc.engine.scores import rotate_branch

log = logging.getLogger("posenc")
FLEX_BLOCK = 128  # the block size of the block masks and of the compiled kernel
_FLEX_SEEN: set = set()  # (scheme, shapes, dtype, padding) already run by the compiled flex callable


@lru_cache(maxsize=2)
def _compiled_flex(device_type: str = "cpu"):
    """The compiled ``flex_attention`` for a device type. On the CPU one graph per shape (``dynamic=False``, as
    the block-padding workaround of :meth:`Flex.run` was measured); on CUDA PyTorch's automatic dynamic shapes: a
    second length recompiles once with symbolic lengths, so a suite's many lengths do not compile a kernel each."""
    import torch._dynamo.config as dynamo_config
    from torch.nn.attention.flex_attention import flex_attention

    # One compiled callable serves every scheme; each distinct score_mod/mask_mod/shape family is a
    # graph in its cache. The default limit (8) would silently drop a lab run with many schemes
    # to eager flex, which materialises the scores.
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 256)
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 256)
    return torch.compile(flex_attention, dynamic=False if device_type == "cpu" else None)


MASK_PAIRS = 1 << 26  # (query, key) pairs a block-mask build evaluates at once


def build_block_mask(allowed_fn, q_pos, k_pos, block: int = 128, key_intervals=None):
    """BlockMask for ``allowed_fn(qp, kp)`` on the positions' device, built in groups of query blocks (about
    :data:`MASK_PAIRS` pairs at once), each evaluated only on the key blocks ``key_intervals(q_lo, q_hi)`` admits
    (all keys when None or when key positions are not sorted). Memory O(:data:`MASK_PAIRS`); a sliding window
    costs O(N x window)."""
    from torch.nn.attention.flex_attention import BlockMask

    device = q_pos.device
    B, Nq = q_pos.shape
    Nk = k_pos.shape[1]
    nqb, nkb = (Nq + block - 1) // block, (Nk + block - 1) // block
    partial = torch.zeros(B, 1, nqb, nkb, dtype=torch.bool, device=device)
    full = torch.zeros(B, 1, nqb, nkb, dtype=torch.bool, device=device)
    ordered = key_intervals is not None and keys_sorted(k_pos)
    q_cpu, k_cpu = (q_pos.cpu(), k_pos.contiguous().cpu()) if ordered else (None, None)
    group = max(1, MASK_PAIRS // (block * block * max(1, nkb)))  # query blocks per group
    for g0 in range(0, nqb, group):
        g1 = min(nqb, g0 + group)
        s, e = g0 * block, min(Nq, g1 * block)
        for kb0, kb1 in _key_block_ranges(key_intervals if ordered else None, q_cpu, k_cpu, s, e, block, nkb):
            ks, ke = kb0 * block, min(Nk, kb1 * block)
            a = allowed_fn(q_pos[:, s:e, None], k_pos[:, None, ks:ke]).expand(B, e - s, ke - ks)
            tile = torch.zeros(B, (g1 - g0) * block, (kb1 - kb0) * block, dtype=torch.bool, device=device)
            tile[:, :e - s, :ke - ks] = a
            counts = tile.view(B, g1 - g0, block, kb1 - kb0, block).sum(dim=(2, 4))  # [B,gq,gk]
            rows = (torch.arange(g0, g1, device=device) + 1) * block <= Nq  # complete query blocks
            cols = (torch.arange(kb0, kb1, device=device) + 1) * block <= Nk  # complete key blocks
            # "full" (mask_mod skipped) only for complete blocks whose every pair is visible
            allb = (counts == block * block) & rows[None, :, None] & cols[None, None, :]
            partial[:, 0, g0:g1, kb0:kb1] = (counts > 0) & ~allb
            full[:, 0, g0:g1, kb0:kb1] = allb

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


def _key_block_ranges(key_intervals, q_cpu, k_cpu, s: int, e: int, block: int, nkb: int) -> list[tuple[int, int]]:
    """The key-block ranges ``[kb0, kb1)`` holding every key the queries ``s..e-1`` may see according to
    ``key_intervals`` (sorted key positions ``k_cpu``, on the CPU), merged; ``[(0, nkb)]`` without intervals."""
    if key_intervals is None:
        return [(0, nkb)]
    ivs = key_intervals(int(q_cpu[:, s:e].min()), int(q_cpu[:, s:e].max()))
    if ivs is None:
        return [(0, nkb)]
    ranges = []
    for lo, hi in sorted(ivs):
        i0 = int(torch.searchsorted(k_cpu, torch.full((k_cpu.shape[0], 1), lo, dtype=k_cpu.dtype)).min())
        i1 = int(torch.searchsorted(k_cpu, torch.full((k_cpu.shape[0], 1), hi, dtype=k_cpu.dtype), right=True).max())
        if i1 <= i0:
            continue
        kb0, kb1 = i0 // block, (i1 + block - 1) // block
        if ranges and kb0 <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], kb1))
        else:
            ranges.append((kb0, kb1))
    return ranges


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


def device_reason(device: torch.device) -> str | None:
    """Why compiled FlexAttention cannot run on ``device`` (None: it can): the CPU (inductor's C++ kernels) and
    CUDA with Triton."""
    if device.type == "cuda":
        return None if importlib.util.find_spec("triton") else "compiled FlexAttention on CUDA needs Triton"
    return None if device.type == "cpu" else f"compiled FlexAttention runs on cpu and cuda, not {device.type}"


def returns_lse(device: torch.device) -> bool:
    """Whether compiled flex on ``device`` returns its rows' log-sum-exp and has a backward (CUDA; not the CPU
    in torch 2.13)."""
    return device.type == "cuda"


def effective_regions(parts: AttentionParts) -> list[tuple[int, object]]:
    """``(branch index, region or None)`` for each branch that holds some pair: the reference gives a pair to the
    *last* branch whose region holds it (:func:`posenc.engine.scores.scores_tile`), so a branch's own pairs are
    its region minus the regions of the branches after it (a later branch without a region takes every pair)."""
    out = []
    branches = parts.branches
    for i, br in enumerate(branches):
        later = [b.region for b in branches[i + 1:]]
        if any(r is None for r in later):
            continue
        if not later:
            out.append((i, br.region))
            continue

        def region(a, b, own=br.region, later=tuple(later)):
            hit = later[0](a, b)
            for r in later[1:]:
                hit = hit | r(a, b)
            return ~hit if own is None else own(a, b) & ~hit
        out.append((i, region))
    return out


class Flex(Backend):
    name = "flex"
    dtypes = (torch.float32, torch.bfloat16, torch.float16)  # torch 2.13 inductor: no float64 FlexAttention

    def why_not(self, call: AttentionCall) -> str | None:
        parts, dev = call.parts, call.q.device
        lse = returns_lse(dev)
        learned = torch.is_grad_enabled() and not lse
        return first_reason(
            (device_reason(dev) is not None, device_reason(dev) or ""),
            (not parts.single_branch and not lse, f"the remap has {len(parts.branches)} branches and compiled CPU "
                                                  "flex returns no log-sum-exp to merge them"),
            (not parts.single_branch and call.needs_grad, "the branches' log-sum-exp merge has no backward here"),
            (parts.relative is not None, "content-relative terms are not a score_mod"),
            (call.needs_grad and not lse, "compiled CPU flex has no backward"),
            (parts.bias is not None and any(p.requires_grad for p in parts.bias.parameters())
             and torch.is_grad_enabled(), "the bias is learned and autograd is on (a score_mod takes no gradient "
                                          "here)"),
            (learned and parts.multiaxis is not None and any(p.requires_grad for p in parts.multiaxis.parameters()),
             "the RoPE frequencies are learned and autograd is on"))

    def gqa(self, call: AttentionCall) -> bool:
        return returns_lse(call.q.device) and call.k_axes is None  # CUDA flex reads grouped keys (enable_gqa)

    def run(self, call: AttentionCall):
        """Compiled FlexAttention with the queries and keys padded to whole 128-token blocks, one call per
        branch that holds a pair (:func:`effective_regions`), merged by log-sum-exp when there are several.

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
        parts, q = call.parts, call.q
        B, Nq = q.shape[0], q.shape[2]
        Pq, Pk = _pad_to_block(Nq) - Nq, _pad_to_block(call.Nk) - call.Nk
        qp, kp = _padded_positions(call, Pq, Pk)
        gates = None
        if call.q_gate is not None:  # padded like the positions (padded keys are masked, padded queries dropped)
            H = q.shape[1]
            gates = (torch.cat([call.q_gate, call.q_gate.new_zeros(B, H, Pq)], dim=2).contiguous(),
                     torch.cat([call.k_gate, call.k_gate.new_zeros(B, H, Pk)], dim=2).contiguous())
        score_mod = _flex_score_mod(parts, qp, kp, gates)
        regions = effective_regions(parts)
        several = len(regions) > 1
        v = _pad(call.v, Pk)
        pieces = []
        for i, region in regions:
            bm = _branch_block_mask(call, i, region, qp, kp, Pq, Pk)
            rot = rotate_branch(call, parts.branches[i])
            pieces.append(_run_flex(call, _pad(rot.q, Pq), _pad(rot.k, Pk), v, score_mod, bm, several))
        if not several:
            return pieces[0][0][:, :, :Nq]
        return lse_merge([(o[:, :, :Nq], lse[:, :, :Nq].float()) for o, lse in pieces])


def _pad(t: torch.Tensor, n: int) -> torch.Tensor:
    """``[B,h,N,D] -> [B,h,N+n,D]``, zeros appended (contiguous either way)."""
    return torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], n, t.shape[-1])], dim=2) if n else t.contiguous()


def _padded_positions(call: AttentionCall, Pq: int, Pk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key positions padded to whole blocks (:meth:`Flex.run`): padded queries repeat the last
    position, padded and padding keys are -1."""
    B = call.B
    k_pos = call.k_pos
    if call.key_mask is not None:  # padding keys: encode validity in the key position (-1 is never a real position)
        k_pos = torch.where(call.key_mask, k_pos, torch.full_like(k_pos, -1))
    qp = torch.cat([call.q_pos, call.q_pos[:, -1:].expand(B, Pq)], dim=1).contiguous()  # [B,Nq+Pq]
    kp = torch.cat([k_pos, k_pos.new_full((B, Pk), -1)], dim=1).contiguous()  # [B,Nk+Pk]
    return qp, kp


def _branch_block_mask(call: AttentionCall, index: int, region, qp, kp, Pq: int, Pk: int):
    """The block mask of branch ``index`` (its pairs: the scheme's mask and ``region``), remembered for the
    call's position tensors (the layers of one forward share them, :func:`posenc.engine.call.memo_positions`)."""
    parts = call.parts
    plain = call.key_mask is None and Pk == 0

    def allowed(a, b):
        ok = parts.allowed(a, b) if plain else parts.allowed(a, b) & (b >= 0)
        return ok if region is None else ok & region(a, b)

    key = parts.__dict__.get("_flex_key")
    if key is None:
        key = parts.__dict__["_flex_key"] = parts.scheme.to_json()
    tensors = (call.q_pos, call.k_pos) + (() if call.key_mask is None else (call.key_mask,))
    intervals = parts.mask.key_intervals if plain else None
    return memo_positions(f"flex block mask {key} {index} {Pq} {Pk}", tensors,
                          lambda: build_block_mask(allowed, qp, kp, key_intervals=intervals))


def _aux_request():
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch < 2.9: return_lse
        return None
    return AuxRequest(lse=True)


def _run_flex(call: AttentionCall, q, k, v, score_mod, bm, with_lse: bool):
    """``(out, lse or None)`` of compiled flex on padded ``q, k, v`` (scale folded into q; GQA read as is on CUDA),
    logging the first call of each shape (compiled once per padded shape)."""
    parts = call.parts
    key = (parts.__dict__.get("_flex_key"), tuple(q.shape), tuple(k.shape), q.dtype, call.key_mask is None,
           with_lse, str(q.device))
    first = key not in _FLEX_SEEN
    if first:  # torch.compile specialises on shapes: say so before the wait (seconds), not after
        _FLEX_SEEN.add(key)
        log.info("compiling FlexAttention for %s, %d x %d tokens (first call of this shape; later calls reuse it)",
                 parts.scheme.name or "this scheme", call.Nq, call.Nk)
        t0 = time.perf_counter()
    kw = {"score_mod": score_mod, "block_mask": bm, "scale": 1.0, "enable_gqa": k.shape[1] != q.shape[1]}
    lse = None
    flex = _compiled_flex(q.device.type)
    if not with_lse:
        out = flex(q, k, v, **kw)
    else:
        aux = _aux_request()
        if aux is None:
            out, lse = flex(q, k, v, return_lse=True, **kw)
        else:
            out, got = flex(q, k, v, return_aux=aux, **kw)
            lse = got.lse
    if first:
        log.info("FlexAttention ready in %.1f s", time.perf_counter() - t0)
    return out, lse
