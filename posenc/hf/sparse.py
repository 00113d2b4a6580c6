"""DeepSeek sparse attention (DSA) under :func:`posenc.hf.extend`: DeepSeek V3.2, GLM-MoE-DSA, A.X-K2, HY V4.

What transformers does (``modeling_deepseek_v32.py``, ``DeepseekV32Attention.forward`` and
``DeepseekV32Indexer.forward``; the other three are copies of it): the attention module calls its
*lightning indexer* with ``(hidden_states, q_resid, position_embeddings, attention_mask[:, 0, :, :],
position_ids, past_key_values=...)``. The indexer rotates its own q/k with the **same** ``(cos, sin)``
the main attention gets from the model's rotary module, caches its rotated keys
(``past_key_values.update_indexer``), scores every key, adds the 3-D mask (bool: ``masked_fill(-inf)``,
float: ``+ mask``) and returns the top ``index_topk`` key indices per query ``[B, S, topk]``. On eager /
SDPA the module scatters them into the 4-D mask; on any other attention implementation (posenc's among
them) the mask is passed on untouched and the indices reach the attention function as the keyword
``indices``. GLM's and HY's ``"shared"`` layers have ``indexer = None`` and reuse the indices of the
previous full layer.

Under posenc's path that breaks twice, and this module mends both with forward pre-hooks:

1. the rotary module returns the identity rotation, so the indexer would score un-rotated q/k. A hook
   on the rotary module (run before the identity hook) keeps its real output; the indexer's pre-hook
   hands it that real ``(cos, sin)``. The indexer thus selects (and caches) exactly as in the untouched
   model; the posenc method changes the main attention only (the indexer is a trained selector).
2. the mask function returns key positions ``[B, Nk]``, which ``attention_mask[:, 0, :, :]`` cannot
   index. The attention module's pre-hook passes them on as ``[B, 1, 1, Nk]``; the indexer's pre-hook
   turns its ``[B, 1, Nk]`` slice into the bool mask ``create_causal_mask`` builds for SDPA: key ``t``
   visible to query ``s`` iff ``t`` is a real token and ``t <= Nk - S + s`` (causal on cache index).

The attention function then honours ``indices`` exactly (:func:`selected`): a query whose selection holds
every key it may see (at most ``index_topk`` of them) runs in one engine call with the per-key padding
mask; each other query row gets its own key mask ``real & selected`` (the engine's key mask is per key,
not per query), its rows folded into the batch dimension a tile at a time. Keys the selection holds but
the query may not see (padding, the future) stay masked, as transformers' ``mask & ~index_mask`` does.
"""

from __future__ import annotations

import inspect

import torch

DSA_ATTR = "indexer"  # DSA attention modules have it (None on GLM / HY "shared" layers)
TILE_ELEMENTS = 1 << 24  # sparse query rows per engine call: keys copied per row x rows <= this many


def dsa_modules(attention_modules) -> list:
    """The attention modules with DeepSeek sparse attention (an ``indexer`` attribute, possibly None)."""
    return [m for m in attention_modules if hasattr(m, DSA_ATTR)]


def check(attention_modules, rotary_modules) -> None:
    """Refuse (``ValueError``) DSA models posenc's hooks cannot serve exactly: an indexer whose selection
    does not reach the attention function as ``indices`` (read from the module's ``forward`` source), or
    more than one rotary module (the indexer's real ``(cos, sin)`` is taken from the model's one)."""
    for m in dsa_modules(attention_modules):
        try:
            src = inspect.getsource(type(m).forward)
        except (OSError, TypeError):
            src = ""
        if "indices=" not in src:  # Qwen4-Exp's QSA indexer returns a token mask it applies itself
            raise ValueError(f"{type(m).__name__}: sparse attention whose indexer does not hand its selection to "
                             "the attention function as `indices` (not DeepSeek's lightning indexer); posenc "
                             "cannot honour that selection")
    if dsa_modules(attention_modules) and len(rotary_modules) != 1:
        raise ValueError(f"DeepSeek sparse attention with {len(rotary_modules)} rotary modules (the indexer's "
                         "rotation is taken from the model's one rotary module)")


def install(attention_modules, rotary_modules) -> list:
    """Register the hooks of the module docstring; returns their handles (nothing for a model without DSA)."""
    dsa = dsa_modules(attention_modules)
    if not dsa:
        return []
    real: dict = {}

    def keep_real(_module, _args, output):
        real["rotation"] = output

    handles = [rotary_modules[0].register_forward_hook(keep_real, prepend=True)]
    for m in dsa:
        handles.append(m.register_forward_pre_hook(_bound_hook(m, _positions_4d), with_kwargs=True))
        if getattr(m, DSA_ATTR) is not None:
            indexer_hook = _bound_hook(m.indexer, lambda a: _indexer_inputs(a, real))
            handles.append(m.indexer.register_forward_pre_hook(indexer_hook, with_kwargs=True))
    return handles


def _bound_hook(module, change):
    """A ``with_kwargs`` forward pre-hook that binds the call to ``module.forward``'s signature, lets
    ``change`` edit the named arguments (a dict), and passes them on."""
    sig = inspect.signature(module.forward)

    def hook(_module, args, kwargs):
        bound = sig.bind(*args, **kwargs)
        change(bound.arguments)
        return bound.args, bound.kwargs

    return hook


