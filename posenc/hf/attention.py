"""The functions posenc registers with transformers' public interfaces, and the rotary hook.

- mask function ``"posenc"`` (``transformers.masking_utils.AttentionMaskInterface``): hands the attention
  function each key's original position instead of a 4-D mask;
- attention function ``"posenc"`` (``transformers.AttentionInterface``): runs
  :func:`posenc.engine.run_attention` with the layer's own scheme (see :mod:`posenc.hf.layers`);
- :func:`identity_rotation`, a forward hook on every rotary embedding module: the identity rotation, so
  q and k reach attention (and the HF cache) un-rotated. ``(cos, sin)`` tuples become ``(1, 0)`` (GPT-J's
  and CodeGen's ``(sin, cos)``: ``(0, 1)``); a complex ``freqs_cis`` tensor (Llama 4, DeepSeek V2:
  ``view_as_complex`` over adjacent pairs) becomes ``1 + 0j``.
  :func:`guarded_identity_rotation` (what ``extend`` installs) first refuses a forward whose attention
  implementation is no longer ``"posenc"`` (the model would otherwise silently run without positions).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from posenc.hf import keys, sparse

ATTN_NAME = "posenc"


def key_positions_mask(batch_size, q_length=None, kv_length=None, q_offset=0, kv_offset=0, attention_mask=None,
                       device="cpu", **_):
    """Mask interface "posenc": returns original key positions ``[B, kv_length]`` (long, -1 = padding)
    in place of a 4-D mask. Positions count the real tokens of the 2-D mask (left padding -> 0 at the
    first real token), as ``generate()`` does for ``position_ids``."""
    end = kv_offset + kv_length
    if attention_mask is None:
        pos = torch.arange(kv_offset, end, device=device)
        return pos[None].expand(batch_size, -1)
    valid = attention_mask.to(torch.bool)
    if valid.shape[-1] < end:  # keys beyond the 2-D mask (static cache slots) are not real tokens
        valid = torch.nn.functional.pad(valid, (0, end - valid.shape[-1]), value=False)
    pos = valid.long().cumsum(-1) - 1
    pos = torch.where(valid, pos, torch.full_like(pos, -1))
    return pos[:, kv_offset:end]


def _key_positions(query, Nk, attention_mask, kwargs) -> torch.Tensor:
    """Original key positions ``[B, Nk]`` (-1 = padding) from what the mask function returned."""
    B = query.shape[0]
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 \
            and not attention_mask.is_floating_point():
        if attention_mask.shape[-1] < Nk:
            raise ValueError(f"posenc got positions for {attention_mask.shape[-1]} keys but {Nk} keys")
        k_pos_raw = attention_mask[:, -Nk:].to(query.device)  # [B,Nk]; -1 = padding
        return k_pos_raw.expand(B, -1) if k_pos_raw.shape[0] != B else k_pos_raw
    if attention_mask is None:
        pid = kwargs.get("position_ids")
        last = pid[:, -1:] if pid is not None else torch.full((1, 1), Nk - 1, device=query.device)
        return (last.to(query.device) - (Nk - 1) + torch.arange(Nk, device=query.device)).expand(B, -1)
    raise ValueError("posenc attention needs the 2-D padding mask, not a prepared 4-D mask")


def _positions(query, Nk, attention_mask, kwargs):
    """``(q_pos [B,Nq], k_pos [B,Nk], key_mask [B,Nk] or None)``: original positions (padding clamped to 0,
    ``key_mask`` None when no key is padding); queries are the newest keys (self-attention with a growing
    cache). Every layer of one forward gets the same mask tensor from the mask function, so this is computed
    once per forward (:func:`posenc.engine.call.memo_positions`) and every layer passes the engine the same
    position tensors, whose own facts (keys at their indices, a run of queries) the engine then remembers."""
    from posenc.engine.call import memo_positions

    B, Nq = query.shape[0], query.shape[2]

    def compute():
        k_pos_raw = _key_positions(query, Nk, attention_mask, kwargs)
        key_mask = k_pos_raw >= 0  # [B,Nk]
        k_pos = k_pos_raw.clamp(min=0)
        return k_pos[:, -Nq:], k_pos, None if bool(key_mask.all()) else key_mask

    if isinstance(attention_mask, torch.Tensor) and attention_mask.device == query.device:
        return memo_positions(f"hf {B} {Nq} {Nk}", (attention_mask,), compute)
    return compute()


def _layer_parts(state, H, D, window, softcap):
    """The layer's ``AttentionParts`` for this head layout, window and soft-cap (built once, then cached)."""
    from posenc.engine import AttentionParts

    key = (H, D, window, softcap)
    parts = state["parts"].get(key)
    if parts is None:
        scheme = state["scheme"]
        if softcap is not None:  # Gemma 2's attention-logit soft-capping, applied by the engine
            scheme = replace(scheme, softcap=float(softcap))
        if window is not None:  # this layer's own sliding window (Gemma2, Mistral) joins the scheme's mask
            m = scheme.mask
            if m.window is None or window <= m.window:  # the layer's window is the tighter one: sinks
                m = replace(m, window=window, n_sinks=0)  # beyond it are invisible (and HF evicts them)
            scheme = replace(scheme, mask=m)
        parts = AttentionParts(scheme, H, D)
        state["parts"][key] = parts
    return parts


