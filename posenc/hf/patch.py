"""Extend the context of a Hugging Face RoPE model with any posenc inference-time method.

``extend(model, method, **params)`` works on Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2 (its sliding
window layers included), Phi-3, GPT-NeoX (partial rotary) and any model with their attention layout
(``XxxRotaryEmbedding`` module producing ``(cos, sin)``, attention modules that call the function named
by ``config._attn_implementation`` with ``(module, query, key, value, attention_mask, scaling=...)``).

Two paths:

*transformers' own* (``linear``/``pi``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``): the method is
written into ``config.rope_parameters`` (transformers 5.x) and every rotary embedding module is rebuilt
from it, so the behaviour is exactly transformers' (and a saved model loads with plain transformers).

*posenc's engine* (every other method: ntk, ntk_mixed, dynamic_ntk, dynamic_ntk_qwen, dynamic_yarn,
rerope, leaky_rerope, selfextend, logn, sliding_window, lm_infinite, streaming_llm, bca, pcw, "a+b"
combinations, and the methods above with ``native=False``). What is replaced in transformers, and why:

1. the rotary embedding modules return the identity rotation (cos = 1, sin = 0; a forward hook), so
   q and k reach attention *un-rotated* and the HF KV cache stores un-rotated keys. Remaps (ReRoPE,
   SelfExtend, ...) need to rotate keys by a position that depends on the query; dynamic schedules
   need keys rotated with the schedule of the current query. Rotating at read time also fixes HF's
   stale-base dynamic NTK (cached keys keep the base they were rotated with; here they never are).
2. an attention function ``"posenc"`` is registered with ``transformers.AttentionInterface`` and
   selected with ``model.set_attn_implementation("posenc")``; it calls
   :func:`posenc.engine.run_attention` with an ``AttentionParts`` built once per layer.
3. a mask function ``"posenc"`` is registered with ``transformers.AttentionMaskInterface``: instead of
   a 4-D float mask it hands the attention function the *original position of every key*
   (``[B, Nk]`` long, ``-1`` for padding), counted over the real tokens of the 2-D attention mask
   (as ``generate()`` counts ``position_ids``). Queries are the last ``Nq`` keys. So left-padded
   batches, the KV cache and Gemma2/Mistral sliding-window cache layers all get true positions.

Gemma 2's attention-logit soft-capping is passed to the engine (``PositionScheme.softcap``).
Limits of the posenc path: static caches (``cache_implementation="static"``) are not supported
(their unfilled slots follow the queries); on a layer with its own sliding window (Gemma2, Mistral)
the tighter of the two windows applies, and attention sinks (streaming_llm, lm_infinite) of a wider
method window are evicted by HF's sliding cache layer during cached decoding; attention dropout is
ignored (inference-time methods).

The scheme is built from the config (:func:`scheme_from_config`): ``rope_parameters`` (``rope_theta``,
``partial_rotary_factor``, GPT-NeoX's ``rotary_pct``, an existing scaling), half layout, and
``original_max_position_embeddings`` or ``max_position_embeddings`` as ``train_len``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from posenc.scheme.core import PositionScheme, RopeSpec
from posenc.scheme.methods import Method, hf_methods, parse_methods, split_spec

# method name -> transformers rope_type, for the methods extend() hands to transformers' own code
# (derived from the registry, posenc.scheme.methods: records with hf_native)
HF_NATIVE = {name: m.hf_rope_type for name, m in hf_methods().items() if m.hf_native}
ATTN_NAME = "posenc"


# ===================================================================== scheme from a config
def _rope_parameters(config) -> dict:
    rp = getattr(config, "rope_parameters", None) or {}
    if any(isinstance(v, dict) for v in rp.values()):
        raise ValueError("rope_parameters nested per layer type are not supported by posenc.hf.extend")
    return dict(rp)


def train_len_of(config) -> int:
    """Pretraining length: ``original_max_position_embeddings`` (rope parameters or config), else
    ``max_position_embeddings``."""
    rp = _rope_parameters(config)
    n = (rp.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
         or getattr(config, "max_position_embeddings", None))
    if not n:
        raise ValueError("config has no max_position_embeddings; cannot tell the trained length")
    return int(n)


def scheme_from_config(config) -> PositionScheme:
    """The posenc RoPE scheme a HF config trained with: base ``rope_theta``, ``partial_rotary_factor``
    (or GPT-NeoX ``rotary_pct``), half layout, an existing ``rope_type`` kept as ``scaling``,
    ``train_len`` from :func:`train_len_of`."""
    rp = _rope_parameters(config)
    base = rp.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    partial = rp.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is None:
        partial = getattr(config, "rotary_pct", 1.0)
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    scaling = None
    if rope_type != "default":
        scaling = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor", "type")}
        scaling.setdefault("original_max_position_embeddings", train_len_of(config))
    rope = RopeSpec(base=float(base), scaling=scaling, partial_rotary_factor=float(partial))
    return PositionScheme(name="rope", rope=rope, train_len=train_len_of(config))


# ===================================================================== transformers hooks
def _key_positions_mask(batch_size, q_length=None, kv_length=None, q_offset=0, kv_offset=0, attention_mask=None,
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


def posenc_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """Attention function "posenc": un-rotated ``query [B,H,Nq,D]``, ``key/value [B,Hk,Nk,D]`` (GQA ok)
    -> ``(out [B,Nq,H,D], None)`` via :func:`posenc.engine.run_attention` under the scheme that
    :func:`extend` stored on the module."""
    from posenc.engine import AttentionParts, run_attention

    state = getattr(module, "_posenc", None)
    if state is None:
        raise ValueError(f"{type(module).__name__} was not prepared by posenc.hf.extend; "
                         f"config._attn_implementation='posenc' needs extend(model, method)")
    B, H, Nq, D = query.shape
    Nk = key.shape[2]
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 \
            and not attention_mask.is_floating_point():
        if attention_mask.shape[-1] < Nk:
            raise ValueError(f"posenc got positions for {attention_mask.shape[-1]} keys but {Nk} keys")
        k_pos_raw = attention_mask[:, -Nk:].to(query.device)  # [B,Nk]; -1 = padding
        k_pos_raw = k_pos_raw.expand(B, -1) if k_pos_raw.shape[0] != B else k_pos_raw
    elif attention_mask is None:
        pid = kwargs.get("position_ids")
        last = pid[:, -1:] if pid is not None else torch.full((1, 1), Nk - 1)
        k_pos_raw = (last.to(query.device) - (Nk - 1) + torch.arange(Nk, device=query.device)).expand(B, -1)
    else:
        raise ValueError("posenc attention needs the 2-D padding mask, not a prepared 4-D mask")
    key_mask = k_pos_raw >= 0  # [B,Nk]
    k_pos = k_pos_raw.clamp(min=0)
    q_pos = k_pos[:, -Nq:]  # queries are the newest keys (self-attention with a growing cache)
    window = kwargs.get("sliding_window") or getattr(module, "_posenc_window", None)
    window = int(window) if window else None
    softcap = kwargs.get("softcap")
    cache_key = (H, D, window, softcap)
    parts = state["parts"].get(cache_key)
    if parts is None:
        scheme = state["scheme"]
        if softcap is not None:  # Gemma 2's attention-logit soft-capping, applied by the engine
            from dataclasses import replace

            scheme = replace(scheme, softcap=float(softcap))
        if window is not None:  # this layer's own sliding window (Gemma2, Mistral) joins the scheme's mask
            from dataclasses import replace

            m = scheme.mask
            if m.window is None or window <= m.window:  # the layer's window is the tighter one: sinks
                m = replace(m, window=window, n_sinks=0)  # beyond it are invisible (and HF evicts them)
            scheme = replace(scheme, mask=m)
        parts = AttentionParts(scheme, H, D)
        state["parts"][cache_key] = parts
    out = run_attention(parts, query, key, value, q_pos, k_pos, impl=state["impl"], scale=scaling,
                        key_mask=None if bool(key_mask.all()) else key_mask)
    return out.transpose(1, 2).contiguous(), None  # [B,Nq,H,D]


_REGISTERED = False


def _register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, posenc_attention)
    AttentionMaskInterface.register(ATTN_NAME, _key_positions_mask)
    _REGISTERED = True


def _identity_rotation(module, args, output):
    cos, sin = output
    return torch.ones_like(cos), torch.zeros_like(sin)


def _rotary_modules(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]


def _attention_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]


_SLIDING_LAYER_TYPES = ("sliding_attention", "hybrid_sliding", "reference_sliding_attention")


def layer_window(config, module) -> int | None:
    """The sliding window of one attention layer, as transformers' ``DynamicCache`` decides it (its
    sliding cache layers keep only the last ``window - 1`` keys): the module's own ``sliding_window``
    if it has one, else ``config.layer_types[layer_idx]`` names a sliding layer, else (no
    ``layer_types``) ``config.sliding_window`` applies to every layer. Models whose attention ignores
    ``sliding_window`` while their cache truncates (Phi-MoE, Moshi) thus get one meaning, cached or not."""
    own = getattr(module, "sliding_window", None)
    if own:
        return int(own)
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    types = getattr(config, "layer_types", None)
    if types is None:
        return int(window)
    idx = module.layer_idx
    return int(window) if idx < len(types) and types[idx] in _SLIDING_LAYER_TYPES else None


def _set_module(model, name: str, new) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


# ===================================================================== extend
def _head_dim(config) -> int:
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    heads = getattr(config, "num_attention_heads", None)
    if not heads or not getattr(config, "hidden_size", None):
        raise ValueError("config has neither head_dim nor hidden_size and num_attention_heads")
    return int(config.hidden_size) // int(heads)


def check_rope_parameters(config, rope_parameters: dict) -> None:
    """Validate a ``rope_parameters`` dict for ``config`` the way posenc's own path does: build the
    frequencies with :func:`posenc.parts.frequencies.rope_frequencies` (which refuses unknown keys, a factor
    < 1, NaN/inf, strings, ``low_freq_factor >= high_freq_factor``, ``beta_fast <= beta_slow``, LongRoPE
    lists of the wrong length, ...) inside and past the trained length, and require a finite attention
    scale > 0 (YaRN's ``mscale``/``mscale_all_dim``/``attention_factor``). Raises ``ValueError``."""
    from posenc.parts.frequencies import rope_frequencies

    base = scheme_from_config(config).rope
    partial = rope_parameters.get("partial_rotary_factor", base.partial_rotary_factor)
    train = train_len_of(config)
    lengths = {"original_max_position_embeddings": train,  # as scheme_from_config and transformers read them
               "max_position_embeddings": getattr(config, "max_position_embeddings", None) or train}
    rope_parameters = {**lengths, **rope_parameters}
    for seq_len in (train, 4 * train):  # dynamic / LongRoPE schedules switch branches past train
        freqs = rope_frequencies(_head_dim(config), base.base, rope_parameters, seq_len=seq_len,
                                 partial_rotary_factor=partial)
        scale = freqs.attention_scale
        if not (scale > 0 and scale < float("inf")):
            raise ValueError(f"rope_parameters give attention scale {scale} at length {seq_len}; it must be "
                             "finite and > 0 (check mscale, mscale_all_dim, attention_factor)")


def _extend_native(model, method: Method, params: dict):
    """transformers' own method: validate the new ``rope_parameters``, then (only then) write them into
    the model's own config and rebuild every rotary embedding module from it."""
    rope_type = method.hf_rope_type
    rp = _rope_parameters(model.config)
    if rp.get("rope_type", "default") != "default":
        raise ValueError(f"model already uses rope_type {rp['rope_type']!r}; frequency schedules do not stack")
    new = {**rp, **method.filled_defaults(), **params, "rope_type": rope_type}
    if method.hf_original_len:
        new.setdefault("original_max_position_embeddings", train_len_of(model.config))
    factor = method.param("factor")
    if factor is not None and factor.required and "factor" not in new:
        raise ValueError(f"method {rope_type!r} needs factor (target length / trained length)")
    check_rope_parameters(model.config, new)
    config = _own_config(model)
    config.rope_parameters = new
    try:
        rebuilt = []
        for name, mod in _rotary_modules(model):
            ref = next(iter(mod.buffers()), None)
            new_mod = type(mod)(config)
            rebuilt.append((name, new_mod.to(ref.device) if ref is not None else new_mod))
    except Exception:
        config.rope_parameters = rp  # nothing was swapped yet: the model is as it was
        raise
    for name, new_mod in rebuilt:
        _set_module(model, name, new_mod)
    return model


def _own_config(model):
    """Give ``model`` a private deep copy of its config, in every submodule that holds it (or one of its
    sub-configs), so that extending one model never changes another built from the same config object."""
    from transformers import PretrainedConfig

    memo: dict = {}
    new = copy.deepcopy(model.config, memo)
    for mod in model.modules():
        for attr, value in list(vars(mod).items()):
            if isinstance(value, PretrainedConfig) and id(value) in memo:
                setattr(mod, attr, memo[id(value)])
    return new


def _check_extendable(model) -> None:
    """Refuse a model posenc has already extended, and one without RoPE (GPT-2, BERT: nothing to extend)."""
    done = getattr(model, "_posenc_extended", None) or getattr(model.config, "posenc", None)
    if done:
        raise ValueError(f"model is already extended by posenc ({done}); load a fresh model to apply another "
                         "method (methods do not stack)")
    if not _rotary_modules(model):
        raise ValueError(f"{type(model).__name__} has no rotary embedding module (XxxRotaryEmbedding): "
                         "posenc.hf.extend needs a RoPE model (Llama, Mistral, Qwen, Gemma, Phi-3, GPT-NeoX, ...)")


def extend(model, method: str = "none", *, native: bool | None = None, impl: str = "auto", **params):
    """Apply ``method`` (``"none"``, any ``posenc.scheme.METHODS`` name or ``"a+b"``, ``"linear"``,
    ``"dynamic"``, ``"longrope"``) with ``params`` to a HF causal LM in place; returns the model.

    Methods transformers implements (records with ``hf_native``, :data:`HF_NATIVE`) use transformers' own code unless
    ``native=False``; everything else runs posenc's engine (``impl`` as in
    :func:`posenc.engine.run_attention`). See the module docstring for what is replaced and why.
    The method is recorded in ``config.posenc`` (posenc path) or ``config.rope_parameters`` (native).

    Everything is validated before anything changes (a refused call leaves model and config as they
    were, so a corrected retry works), and the model first gets its own deep copy of its config: other
    models built from the same config object are not touched. Refused: a model without RoPE (GPT-2,
    BERT), a model posenc already extended, bad parameters (``ValueError``/``TypeError``).
    """
    if not isinstance(method, str):
        raise TypeError(f"method must be a string such as 'yarn' or 'rerope+logn', got {type(method).__name__}")
    methods = parse_methods(method, hf=True)  # ValueError for an empty or unknown name
    if all(m.is_identity for m in methods):
        if params:
            raise ValueError(f"method 'none' takes no parameters, got {sorted(params)}")
        return model
    _check_extendable(model)
    if len(methods) == 1 and methods[0].hf_native and native is not False:
        _extend_native(model, methods[0], params)
        model._posenc_extended = {"method": method, "params": dict(params), "native": True}
        return model
    bad = [m.name for m in methods if m.apply is None]
    if bad:
        raise ValueError(f"unknown method(s) {bad} on posenc's path (transformers alone implements them: not "
                         f"in a composition, not with native=False); known: {sorted(hf_methods())}")
    from posenc.engine import IMPLS

    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    # the names as given, but transformers' alias "linear" as posenc's "pi"
    names = "+".join(n if m.is_identity else m.name for n, m in zip(split_spec(method), methods))
    scheme = scheme_from_config(model.config).extend(names, **params)  # validates everything
    attn = _attention_modules(model)
    if not attn:
        raise ValueError(f"{type(model).__name__}: found no attention layers with layer_idx")
    _register()
    config = _own_config(model)
    state = {"scheme": scheme, "impl": impl, "parts": {}}
    for m in attn:
        m._posenc = state
        m._posenc_window = layer_window(config, m)
    model._posenc_hooks = [m.register_forward_hook(_identity_rotation) for _, m in _rotary_modules(model)]
    model._posenc_original_attn = config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    config.posenc = {"method": method, "params": dict(params), "impl": impl, "native": native}
    model._posenc_extended = config.posenc
    return model


def posenc_scheme(model) -> PositionScheme | None:
    """The scheme the posenc path runs (None for untouched or natively extended models)."""
    for m in _attention_modules(model):
        if getattr(m, "_posenc", None):
            return m._posenc["scheme"]
    return None


# ===================================================================== save / load
def save(model, out, tokenizer=None) -> Path:
    """``save_pretrained`` that writes a config plain transformers loads (its own attention), with the
    posenc method in a ``posenc`` section that :func:`load` re-applies."""
    out = Path(out)
    orig = getattr(model, "_posenc_original_attn", None)
    if orig is not None:
        model.config._attn_implementation = orig
    try:
        model.save_pretrained(out)
    finally:
        if orig is not None:
            model.config._attn_implementation = ATTN_NAME
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def load(path, **kwargs):
    """Load a model dir with transformers and re-apply its ``posenc`` config section, if any."""
    from transformers import AutoModelForCausalLM

    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"model dir {str(path)!r} has no config.json (expected a folder written by save_pretrained)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ValueError(f"could not load the model in {str(path)!r}: {exc}") from exc
    spec = getattr(model.config, "posenc", None)
    if spec:
        del model.config.posenc
        extend(model, spec["method"], native=spec.get("native"), impl=spec.get("impl", "auto"),
               **spec.get("params", {}))
    return model.eval()
