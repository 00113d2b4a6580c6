"""Extend the context of a Hugging Face RoPE model with any posenc inference-time method: :func:`extend`,
:func:`unextend`, :func:`save`, :func:`load`, and the scheme a config describes (:func:`scheme_from_config`).

Two paths, chosen by the method's record (:attr:`posenc.methods.Method.hf_native`):

- *transformers' own* (the records with ``hf_native``, unless ``native=False``): the schedule is written into
  ``config.rope_parameters``, ``max_position_embeddings`` becomes the trained length x ``factor`` (not for dynamic
  NTK, which transformers reads as the trained length) and every rotary module is rebuilt from it: exactly
  transformers' behaviour, and a saved model loads with plain transformers, vLLM or a llama.cpp conversion.
- *posenc's engine* (every other method, ``"a+b"`` compositions, and the native ones with ``native=False``): the
  rotary modules return the identity rotation (q and k reach attention and the cache un-rotated, so a remap or a
  dynamic schedule rotates each key for the query that reads it), an attention function ``"posenc"`` runs
  :func:`posenc.engine.run_attention` with each layer's parts, and a mask function ``"posenc"`` hands it each key's
  original position (``-1`` for padding). Switching such a model to another attention implementation is refused
  on its next forward (it would run without positions); :func:`unextend` removes the extension.
  ``extend(model, "none", native=False)`` is the *identity path*: the untouched model, every layer on the engine.
  On a local/global hybrid (Gemma 3) it is what makes long prefills affordable: the local layers' sliding windows
  run on the engine's windowed kernel (keys within the window only, memory linear in the length), where
  transformers masks a full attention matrix.

Everything is validated before anything changes, and the model gets its own copy of its config. Refused: a model
without RoPE, one posenc already extended, a family whose attention posenc cannot reproduce
(:mod:`posenc.hf.layers`), bad parameters. Limits of the engine path: no static caches; on a layer with its own
sliding window the tighter window applies and a wider method window's sinks are evicted by transformers' sliding
cache layer; attention dropout is ignored. Which families work, the per-layer rules and how a model is saved:
``docs/guides/hf.md``.
"""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import replace
from pathlib import Path

from posenc.hf import keys, sparse
from posenc.hf.attention import ATTN_NAME, guarded_identity_rotation, register
from posenc.hf.layers import (
    NEGATED_LAYOUT,
    check_family,
    check_local_targets,
    interface_modules,
    is_nested,
    layer_chunk,
    layer_type_of,
    layer_window,
    mla_nope_dims,
    probe_layout,
    rope_parameters,
    sin_first,
    target_types,
    uses_rope,
)
from posenc.methods import Method, hf_methods, parse_methods, split_spec
from posenc.scheme.core import PositionScheme, RopeSpec

# method name -> transformers rope_type, for the methods extend() hands to transformers' own code
# (derived from the registry, posenc.methods: records with hf_native)
HF_NATIVE = {name: m.hf_rope_type for name, m in hf_methods().items() if m.hf_native}
__all__ = ["ATTN_NAME", "HF_NATIVE", "applied_params", "extend", "layer_window", "load", "posenc_scheme", "save",
           "scheme_from_config", "train_len_of", "unextend"]


# ===================================================================== scheme from a config
def _rope_parameters(config, layer_type: str | None = None) -> dict:
    return dict(rope_parameters(config, layer_type) or {})


def train_len_of(config) -> int:
    """Pretraining length: ``original_max_position_embeddings`` (rope parameters or config), else
    ``max_position_embeddings``, else ``attention_window_size``.

    The last is for models whose attention is local only and whose config states no length
    (RecurrentGemma / Griffin: every attention layer sees the last ``attention_window_size`` keys,
    the recurrent layers carry the rest): the window is the largest relative distance its RoPE was
    trained on, which is what a position method's trained length stands for."""
    rp = _rope_parameters(config)
    n = (rp.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
         or getattr(config, "max_position_embeddings", None) or getattr(config, "attention_window_size", None))
    if not n:
        raise ValueError("config has no max_position_embeddings; cannot tell the trained length")
    return int(n)