def _positions_4d(arguments: dict) -> None:
    """Attention module: key positions ``[B, Nk]`` -> ``[B, 1, 1, Nk]`` (what it slices as a 4-D mask)."""
    mask = arguments.get("attention_mask")
    if not _is_positions(mask, 2):
        raise ValueError("posenc's DeepSeek sparse attention needs the key positions of posenc's mask function")
    arguments["attention_mask"] = mask[:, None, None, :]


def _is_positions(mask, dim: int) -> bool:
    return isinstance(mask, torch.Tensor) and mask.dim() == dim and not mask.is_floating_point() \
        and mask.dtype != torch.bool


def _indexer_inputs(arguments: dict, real: dict) -> None:
    """Indexer: the real ``(cos, sin)`` and the causal + padding bool mask ``[B, S, Nk]``."""
    pos = arguments["attention_mask"]  # [B,1,Nk] key positions, -1 = padding
    if not _is_positions(pos, 3):
        raise ValueError("posenc's DeepSeek sparse attention: the indexer did not get posenc's key positions")
    given, rotation = arguments["position_embeddings"], real.get("rotation")
    if rotation is None or [t.shape for t in rotation] != [t.shape for t in given]:
        raise ValueError("posenc's DeepSeek sparse attention: no rotary output of this forward for the indexer")
    arguments["position_embeddings"] = rotation
    arguments["attention_mask"] = causal_padding_mask(pos[:, 0], arguments["hidden_states"].shape[1])


def causal_padding_mask(k_pos: torch.Tensor, n_queries: int) -> torch.Tensor:
    """``[B, S, Nk]`` bool: key ``t`` is visible to query ``s`` (the last ``S`` keys) iff it is a real token
    (position >= 0) and ``t <= Nk - S + s``, as transformers' causal mask over a dynamic cache."""
    Nk = k_pos.shape[-1]
    t = torch.arange(Nk, device=k_pos.device)
    q_index = torch.arange(Nk - n_queries, Nk, device=k_pos.device)
    return (t[None, :] <= q_index[:, None])[None] & (k_pos >= 0)[:, None, :]


def key_positions(attention_mask):
    """The attention function's view of a DSA module's mask: ``[B, 1, 1, Nk]`` positions -> ``[B, Nk]``."""
    if _is_positions(attention_mask, 4) and attention_mask.shape[1:3] == (1, 1):
        return attention_mask[:, 0, 0]
    return attention_mask


def selected(run, indices: torch.Tensor):
    """Wrap an attention runner ``run(parts, impl, q, k, v, q_pos, k_pos, key_mask, scale, chunk, sink_logits)`` so that
    query ``s`` attends only to the keys ``indices[:, s]`` (``[B, Nq, topk]``, the indexer's choice) among
    those it may see; exact (see the module docstring)."""

    def run_selected(parts, impl, q, k, v, q_pos, k_pos, key_mask, scale, chunk=None, sink_logits=None, _store=None):
        B, H, Nq, _ = q.shape
        Nk = k.shape[2]
        idx = indices.to(device=q.device, dtype=torch.long)  # [B,Nq,K]
        q_index = torch.arange(Nk - Nq, Nk, device=q.device)
        real = key_mask.gather(1, idx.reshape(B, -1)).view(idx.shape)
        n_selected = (real & (idx <= q_index[None, :, None])).sum(-1)  # visible keys selected [B,Nq]
        n_visible = key_mask.long().cumsum(-1)[:, q_index]  # visible keys (real, not after the query)
        rows = torch.nonzero((n_selected < n_visible).any(0)).flatten().tolist()  # queries the selection cuts
        if len(rows) < Nq:
            out = run(parts, impl, q, k, v, q_pos, k_pos, key_mask, scale, chunk, sink_logits)
        else:
            out = q.new_zeros(q.shape[:-1] + (v.shape[-1],))
        per_row = B * k.shape[1] * Nk * (k.shape[-1] + v.shape[-1])
        tile = max(1, TILE_ELEMENTS // max(1, per_row))
        for start in range(0, len(rows), tile):
            r = torch.tensor(rows[start:start + tile], device=q.device)
            out[:, :, r] = _rows(run, parts, impl, q, k, v, q_pos, k_pos, key_mask, idx, r, scale, chunk,
                                 sink_logits)
        return out

    return run_selected


def _rows(run, parts, impl, q, k, v, q_pos, k_pos, key_mask, idx, r, scale, chunk, sink_logits=None):
    """Query rows ``r`` (``T`` of them) in one engine call: row ``j`` of batch ``b`` becomes batch
    ``j * B + b``, with the key mask ``real & selected`` of its own row. Exact for every ``b``: where the
    selection holds all visible keys, ``real & selected`` leaves the same visible keys."""
    B, H, _, D = q.shape
    T, Nk = len(r), k.shape[2]
    sel = torch.zeros(T, B, Nk, dtype=torch.bool, device=q.device)
    sel.scatter_(2, idx[:, r].transpose(0, 1), True)  # [T,B,Nk]
    mask = (sel & key_mask[None]).reshape(T * B, Nk)
    qr = q[:, :, r].permute(2, 0, 1, 3).reshape(T * B, H, 1, D)

    def rep(x):
        return x[None].expand(T, *x.shape).reshape(T * B, *x.shape[1:])

    o = run(parts, impl, qr, rep(k), rep(v), q_pos[:, r].transpose(0, 1).reshape(T * B, 1), rep(k_pos), mask,
            scale, chunk, sink_logits)
    return o.reshape(T, B, H, 1, -1)[:, :, :, 0].permute(1, 2, 0, 3)  # [B,H,T,Dv]
