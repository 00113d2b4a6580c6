"""Rotating queries and keys for one branch, as cheaply as the call allows: :func:`rotate_branch`,
:func:`rotate_keys`, :func:`rotate_queries`.

Three things make a rotation cost more than the one pass over ``x`` it needs, and each is avoided here:

- **cos/sin per position.** Angles are float64 ``p * inv_freq`` (``posenc.parts.rotary``); a static schedule
  reads them from one float32 table per frequency vector (:class:`posenc.parts.rotary.RopeAngleCache`, shared
  by every layer and call with the same frequencies), and keys at positions ``a .. a+n-1`` (a prefill, a
  decode step: the run every call without padding has) take the rows ``a:a+n`` of the table as a *view*: no
  gather. A dynamic schedule (one frequency vector per query group) computes the positions it needs directly,
  since a table per group would be built for one use.
- **GQA.** Keys are rotated with their own ``Hk`` heads (``[B,Hk,Nk,D]``), not repeated to the query heads
  first: ``H / Hk`` times fewer rotations and no copy of the cache.
- **Keys a piece never reads.** :func:`rotate_keys` rotates a slice ``[lo, hi)`` only (the fused backends'
  pieces: ReRoPE's near branch reads ``window`` keys, its far branch the rest).

The values are bit-identical to ``apply_rope(x, positions, inv_freq)`` (same table entries, same kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc.engine.call import AttentionCall
from posenc.parts.branches import Branch
from posenc.parts.rotary import (
    _KERNEL_STATE,
    RopeAngleCache,
    _kernel_ok,
    _rotate_kernel,
    apply_rope,
    apply_rope_cos_sin,
    rope_cos_sin,
    xpos_scale,
)

TABLE_MAX_POSITION = 1 << 17  # the largest position a shared cos/sin table holds (32 MiB per table at R/2 = 32)
_TABLES: dict = {}  # (device, inv_freq values) -> RopeAngleCache; at most _MAX_TABLES, oldest dropped first
_MAX_TABLES = 8
_IDENTITY = Branch.__dataclass_fields__["k_rot"].default  # a branch that rotates keys at their own positions


@dataclass
class Rotated:
    q: torch.Tensor  # [B,H,Nq,D] rotated and scaled queries
    k: torch.Tensor  # [B,Hk,Nk,D] rotated keys (the call's own key heads)


def _inv(call: AttentionCall, branch: Branch) -> tuple[torch.Tensor, tuple]:
    """float64 ``inv_freq * freq_scale`` of the call's schedule and the branch, on the call's device, and
    its values (the key of its cos/sin table)."""
    return call.parts.inv_freq64(call.freqs, branch.freq_scale, call.q.device)


def _table(inv: torch.Tensor, values: tuple, need: int, dtype: torch.dtype = torch.float32) -> RopeAngleCache | None:
    """The shared ``dtype`` (float32, or float64 for float64 inputs) cos/sin table of ``inv`` (``values``: its
    entries) holding positions ``0 .. need-1`` (None past :data:`TABLE_MAX_POSITION`)."""
    if need > TABLE_MAX_POSITION:
        return None
    key = (str(inv.device), values, dtype)
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.pop(next(iter(_TABLES)))
        table = _TABLES[key] = RopeAngleCache(inv, max_position=max(need, 1), dtype=dtype)
    elif need > table.capacity:
        table._build(min(TABLE_MAX_POSITION, max(need, 2 * table.capacity)))
    return table


def cos_sin(pos: torch.Tensor, inv: torch.Tensor, values: tuple, static: bool, run_start: int | None = None,
            dtype: torch.dtype = torch.float32):
    """``(cos, sin)`` of ``dtype`` ``[B or 1,1,N,R/2]`` at integer positions ``pos [B,N]`` for float64 ``inv``
    (``values``: its entries, :func:`_inv`). ``run_start``: every row of ``pos`` is
    ``run_start .. run_start+N-1`` (then the table rows are a view). ``static``: the frequencies serve many
    calls (a table is worth building); else computed directly."""
    N = pos.shape[-1]
    if static and N:
        need = run_start + N if run_start is not None else int(pos.max()) + 1
        table = _table(inv, values, need, dtype)
        if table is not None:
            if run_start is not None:  # rows run_start .. run_start+N-1 of the table: a view
                rows = slice(run_start, run_start + N)
                return table._cos[rows][None, None], table._sin[rows][None, None]
            c, s = table._cos[pos], table._sin[pos]  # [B,N,R/2]
            return c.unsqueeze(1), s.unsqueeze(1)
    if run_start is not None:
        pos = torch.arange(run_start, run_start + N, device=pos.device)[None]
    return rope_cos_sin(pos, inv, dtype=dtype)


def _wide(x: torch.Tensor) -> torch.dtype:
    """cos/sin dtype of a multi-axis rotation: float64 stays exact, everything else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _key_run(call: AttentionCall, branch: Branch, lo: int) -> int | None:
    """The first rotation position of keys ``lo..`` when they are a run in every row (identity ``k_rot``
    and keys at ``0..Nk-1``), else None."""
    return lo if branch.k_rot is _IDENTITY and call.keys_are_indices else None