def scheme_from_config(config, layer_type: str | None = None) -> PositionScheme:
    """The posenc RoPE scheme a HF config trained with: base ``rope_theta``, ``partial_rotary_factor``
    (or GPT-NeoX ``rotary_pct``, or GPT-J / CodeGen ``rotary_dim`` over the head), half layout, an existing
    ``rope_type`` kept as ``scaling``, ``train_len`` from :func:`train_len_of`. On a model with rope parameters
    per layer type, those of ``layer_type`` (default ``"full_attention"``); a layer type without RoPE gives a
    NoPE scheme."""
    if is_nested(config) and rope_parameters(config, layer_type) is None:
        return PositionScheme(name="nope", train_len=train_len_of(config))
    rp = _rope_parameters(config, layer_type)
    base = rp.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    partial = rp.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is None:
        partial = getattr(config, "rotary_pct", None)
    if partial is None and not hasattr(config, "rope_parameters") and getattr(config, "rotary_dim", None):
        # GPT-J, CodeGen: the first rotary_dim dims of each head rotate (a config without rope parameters;
        # MiniMax-M3's rotary_dim is unused, its model reads rope_parameters)
        rd, hd = int(config.rotary_dim), _head_dim(config)
        partial = rd / hd if int(hd * (rd / hd)) == rd else (rd + 0.5) / hd  # int(hd * partial) is rd
    if partial is None:
        partial = 1.0
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    scaling = None
    if rope_type != "default":
        scaling = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor", "type")}
        scaling.setdefault("original_max_position_embeddings", train_len_of(config))
        if "factor" not in scaling and getattr(config, "max_position_embeddings", None):
            # a schedule given without "factor" takes it as max_position_embeddings / original, as
            # transformers does (Phi-3.5's LongRoPE: 131072 / 4096 -> attention factor sqrt(1 + ln 32 / ln 4096))
            scaling.setdefault("max_position_embeddings", int(config.max_position_embeddings))
    if rope_type == "proportional":  # Gemma 4 / LFM 3: zero frequencies past the rotated share, whole head
        scaling["partial_rotary_factor"], partial = float(partial), 1.0
    rope = RopeSpec(base=float(base), scaling=scaling, partial_rotary_factor=float(partial))
    return PositionScheme(name="rope", rope=rope, train_len=train_len_of(config))


def _rotary_modules(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]


def _attention_modules(model):
    """Attention layers: modules with a ``layer_idx`` named ``XxxAttention`` or ``XxxMLA`` (LongCat)."""
    return [m for m in model.modules() if type(m).__name__.endswith(("Attention", "MLA")) and hasattr(m, "layer_idx")]


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


def check_rope_parameters(config, rope_parameters: dict, layer_type: str | None = None) -> None:
    """Validate a ``rope_parameters`` dict for ``config`` the way posenc's own path does: build the
    frequencies with :func:`posenc.parts.frequencies.rope_frequencies` (which refuses unknown keys, a factor
    < 1, NaN/inf, strings, ``low_freq_factor >= high_freq_factor``, ``beta_fast <= beta_slow``, LongRoPE
    lists of the wrong length, ...) inside and past the trained length, and require a finite attention
    scale > 0 (YaRN's ``mscale``/``mscale_all_dim``/``attention_factor``). Raises ``ValueError``."""
    from posenc.parts.frequencies import rope_frequencies

    base = scheme_from_config(config, layer_type).rope
    if base is None:
        raise ValueError(f"layer type {layer_type!r} has no RoPE: nothing for a frequency schedule to change")
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