def _rope_first(x: torch.Tensor, n_nope: int) -> torch.Tensor:
    """MLA heads are ``[nope | rope]``; the engine rotates the leading dims: ``[rope | nope]`` (the same
    permutation of q and k leaves every dot product unchanged)."""
    return torch.cat((x[..., n_nope:], x[..., :n_nope]), dim=-1)


def swap_rotary_halves(x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """The two halves of the rotated slice ``x[..., :rotary_dim]`` swapped (the rest passes through).

    NanoChat's ``rotate_half`` is ``cat(x2, -x1)``: it rotates each half-layout pair by ``-theta``. With
    ``S`` this swap, ``R(-theta) = S R(theta) S``, so ``R_m(-) q . R_n(-) k = R_m S q . R_n S k`` (``S`` is
    orthogonal): the engine's ``+theta`` rotation of ``S q`` and ``S k`` gives the same scores. Values are
    untouched, so the output needs no swap back."""
    half = rotary_dim // 2
    return torch.cat((x[..., half:rotary_dim], x[..., :half], x[..., rotary_dim:]), dim=-1)


def posenc_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """Attention function "posenc": un-rotated ``query [B,H,Nq,D]``, ``key [B,Hk,Nk,D]``, ``value
    [B,Hk,Nk,Dv]`` (GQA ok, ``Dv`` may differ: MLA) -> ``(out [B,Nq,H,Dv], None)`` via
    :func:`posenc.engine.run_attention` under the scheme :func:`posenc.hf.extend` stored on the module.

    Per layer (set at ``extend``): ``_posenc_window`` (sliding window), ``_posenc_chunk`` (Llama 4 chunked
    attention: a query sees the keys of its own chunk of positions), ``_posenc_nope`` (MLA: the first
    ``qk_nope_head_dim`` dims of a head are not rotated), ``_posenc_swap_halves`` (NanoChat's ``-theta``
    rotation: :func:`swap_rotary_halves`). Per call: ``indices [B,Nq,topk]`` (DeepSeek sparse attention's
    selection, honoured exactly by :func:`posenc.hf.sparse.selected`) and ``s_aux`` (learned attention
    sinks, one logit per head: GPT-OSS, MiMo-V2-Flash, Granite SWA), which join every softmax denominator
    in the engine."""
    state = getattr(module, "_posenc", None)
    if state is None:
        raise ValueError(f"{type(module).__name__} was not prepared by posenc.hf.extend; "
                         f"config._attn_implementation='posenc' needs extend(model, method)")
    sink_logits = kwargs.get("s_aux")  # learned attention sinks (GPT-OSS, MiMo-V2-Flash): [H] logits
    indices = kwargs.get("indices")  # DeepSeek sparse attention's top-k keys per query: posenc.hf.sparse
    attention_mask = sparse.key_positions(attention_mask)  # a DSA module's [B,1,1,Nk] positions (with or
    # without indices: Dots3's layers without an indexer get them too) -> [B,Nk]; anything else unchanged
    B, H, Nq, D = query.shape
    q_pos, k_pos, key_mask = _positions(query, key.shape[2], attention_mask, kwargs)
    chunk = getattr(module, "_posenc_chunk", None)
    store = None if chunk or indices is not None else keys.store_for(module, key, Nq, k_pos)
    window = kwargs.get("sliding_window") or getattr(module, "_posenc_window", None)
    parts = _layer_parts(state, H, D, int(window) if window else None, kwargs.get("softcap"))
    n_nope = getattr(module, "_posenc_nope", 0)
    if n_nope:
        query, key = _rope_first(query, n_nope), _rope_first(key, n_nope)
    if getattr(module, "_posenc_swap_halves", False) and parts.rotary_dim:
        query, key = swap_rotary_halves(query, parts.rotary_dim), swap_rotary_halves(key, parts.rotary_dim)
    query = _unscale_pass_dims(parts, query, q_pos, k_pos)
    Dv = value.shape[-1]
    if Dv != D:  # the engine takes one head dim: zero-pad v (MLA's v_head_dim), drop the pad after
        value = torch.nn.functional.pad(value, (0, D - Dv)) if Dv < D else value
    run = _run_chunked if chunk else _run_once
    if indices is not None:
        run = sparse.selected(run, indices)
        key_mask = torch.ones_like(k_pos, dtype=torch.bool) if key_mask is None else key_mask  # it reads one
    out = run(parts, state["impl"], query, key, value, q_pos, k_pos, key_mask, scaling, chunk, sink_logits, store)
    return out[..., :Dv].transpose(1, 2).contiguous(), None  # [B,Nq,H,Dv]


def _unscale_pass_dims(parts, query, q_pos, k_pos):
    """transformers multiplies cos and sin by the schedule's attention factor ``a`` (YaRN's mscale,
    LongRoPE's factor), so only the *rotated* dims of q.k get ``a^2``; the engine folds ``a^2`` into the
    whole query. On a partial-rotary layer (MLA, GPT-NeoX, Phi) the pass-through dims of q are divided by
    ``a^2`` first, per query where the schedule is dynamic, so the two agree."""
    rd = parts.rotary_dim
    if parts.rope is None or rd is None or rd >= query.shape[-1]:
        return query
    ells = parts.schedule_lengths(q_pos, k_pos)
    if ells is None:
        a = parts.frequencies(None).attention_scale
        if a == 1.0:
            return query
        inv = torch.full(q_pos.shape, 1.0 / (a * a), dtype=torch.float64, device=query.device)
    else:  # [B,Nq]: the factor of each query's schedule length
        lengths, which = torch.unique(ells, return_inverse=True)
        table = torch.tensor([1.0 / parts.frequencies(int(ell)).attention_scale ** 2 for ell in lengths.tolist()],
                             dtype=torch.float64, device=query.device)
        inv = table[which.to(query.device)]
    inv = inv[:, None, :, None].to(query.dtype)  # [B,1,Nq,1]
    return torch.cat((query[..., :rd], query[..., rd:] * inv), dim=-1)


def _run_once(parts, impl, q, k, v, q_pos, k_pos, key_mask, scale, _chunk=None, sink_logits=None, store=None):
    """One engine call; ``key_mask`` None (no padding) or ``[B,Nk]`` bool; ``store``: the layer's rotated keys
    (:mod:`posenc.hf.keys`), or None."""
    from posenc.engine import run_attention

    if key_mask is not None and bool(key_mask.all()):
        key_mask = None
    return run_attention(parts, q, k, v, q_pos, k_pos, impl=impl, scale=scale, key_mask=key_mask,
                         sink_logits=sink_logits, key_store=store)


def _run_chunked(parts, impl, q, k, v, q_pos, k_pos, key_mask, scale, chunk, sink_logits=None, _store=None):
    """Chunked attention (Llama 4): key n is visible to query m iff ``n // chunk == m // chunk`` (and
    causal), as transformers' ``chunked_overlay`` counts from the first real token. One engine call per
    chunk the queries fall in, with the other chunks' keys masked out."""
    q_chunk = torch.div(q_pos, chunk, rounding_mode="floor")  # [B,Nq]
    k_chunk = torch.div(k_pos, chunk, rounding_mode="floor")  # [B,Nk]
    if key_mask is None:
        key_mask = torch.ones_like(k_pos, dtype=torch.bool)
    out = None
    for c in torch.unique(q_chunk).tolist():
        o = _run_once(parts, impl, q, k, v, q_pos, k_pos, key_mask & (k_chunk == c), scale, None, sink_logits)
        sel = (q_chunk == c)[:, None, :, None]  # [B,1,Nq,1]
        out = torch.where(sel, o, out if out is not None else torch.zeros_like(o))
    return out


def identity_rotation(module, args, output, sin_first: bool = False):
    """Forward hook: the rotary module's output as the identity rotation, of the same shape and dtype.
    ``sin_first``: the module returns ``(sin, cos)`` (GPT-J, CodeGen; :func:`posenc.hf.layers.sin_first`)."""
    if isinstance(output, torch.Tensor) and output.is_complex():  # freqs_cis = r e^{i theta} -> 1
        return torch.ones_like(output)
    if sin_first:
        sin, cos = output
        return torch.zeros_like(sin), torch.ones_like(cos)
    cos, sin = output
    return torch.ones_like(cos), torch.zeros_like(sin)


def guarded_identity_rotation(configs, record: dict, sin_first: bool = False):
    """:func:`identity_rotation` that first checks, on every forward, that the extended attention layers
    still call the attention function ``"posenc"`` (their ``configs``' ``_attn_implementation``).

    Why: q and k reach attention un-rotated, and only posenc's attention function rotates them. After
    ``model.set_attn_implementation("sdpa")`` (or ``config._attn_implementation = "eager"``) transformers'
    own attention would run the model with no position information at all (NoPE), silently. Instead the
    forward raises a ``ValueError`` naming the method (``record``: the model's ``config.posenc``) and how to
    switch back or undo the extension. ``sin_first``: as in :func:`identity_rotation`."""

    def hook(module, args, output):
        for cfg in configs:
            impl = getattr(cfg, "_attn_implementation", ATTN_NAME)
            if impl != ATTN_NAME:
                raise ValueError(
                    f"this model is extended by posenc with method {record.get('method')!r} "
                    f"(params {record.get('params')}), which runs in the attention function {ATTN_NAME!r}; its "
                    f"attention implementation is now {impl!r}, which would run it with no position information "
                    f"(q and k reach attention un-rotated). Switch back with model.set_attn_implementation("
                    f"{ATTN_NAME!r}), or undo the extension with posenc.hf.unextend(model) (or load the model "
                    f"afresh) to use {impl!r}")
        return identity_rotation(module, args, output, sin_first)

    return hook


_REGISTERED = False


def register() -> None:
    """Register the attention and mask functions "posenc" with transformers (once)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, posenc_attention)
    AttentionMaskInterface.register(ATTN_NAME, key_positions_mask)
    _REGISTERED = True