def rotate_keys(call: AttentionCall, branch: Branch, lo: int = 0, hi: int | None = None) -> torch.Tensor:
    """Keys ``[lo, hi)`` of the call rotated at the branch's key positions: ``[B,Hk,hi-lo,D]`` (un-rotated
    when every one of them sits at rotation position 0, ReRoPE's far keys). With the call's
    :class:`~posenc.engine.keystore.KeyStore` only the rows it does not hold yet are rotated."""
    parts = call.parts
    hi = call.Nk if hi is None else hi
    if parts.rope is None or hi <= lo:
        return call.k if (lo, hi) == (0, call.Nk) else call.k[:, :, lo:hi]
    store = call.key_store
    if store is None or call.k_axes is not None or call.needs_grad:
        return _rotated_rows(call, branch, lo, hi)[0]
    values = _inv(call, branch)[1]
    return store.rows((branch.k_rot, call.k.dtype, call.k.device), values, call.k, lo, hi,
                      lambda a, b: _rotated_rows(call, branch, a, b))


def _rotated_rows(call: AttentionCall, branch: Branch, lo: int, hi: int) -> tuple[torch.Tensor, bool]:
    """Keys ``[lo, hi)`` rotated, and whether they were (False: every one at rotation position 0, returned as
    they are)."""
    parts = call.parts
    k = call.k if (lo, hi) == (0, call.Nk) else call.k[:, :, lo:hi]
    inv, values = _inv(call, branch)
    rope = parts.rope
    if call.k_axes is not None:  # multi-axis RoPE: cos/sin [B,1 or H,N,R/2] from the coordinates
        kc, ks = parts.multiaxis.cos_sin(call.k_axes[:, lo:hi], inv, _wide(k))
        return apply_rope_cos_sin(k, kc, ks, rope.layout, parts.rotary_dim), True
    run = _key_run(call, branch, lo)
    kpr = None if run is not None else branch.k_rot(call.k_pos[:, lo:hi])
    if run is None and not bool(kpr.any()):  # every key at position 0: the identity rotation (and xPos scale 1)
        return k, False
    if rope.xpos:
        kpr = kpr if kpr is not None else call.k_pos[:, lo:hi]
        kr = apply_rope(k, kpr, inv, layout=rope.layout, rotary_dim=parts.rotary_dim)
        return kr / xpos_scale(kpr, k.shape[-1], rope.xpos_scale_base, layout=rope.layout).to(k.dtype), True
    c, s = cos_sin(kpr if kpr is not None else call.k_pos[:, lo:hi], inv, values, not parts.dynamic, run, _wide(k))
    return apply_rope_cos_sin(k, c, s, rope.layout, parts.rotary_dim), True


def rotate_queries(call: AttentionCall, branch: Branch) -> torch.Tensor:
    """The call's queries rotated at the branch's query positions, the query scale (softmax scale x
    YaRN factor^2 x log-n) folded in: ``[B,H,Nq,D]``. With the whole head rotated the scale multiplies
    cos and sin (``[B,1,Nq,R/2]``) instead of taking another pass over q."""
    parts, q, q_scale = call.parts, call.q, call.q_scale
    if parts.rope is None:
        return q * q_scale
    inv, values = _inv(call, branch)
    rope, rd = parts.rope, parts.rotary_dim
    if call.q_axes is not None:
        qc, qs = parts.multiaxis.cos_sin(call.q_axes, inv, _wide(q))
        scale = q_scale.to(qc.dtype)  # [B,1,Nq,1]
        return apply_rope_cos_sin(q, qc * scale, qs * scale, rope.layout, rd)
    if not rope.xpos and rd == q.shape[-1] and q.dtype == torch.float32:
        run = call.q_run if branch.q_rot is _IDENTITY else None  # queries at q0.. : the table rows as a view
        qpr = call.q_pos if run is not None else branch.q_rot(call.q_pos)
        c, s = cos_sin(qpr, inv, values, not parts.dynamic, run)  # [B,1,Nq,R/2]
        qs = q_scale.to(torch.float32)  # [B,1,Nq,1]
        return _rotate(q, c * qs, s * qs, rope.layout, rd)
    qpr = branch.q_rot(call.q_pos)
    qr = apply_rope(q, qpr, inv, layout=rope.layout, rotary_dim=rd)
    if rope.xpos:
        qr = qr * xpos_scale(qpr, q.shape[-1], rope.xpos_scale_base, layout=rope.layout).to(q.dtype)
    return qr * q_scale


def _rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, layout: str, rd: int) -> torch.Tensor:
    """``apply_rope_cos_sin``, on the fused kernel also below its size threshold once the kernel is loaded (a
    decode step's few queries: one call instead of a dozen small ops; the kernel is bit-identical to the
    PyTorch path and is never built for a small tensor, so tests stay compile-free)."""
    if _KERNEL_STATE.get("mod") is not None and c.shape[1] == 1 and _kernel_ok(x, c, s, force=True):
        xc = x.contiguous()
        return _rotate_kernel(xc, c, s, layout, rd, torch.empty_like(xc))
    return apply_rope_cos_sin(x, c, s, layout, rd)


def rotate_branch(call: AttentionCall, branch: Branch) -> Rotated:
    """q and k rotated at the branch's positions, the softmax/YaRN/log-n scale folded into q; keys keep the
    call's own heads. A side whose positions are all 0 (ReRoPE's far keys) is left as it is."""
    return Rotated(rotate_queries(call, branch), rotate_keys(call, branch))


def rotated_keys_once(call: AttentionCall, branches) -> list[torch.Tensor]:
    """The keys rotated for each branch, computed once per distinct ``(k_rot, freq_scale)`` (Dual Chunk
    Attention's three branches share one key rotation, ``kp mod c``)."""
    seen: dict = {}
    out = []
    for br in branches:
        key = (br.k_rot, br.freq_scale)
        if key not in seen:
            seen[key] = rotate_keys(call, br)
        out.append(seen[key])
    return out