def _native_parameters(config, method: Method, params: dict, layer_type: str | None) -> dict:
    """The new flat ``rope_parameters`` of one layer type (validated)."""
    rope_type = method.hf_rope_type
    rp = dict((config.rope_parameters or {})[layer_type] if layer_type else (config.rope_parameters or {}))
    if rp.get("rope_type", "default") != "default":
        raise ValueError(f"model already uses rope_type {rp['rope_type']!r}; frequency schedules do not stack")
    new = {**rp, **method.filled_defaults(), **params, "rope_type": rope_type}
    if method.hf_original_len:
        new.setdefault("original_max_position_embeddings", train_len_of(config))
    factor = method.param("factor")
    if factor is not None and factor.required and "factor" not in new:
        raise ValueError(f"method {rope_type!r} needs factor (target length / trained length)")
    check_rope_parameters(config, {k: v for k, v in new.items() if k != "llama_4_scaling_beta"}, layer_type)
    return new


def _new_rope_parameters(config, method: Method, params: dict, targets: tuple[str, ...] | None) -> dict:
    """The ``rope_parameters`` a transformers-native ``method`` writes (validated; per layer type: those of the
    ``targets`` types)."""
    old = config.rope_parameters
    if is_nested(config):
        new = dict(old)
        for t in targets or [t for t, v in old.items() if v is not None]:
            new[t] = _native_parameters(config, method, params, t)
        return new
    if targets is not None:
        raise ValueError("layer_types with a transformers-native method needs rope_parameters per layer type "
                         "(a model whose layers share one rotary schedule); use native=False")
    return _native_parameters(config, method, params, None)


def _native_refusal(config, method: Method, params: dict, targets) -> str | None:
    """Why transformers' own config class refuses ``method``'s schedule for this family (its ``validate``, run
    by ``save_pretrained``: Phi-3 accepts only ``longrope``), or None. Checked before anything changes, so a
    model is never extended into a form that cannot be saved. Bad parameters raise ``ValueError`` here."""
    new = _new_rope_parameters(config, method, params, targets)
    validate = getattr(config, "validate", None)
    if validate is None:
        return None
    trial = copy.deepcopy(config)
    trial.rope_parameters = new
    try:
        validate.__func__(trial)
    except Exception as exc:  # transformers' strict-dataclass validation error: not a ValueError subclass
        reason = str(exc).strip().splitlines()[-1].strip()
        return (f"{type(config).__name__} does not accept rope_type {method.hf_rope_type!r} ({reason}): transformers "
                f"could not save or reload the model; use posenc's engine (native=False, posenc extend --native no)")
    return None


def _extend_native(model, method: Method, params: dict, targets: tuple[str, ...] | None):
    """transformers' own method: validate the new ``rope_parameters`` (per layer type: those of the
    ``targets`` types), then (only then) write them into the model's own config and rebuild every rotary
    embedding module from it."""
    old = model.config.rope_parameters
    new = _new_rope_parameters(model.config, method, params, targets)
    config = _own_config(model)
    undo = {"rope_parameters": copy.deepcopy(old), "max_position_embeddings": config.max_position_embeddings,
            "original_max_position_embeddings": getattr(config, "original_max_position_embeddings", None)}
    trained = train_len_of(config)
    config.rope_parameters = new
    config.max_position_embeddings = _extended_length(config, method, new, undo["max_position_embeddings"])
    if config.max_position_embeddings != undo["max_position_embeddings"] and not method.hf_original_len:
        config.original_max_position_embeddings = trained  # where the trained length stays readable (train_len_of)
    try:
        _rebuild_rotary(model, config)
    except Exception:  # nothing was swapped yet: the model is as it was
        _restore_lengths(config, old, undo)
        raise
    model._posenc_undo = undo
    return model


def _extended_length(config, method: Method, new: dict, current):
    """``max_position_embeddings`` after a native frequency schedule: the trained length x ``factor`` (the
    largest over the layer types), so that runtimes that read it (vLLM, transformers' generation limits) serve
    the extended length; never lowered. A dynamic schedule keeps it: transformers' dynamic NTK reads
    ``max_position_embeddings`` as the trained length."""
    if method.dynamic or not current:
        return current
    dicts = [v for v in new.values() if isinstance(v, dict)] if is_nested(config) else [new]
    factors = [float(d["factor"]) for d in dicts if isinstance(d.get("factor"), (int, float))]
    if not factors:
        return current
    return max(int(current), int(round(train_len_of(config) * max(factors))))


def _restore_lengths(config, rope_parameters, undo: dict) -> None:
    config.rope_parameters = rope_parameters
    config.max_position_embeddings = undo["max_position_embeddings"]
    if undo["original_max_position_embeddings"] is None:
        if "original_max_position_embeddings" in vars(config):
            del config.original_max_position_embeddings
    else:
        config.original_max_position_embeddings = undo["original_max_position_embeddings"]


def _rebuild_rotary(model, config) -> None:
    """Every rotary embedding module rebuilt from ``config`` (all built before any is swapped in), and the
    softmax scales that depend on the rope parameters refreshed."""
    rebuilt = []
    for name, mod in _rotary_modules(model):
        ref = next(iter(mod.buffers()), None)
        new_mod = type(mod)(config)
        rebuilt.append((name, new_mod.to(ref.device) if ref is not None else new_mod))
    for name, new_mod in rebuilt:
        _set_module(model, name, new_mod)
    _refresh_softmax_scales(model, config)


def _refresh_softmax_scales(model, config) -> None:
    """Attention modules that derive their softmax scale from ``rope_parameters`` when built (DeepSeek's
    YaRN ``mscale_all_dim``: ``scaling = d^-0.5 * mscale^2``) get the scale a module built from the new
    config has (built on the meta device: no weights allocated)."""
    import torch

    for m in _attention_modules(model):
        if not isinstance(getattr(m, "scaling", None), float):
            continue
        try:
            with torch.device("meta"):
                fresh = type(m)(config, m.layer_idx)
        except (TypeError, ValueError, AttributeError, KeyError, RuntimeError):  # another constructor signature
            continue
        if isinstance(getattr(fresh, "scaling", None), float):
            m.scaling = fresh.scaling


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


def _layer_scheme(config, module, layout: str, targets, names: str, params: dict) -> tuple[tuple, object]:
    """``(key, build)`` for one attention layer: layers with equal keys share one scheme. The base
    scheme reproduces what transformers computes for the layer (its type's rope parameters, NoPE,
    MLA's rotated slice, complex rotary's interleaved pairs); the method is added where it applies."""
    ltype = layer_type_of(config, module) if is_nested(config) else None
    rope = uses_rope(config, module)
    nope = mla_nope_dims(module) if rope else 0
    applies = rope and (targets is None or layer_type_of(config, module) in targets)
    key = (ltype, rope, nope, int(getattr(module, "qk_rope_head_dim", 0) or 0), applies)

    def build() -> PositionScheme:
        base = scheme_from_config(config, ltype)
        if not rope or base.rope is None:
            return PositionScheme(name="nope", train_len=train_len_of(config))
        spec = replace(base.rope, layout="half" if layout == NEGATED_LAYOUT else layout)
        if nope:  # MLA: rotate qk_rope_head_dim of nope + rope dims (+0.5: int() of the product is exact)
            dims = nope + int(module.qk_rope_head_dim)
            spec = replace(spec, partial_rotary_factor=(int(module.qk_rope_head_dim) + 0.5) / dims)
        base = replace(base, rope=spec)
        return base.extend(names, hf=True, **params) if applies else base

    return key, build


def _prepare_layers(model, config, attn, names: str, params: dict, targets, impl: str) -> list[dict]:
    """One state (scheme, impl, parts cache) per distinct layer key; validates every scheme. A state's
    ``swap_halves``: the model rotates by ``-theta`` (:data:`NEGATED_LAYOUT`) and the layer has RoPE."""
    layout = probe_layout([m for _, m in _rotary_modules(model)], attn)
    states: dict = {}
    per_layer = []
    for m in attn:
        key, build = _layer_scheme(config, m, layout, targets, names, params)
        if key not in states:
            scheme = build()
            states[key] = {"scheme": scheme, "impl": impl, "parts": {}, "applies": key[-1],
                           "swap_halves": layout == NEGATED_LAYOUT and scheme.rope is not None}
        if states[key]["scheme"].layers is not None:  # a per-layer method (DuoAttention's heads): this layer's own
            key = (key, m.layer_idx)
            if key not in states:
                scheme = states[key[0]]["scheme"].layer(m.layer_idx)
                states[key] = {**states[key[0]], "scheme": scheme, "parts": {},
                               "swap_halves": layout == NEGATED_LAYOUT and scheme.rope is not None}
        per_layer.append(states[key])
    if not any(st["applies"] for st in per_layer):
        rope_types = sorted({layer_type_of(config, m) for m in attn if uses_rope(config, m)})
        raise ValueError(f"{type(model).__name__}: the method applies to no attention layer with RoPE "
                         f"(layer_types {list(targets) if targets else None}); layer types with RoPE: "
                         f"{rope_types} (choose with layer_types=...)")
    return per_layer


def default_dynamic_step(train_len: int) -> int:
    """The step a dynamic schedule (dynamic NTK, dynamic YaRN, Qwen's dynamic NTK) gets through :func:`extend`
    when none is given: ``train_len // 16`` (512 on a model trained at 8192), at least 1.

    Why: with ``step=1`` (the exact per-token form, :func:`posenc.methods._dynamic`) every query past the
    trained length has its own schedule, so the engine runs one attention call per query position and layer:
    on SmolLM2 one layer at 16k took more than 9 minutes. With the step, queries ``ceil((m + 1) / step) * step``
    apart share one schedule, one call per ``step`` queries; a query's schedule is that of a length at most
    ``step`` longer than its own, i.e. at most 1/16 of the trained length (6%) longer past it, and cached
    decoding still equals the full forward. Pass ``step=1`` for the exact form."""
    return max(1, int(train_len) // 16)


def extend(model, method: str = "none", *, native: bool | None = None, impl: str = "auto",
           layer_types=None, target_length: int | None = None, rotated_keys: bool = True, **params):
    """Apply ``method`` (``"none"``, any ``posenc.scheme.METHODS`` name or ``"a+b"``, ``"linear"``,
    ``"dynamic"``, ``"longrope"``) with ``params`` to a HF causal LM in place; returns the model.

    Methods transformers implements (records with ``hf_native``, :data:`HF_NATIVE`) use transformers' own code unless
    ``native=False``; everything else runs posenc's engine (``impl`` as in
    :func:`posenc.engine.run_attention`). See the module docstring for what is replaced and why.
    The method is recorded in ``config.posenc`` (posenc path) or ``config.rope_parameters`` (native).

    ``layer_types`` (names from ``config.layer_types``) chooses the layers the method applies to; default
    (:func:`posenc.hf.layers.default_target_types`): on models with rope parameters per layer type the
    global layer types that have RoPE (Gemma 3's recipe: ``("full_attention",)``), or, where no global
    layer has RoPE (Beam), the types that have it; else every RoPE layer. The other layers keep what
    transformers computes for them (:mod:`posenc.hf.layers`).

    ``target_length``: the length to read; the parameters not given take each method's rule for it
    (:func:`posenc.methods.length_defaults`, what ``posenc schemes`` states: YaRN's factor = target / trained, ...),
    and it is recorded with the method (:func:`save` writes it to ``posenc.json``).

    ``rotated_keys`` (posenc's engine only): each layer keeps its cached keys as the method's key rotations turn
    them, so a decode step rotates only its new key (:mod:`posenc.hf.keys`); the memory is a copy of the keys per
    rotation that reads the whole context. ``False``: the lean form, which rotates every key it reads at every step.

    Everything is validated before anything changes (a refused call leaves model and config as they
    were, so a corrected retry works), and the model first gets its own deep copy of its config: other
    models built from the same config object are not touched. Refused: a model without RoPE (GPT-2,
    BERT), a model posenc already extended, a family whose attention posenc cannot reproduce, bad
    parameters (``ValueError``/``TypeError``).
    """
    if not isinstance(method, str):
        raise TypeError(f"method must be a string such as 'yarn' or 'rerope+logn', got {type(method).__name__}")
    if not isinstance(rotated_keys, bool):
        raise TypeError(f"rotated_keys must be True or False, got {rotated_keys!r}")
    methods = parse_methods(method, hf=True)  # ValueError for an empty or unknown name
    identity = all(m.is_identity for m in methods)
    if identity:
        if params or layer_types is not None or target_length is not None:
            raise ValueError(f"method 'none' takes no parameters, got {sorted(params)}")
        if native is not False:
            return model
        # native=False: the untouched model on posenc's engine (the identity path: a hybrid's local layers read
        # only their window, in memory linear in the length)
    _check_extendable(model)
    targets = target_types(model.config, layer_types)
    if layer_types is not None:
        check_local_targets(model.config, _attention_modules(model), targets, method, train_len_of(model.config))
    record = {"method": method, "params": dict(params)}
    if target_length is not None:
        params = {**_length_params(model.config, method, target_length), **params}
        record = {"method": method, "params": dict(params), "target_length": int(target_length)}
    if layer_types is not None:
        record["layer_types"] = list(targets)
    if not identity and len(methods) == 1 and methods[0].hf_native and native is not False:
        refusal = _native_refusal(model.config, methods[0], params, targets)
        if refusal is None:
            _extend_native(model, methods[0], params, targets)
            model._posenc_extended = {**record, "native": True}
            return model
        if native is True or methods[0].apply is None:
            raise ValueError(refusal)
        # native="auto" and transformers' config refuses the schedule for this family: posenc's engine runs it
    bad = [m.name for m in methods if m.apply is None and not m.is_identity]
    if bad:
        raise ValueError(f"unknown method(s) {bad} on posenc's path (transformers alone implements them: not "
                         f"in a composition, not with native=False); known: {sorted(hf_methods())}")
    from posenc.engine import IMPLS

    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if any(m.dynamic for m in methods) and "step" not in params:
        params = {**params, "step": default_dynamic_step(train_len_of(model.config))}
        record["params"] = dict(params)  # the step it runs with, in config.posenc too
    # the names as given, but transformers' alias "linear" as posenc's "pi"
    names = "+".join(n if m.is_identity else m.name for n, m in zip(split_spec(method), methods))
    attn = _attention_modules(model)
    if not attn:
        raise ValueError(f"{type(model).__name__}: found no attention layers with layer_idx (a model whose "
                         "layers are all linear attention or recurrent has no RoPE attention to extend)")
    check_family(model, attn)
    attn = interface_modules(attn)
    sparse.check(attn, [m for _, m in _rotary_modules(model)])
    per_layer = _prepare_layers(model, model.config, attn, names, params, targets, impl)  # validates everything
    register()
    config = _own_config(model)
    for m, state in zip(attn, per_layer):
        m._posenc = state
        m._posenc_window = layer_window(config, m)
        m._posenc_chunk = layer_chunk(config, m)
        m._posenc_nope = mla_nope_dims(m) if uses_rope(config, m) else 0
        m._posenc_swap_halves = state["swap_halves"]
    config.posenc = {**record, "impl": impl, "native": native}
    # the configs the extended layers read their attention implementation from (own copies by now)
    configs = list({id(c): c for c in (getattr(m, "config", None) for m in attn) if hasattr(c, "_attn_implementation")
                    }.values()) or [config]
    # a switch away from "posenc" raises, not NoPE
    model._posenc_hooks = [m.register_forward_hook(guarded_identity_rotation(configs, config.posenc, sin_first(m)))
                           for _, m in _rotary_modules(model)]
    model._posenc_hooks += sparse.install(attn, [m for _, m in _rotary_modules(model)])  # DSA's indexer
    if rotated_keys:
        model._posenc_hooks += keys.install(attn)
    model._posenc_original_attn = config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    model._posenc_extended = config.posenc
    return model


def _length_params(config, method: str, target_length) -> dict:
    """The parameters each method of ``method`` takes to read ``target_length`` tokens with this model (its trained
    length, head size and RoPE base), by the registry's rules."""
    from posenc._util import check_positive_int
    from posenc.methods import length_defaults

    target_length = check_positive_int("target_length", target_length)
    train_len = train_len_of(config)
    if target_length < train_len:
        raise ValueError(f"target_length {target_length} is below the trained length {train_len}: nothing to extend")
    rope = scheme_from_config(config).rope
    return {k: v for k, v in length_defaults(method, train_len, target_length, head_dim=_head_dim(config),
                                              base=float(rope.base) if rope else 10000.0, hf=True).items()
            if v is not None}


def applied_params(model) -> dict:
    """Every parameter of the method ``model`` runs with (``{}`` for an untouched model): the model's own
    ``rope_parameters`` for a method transformers runs, else the given ones with the defaults the methods fill."""
    record = getattr(model, "_posenc_extended", None)
    if not record:
        return {}
    defaults: dict = {}
    for m in parse_methods(record["method"], hf=True):
        defaults.update({k: v for k, v in m.filled_defaults(train_len_of(model.config)).items() if v is not None})
    rp = getattr(model.config, "rope_parameters", None)
    if record.get("native") is True and isinstance(rp, dict):  # what transformers' rope_parameters hold
        flat = next((v for v in rp.values() if isinstance(v, dict) and v.get("rope_type", "default") != "default"),
                    rp) if is_nested(model.config) else rp
        return {**defaults, **{k: v for k, v in flat.items() if k not in ("rope_theta", "rope_type")}}
    return {**defaults, **record.get("params", {})}


def _saved_record(model) -> dict | None:
    """The ``posenc.json`` of an extended model (:mod:`posenc.hf.saved`), or None for an untouched one."""
    from posenc._version import __version__

    record = getattr(model, "_posenc_extended", None)
    if not record:
        return None
    trained = train_len_of(model.config)
    resolved = {p.name: p.default_for(trained) for m in parse_methods(record["method"], hf=True) for p in m.params
                if p.default_for(trained) is not None}  # every parameter: the ones left at their default too
    resolved.update(applied_params(model))
    target = record.get("target_length")
    if target is None and isinstance(resolved.get("factor"), (int, float)) and resolved["factor"] >= 1:
        target = int(round(trained * float(resolved["factor"])))
    if target is None and record.get("native") is True and (model.config.max_position_embeddings or 0) > trained:
        target = int(model.config.max_position_embeddings)
    out = {"method": record["method"], "params": dict(record.get("params", {})), "resolved": resolved,
           "native": record.get("native") is True, "trained_length": trained, "target_length": target,
           "posenc_version": __version__}
    if record.get("layer_types") is not None:
        out["layer_types"] = list(record["layer_types"])
    return out


def posenc_scheme(model) -> PositionScheme | None:
    """The scheme the posenc path runs on the layers its method applies to (None for untouched or
    natively extended models)."""
    for m in _attention_modules(model):
        if getattr(m, "_posenc", None) and m._posenc["applies"]:
            return m._posenc["scheme"]
    return None


def unextend(model):
    """Undo :func:`extend` in place (same weights): the rotary modules, the attention implementation and the
    config are as they were before; returns the model. ``ValueError`` for a model posenc has not extended."""
    record = getattr(model, "_posenc_extended", None)
    if not record:
        raise ValueError(f"{type(model).__name__} is not extended by posenc (nothing to undo)")
    if record.get("native"):
        undo = model._posenc_undo
        _restore_lengths(model.config, copy.deepcopy(undo["rope_parameters"]), undo)
        _rebuild_rotary(model, model.config)
        del model._posenc_undo
    else:
        for hook in model._posenc_hooks:
            hook.remove()
        for m in _attention_modules(model):
            for attr in ("_posenc", "_posenc_window", "_posenc_chunk", "_posenc_nope", "_posenc_swap_halves",
                         "_posenc_keys"):
                if attr in vars(m):
                    delattr(m, attr)
        model.set_attn_implementation(model._posenc_original_attn)
        if hasattr(model.config, "posenc"):
            del model.config.posenc
        del model._posenc_hooks, model._posenc_original_attn
    model._posenc_extended = None
    return model


# ===================================================================== save / load
def save(model, out, tokenizer=None, *, replace: bool = False) -> Path:
    """``save_pretrained`` in a form that cannot be loaded without the method (:mod:`posenc.hf.saved`):
    a method transformers implements as a plain transformers folder (``rope_parameters`` and the extended
    ``max_position_embeddings``); a method of posenc's engine as a ``posenc_extended`` wrapper config that
    plain transformers refuses, and that :func:`load` or ``from_pretrained(DIR, trust_remote_code=True)``
    load extended. Returns ``out``.

    The folder is written as a whole (:func:`posenc.runtime.folders.staged_folder`): everything goes to a staging
    folder beside ``out`` and is moved in at the end, so a full disk or a killed process leaves ``out`` as it was
    and a reader never sees a config without its weights. ``out`` must be absent or empty (``ValueError``
    otherwise, nothing written), unless ``replace=True`` (a tune replacing its own saved winner)."""
    from posenc.runtime.folders import staged_folder

    out = Path(out)
    try:
        with staged_folder(out, replace=replace, what="the folder to save the model into") as stage:
            _save_into(model, stage, tokenizer)
    except Exception as exc:
        if not (isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError"):  # full disk, unwritable, ...
            raise
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kept = "its previous content is as it was" if replace else "nothing was written there"
        raise ValueError(f"could not save the model into {str(out)!r} ({text}); {kept}") from exc
    return out


def _save_into(model, stage: Path, tokenizer) -> None:
    """The files of :func:`save`, written into the staging folder ``stage``."""
    from posenc.hf.saved import CODE_FILE, CUSTOM_CODE, RECORD_FILE, wrap_config
    from posenc.runtime.atomic import atomic_write_json, atomic_write_text

    orig = getattr(model, "_posenc_original_attn", None)
    if orig is not None:
        model.config._attn_implementation = orig
    try:
        model.save_pretrained(stage)
    finally:
        if orig is not None:
            model.config._attn_implementation = ATTN_NAME
    if getattr(model.config, "posenc", None):  # posenc's engine: the wrapper, and its loader code
        config = json.loads((stage / "config.json").read_text(encoding="utf-8"))
        atomic_write_text(stage / CODE_FILE, CUSTOM_CODE)
        atomic_write_json(stage / "config.json", wrap_config(config), indent=2)
    record = _saved_record(model)
    if record is not None:
        atomic_write_json(stage / RECORD_FILE, record, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(stage)


def load(path, **kwargs):
    """Load a model dir with transformers and re-apply its posenc method: a ``posenc_extended`` wrapper
    written by :func:`save`, or a plain config with a ``posenc`` section (posenc's earlier format)."""
    from transformers import AutoModelForCausalLM

    from posenc.hf.saved import is_wrapped, model_config, read_config_json, unwrap_config

    # transformers' auto class hands a remote-code class its private keys (``_from_auto`` since 5.25); the
    # AutoModelForCausalLM call below sets them itself, and twice is a TypeError
    kwargs = {key: value for key, value in kwargs.items() if not key.startswith("_")}
    raw = read_config_json(path)
    spec = None
    if is_wrapped(raw):  # the model's own config class from base_config: posenc_extended.py is not executed
        spec = unwrap_config(raw)[1]
        kwargs["config"] = model_config(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ValueError(f"could not load the model in {str(path)!r}: {exc}") from exc
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refused a pickle: nothing of it ran
        files = ", ".join(sorted(p.name for p in Path(path).glob("*.bin"))) or "its .bin weights"
        raise ValueError(f"the weights of {str(path)!r} ({files}) hold a pickle that is not plain tensors; posenc "
                         "loads weights only (torch weights_only=True) and ran none of it") from exc
    if spec is None and getattr(model.config, "posenc", None):
        spec = model.config.posenc
        del model.config.posenc
    if spec:
        extend(model, spec["method"], native=spec.get("native"), impl=spec.get("impl", "auto"),
               layer_types=spec.get("layer_types"), target_length=spec.get("target_length"),
               **spec.get("params", {}))
    return model.eval()
