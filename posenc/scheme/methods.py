"""The method registry: one :class:`Method` record per inference-time method, and the one parser of
``"a+b"`` compositions (:func:`parse_methods`).

A record says everything posenc knows about a method: which part of a :class:`~posenc.scheme.PositionScheme`
it sets (``kind``, ``sets``) and how (``apply``), its parameters with their defaults and valid ranges
(:class:`Param`; the ranges are the ones the parts validate), a one-line description and the paper, the
per-length defaults the lab evaluates it with (:meth:`Method.length_defaults`), its Hugging Face
``rope_type`` and whether :func:`posenc.hf.extend` runs it with transformers' own code, and whether it
depends on the sequence length (``dynamic``). Code elsewhere reads these attributes; it does not
compare method names.

Trained-in methods whose part is new with them (CoPE, FoX, FIRE) have records too, in
:data:`TRAINED_METHODS`: :mod:`posenc.scheme.core` turns each into a trained-in preset.

The formulas live with the parts (:mod:`posenc.parts.frequencies`, :mod:`posenc.parts.remap`,
:mod:`posenc.parts.masks`, :mod:`posenc.parts.absolute`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from posenc._util import check_finite, check_positive_int
from posenc.scheme.part import Part
from posenc.scheme.records import LengthDefaults, Method, Param

__all__ = ["HF_ONLY", "METHODS", "NONE", "TRAINED_METHODS", "Method", "Param", "UnknownMethodError", "hf_methods",
           "is_identity", "lookup", "parse_methods", "split_spec"]

Scheme = Any  # a posenc.scheme.core.PositionScheme (core imports this module, not the other way round)
_ = LengthDefaults  # re-exported: the signature of Method.eval_defaults


# ===================================================================== how methods apply
def _need_rope(scheme, method: str):
    if scheme.rope is None:
        raise ValueError(f"method {method!r} applies to a RoPE scheme; {scheme.name!r} has no rotary part")
    return scheme.rope


def _need_train_len(scheme, method: str) -> int:
    if scheme.train_len is None:
        raise ValueError(f"method {method!r} needs the scheme's train_len (the length it was trained at)")
    return scheme.train_len


def _scaling(m: Method, scheme, factor=None, **params):
    """Write ``m.scaling_type`` into ``rope.scaling`` (messages name the rope_type, as the parts do)."""
    rope_type = m.scaling_type
    rope = _need_rope(scheme, rope_type)
    train_len = _need_train_len(scheme, rope_type)
    carried = {}
    if rope.scaling == {"rope_type": "default", "resonance": True}:  # Resonance RoPE stacks on a schedule
        carried, rope = {"resonance": True}, replace(rope, scaling=None)
    if rope.scaling is not None:
        raise ValueError(f"{scheme.name!r} already has rope scaling {rope.scaling.get('rope_type')!r}; "
                         f"frequency schedules do not stack")
    needs_factor = m.param("factor") is not None and m.param("factor").required
    if needs_factor and factor is None and "alpha" not in params:
        raise ValueError(f"method {rope_type!r} needs factor (e.g. target length / train_len = "
                         f"N/{train_len})")
    scaling = {"rope_type": rope_type, "original_max_position_embeddings": train_len,
               **m.filled_defaults(train_len), **params, **carried}
    if factor is not None:
        scaling["factor"] = check_finite(f"{rope_type}.factor", factor, minimum=1.0)
    return replace(scheme, rope=replace(rope, scaling=scaling))


def _dynamic(m: Method, scheme, step=None, **params):
    """A dynamic schedule (:func:`_scaling`) whose length is recomputed every ``step`` positions:
    ``rope.dynamic_step`` (query m uses the schedule of length ``ceil((m + 1) / step) * step``, so a full
    forward still equals cached decoding; ``step=1`` is the exact per-token form). A larger step lets the
    engine run the queries of one step in one call instead of one call per position."""
    s = _scaling(m, scheme, **params)
    if step is None:
        return s
    return replace(s, rope=replace(s.rope, dynamic_step=check_positive_int(f"{m.name}.step", step)))


def _base_change(m: Method, scheme, base=None):
    rope = _need_rope(scheme, m.name)
    if base is None:
        raise ValueError(f"method {m.name!r} needs base=<new RoPE base> (larger or smaller than the trained one)")
    return replace(scheme, rope=replace(rope, base=check_finite("base", base, minimum=0.0, strict_min=True)))


def _set_remap(scheme, kind: str, params: dict, defaults: Callable[[int], dict] = lambda L: {}):
    if scheme.rope is None and scheme.bias is None:
        raise ValueError(f"method {kind!r} remaps relative positions; {scheme.name!r} has neither a "
                         f"rotary nor a bias part")
    if scheme.remap is not None:
        raise ValueError(f"{scheme.name!r} already remaps positions ({scheme.remap.kind}); remaps do not stack")
    train_len = _need_train_len(scheme, kind)
    return replace(scheme, remap=Part(kind, {**defaults(train_len), **params}))


def _remap(m: Method, scheme, **params):
    return _set_remap(scheme, m.remap_kind, params, m.filled_defaults)


def _logn(m: Method, scheme):
    _need_train_len(scheme, m.name)
    return replace(scheme, logn=True)


def _positive_or_default(name: str, value, default: int) -> int:
    """``None`` -> ``default``; else an integer >= 1 (0 is refused, never silently replaced)."""
    return default if value is None else check_positive_int(name, value)


def _sliding_window(m: Method, scheme, window=None):
    L = _need_train_len(scheme, m.name)
    return replace(scheme, mask=replace(scheme.mask, window=_positive_or_default(f"{m.name}.window", window, L)))


def _bca(m: Method, scheme, block=None):
    L = _need_train_len(scheme, m.name)
    return replace(scheme, mask=replace(scheme.mask, block=_positive_or_default(f"{m.name}.block", block, L // 2)))


def _lm_infinite(m: Method, scheme, window=None, n_global=None, ceiling=None):
    L = _need_train_len(scheme, m.name)
    n_g = m.param("n_global").default if n_global is None else n_global
    mask = replace(scheme.mask, window=_positive_or_default(f"{m.name}.window", window, L), n_sinks=n_g)
    s = replace(scheme, mask=mask)
    if scheme.rope is not None or scheme.bias is not None:
        ceiling = _positive_or_default(f"{m.name}.ceiling", ceiling, L)
        s = _set_remap(s, m.remap_kind, {"ceiling": ceiling})
    return s


def _streaming_llm(m: Method, scheme, window=None, n_sinks=None):
    L = _need_train_len(scheme, m.name)
    sinks = m.param("n_sinks").checked(m.name, n_sinks)  # before train_len - n_sinks is computed from it
    w = _positive_or_default(f"{m.name}.window", window, L - sinks)
    s = replace(scheme, mask=replace(scheme.mask, window=w, n_sinks=sinks))
    if scheme.rope is not None or scheme.bias is not None:
        s = _set_remap(s, m.remap_kind, {"n_sinks": sinks, "window": w})
    return s


def _hierarchical(m: Method, scheme, alpha=None):
    if scheme.embedding.kind != "learned":
        raise ValueError(f"method {m.name!r} reads a learned absolute table; {scheme.name!r} has a "
                         f"{scheme.embedding.kind!r} embedding")
    params = dict(scheme.embedding.params)
    if alpha is not None:
        params["alpha"] = m.param("alpha").checked(m.name, alpha)  # now, not when a model builds the table
    return replace(scheme, embedding=Part(m.name, params))


def _identity(m: Method, scheme):
    return scheme


def _chunked_attention(m: Method, scheme, chunk=None):
    L = _need_train_len(scheme, m.name)
    return replace(scheme, mask=replace(scheme.mask, chunk=_positive_or_default(f"{m.name}.chunk", chunk, L)))


def _temperature_tuning(m: Method, scheme, attn_scale=None, floor_scale=None):
    L = _need_train_len(scheme, m.name)
    if scheme.temperature is not None:
        raise ValueError(f"{scheme.name!r} already has a query temperature ({scheme.temperature.kind}); "
                         f"temperatures do not stack")
    params = {**m.filled_defaults(L), **{k: v for k, v in (("attn_scale", attn_scale), ("floor_scale", floor_scale))
                                         if v is not None}}
    for k, v in params.items():
        p = m.param(k)
        check_finite(f"{m.name}.{k}", v, minimum=p.minimum, strict_min=p.strict)
    return replace(scheme, temperature=Part("llama4", params))


def _resonance(m: Method, scheme):
    """Add ``resonance: True`` to the rope scaling (a plain RoPE gets ``{"rope_type": "default", ...}``): every
    schedule's wavelengths are then rounded to integers (:func:`posenc.parts.frequencies.rope_frequencies`)."""
    rope = _need_rope(scheme, m.name)
    scaling = dict(rope.scaling or {"rope_type": "default"})
    if scaling.get("resonance"):
        raise ValueError(f"{scheme.name!r} already has Resonance RoPE")
    return replace(scheme, rope=replace(rope, scaling={**scaling, "resonance": True}))


_TEMPERATURES = {"chunkllama": (0.05, 2.0), "qwen": (0.1, 1.0)}  # dca's temperature forms: (coef, power)


def _dca(m: Method, scheme, temperature="none", temperature_length="query", **params):
    """Dual Chunk Attention's remap, and with ``temperature`` its logit temperature (ChunkLlama's or Qwen2.5-1M's
    :class:`~posenc.parts.remap.LengthTemperature`, n per query or per call: ``temperature_length``)."""
    for name, value in (("temperature", temperature), ("temperature_length", temperature_length)):
        if not m.param(name).contains(value):
            raise ValueError(f"dca.{name} must be one of {m.param(name).choices}, got {value!r}")
    s = _set_remap(scheme, m.remap_kind, params, m.filled_defaults)
    if temperature == "none":
        return s
    if scheme.temperature is not None:
        raise ValueError(f"{scheme.name!r} already has a query temperature ({scheme.temperature.kind}); "
                         f"temperatures do not stack")
    coef, power = _TEMPERATURES[temperature]
    return replace(s, temperature=Part("log_length", {"coef": coef, "power": power, "train_len": s.train_len,
                                                      "length": temperature_length}))


def _duo(m: Method, scheme, streaming=(), n_sinks=None, window=None):
    """DuoAttention's split: ``streaming`` query heads on every layer, or one list per layer (the scheme becomes
    a layer pattern with one scheme per layer)."""
    L = _need_train_len(scheme, m.name)
    if not m.param("streaming").contains(list(streaming) if isinstance(streaming, tuple) else streaming):
        raise ValueError(f"duo.streaming must be a list of distinct query-head indices >= 0, or one such list per "
                         f"layer, got {streaming!r}")
    params = {"n_sinks": m.param("n_sinks").default if n_sinks is None else n_sinks,
              "window": _positive_or_default(f"{m.name}.window", window, m.param("window").default_for(L))}
    per_layer = bool(streaming) and all(isinstance(x, (list, tuple)) for x in streaming)
    if not per_layer:
        return _set_remap(scheme, m.remap_kind, {"streaming": sorted(streaming), **params})
    layers = tuple(replace(_set_remap(scheme, m.remap_kind, {"streaming": sorted(h), **params}), name="duo")
                   for h in streaming)
    return replace(scheme.__class__(name=scheme.name, embedding=scheme.embedding, train_len=L), layers=layers)


# ===================================================================== per-length defaults (the lab)
def _leaky_factor(window: int, train_len: int, eval_len: int) -> float:
    """Smallest k >= 1 with ``w + (eval_len - 1 - w) / k <= train_len - 1`` (the largest relative distance
    at ``eval_len`` maps inside the trained range) and ``w (k - 1)`` an integer."""
    room = train_len - 1 - window
    if eval_len - 1 - window <= room or room <= 0:
        return 1.0 if room > 0 else float(max(1, eval_len))
    k_min = (eval_len - 1 - window) / room
    return 1.0 + math.ceil(window * (k_min - 1.0) - 1e-9) / window


def _selfextend_group(window: int, train_len: int, eval_len: int) -> int:
    """Smallest group G with the largest grouped position ``(eval_len-1)//G + w - w//G <= train_len - 1``."""
    for g in range(1, max(2, eval_len + 1)):
        if (eval_len - 1) // g + window - window // g <= train_len - 1:
            return g
    return max(1, eval_len)


def _factor_default(L, n, head_dim, base):
    return {"factor": max(1.0, n / L)}


def _rope_base_default(L, n, head_dim, base):
    if head_dim is None or head_dim <= 2:
        raise ValueError("method 'rope_base' needs head_dim (> 2) to choose the new base")
    return {"base": float(base) * max(1.0, n / L) ** (head_dim / (head_dim - 2))}


def _leaky_default(L, n, head_dim, base):
    w = max(1, L // 4)
    return {"window": w, "factor": _leaky_factor(w, L, n)}


def _selfextend_default(L, n, head_dim, base):
    w = max(1, L // 2)
    return {"window": w, "group": _selfextend_group(w, L, n)}


def _streaming_default(L, n, head_dim, base):
    sinks = min(4, L // 2)
    return {"n_sinks": sinks, "window": L - sinks}


def _string_default(L, n, head_dim, base):
    """STRING at ``n``: local window W, shift S = L // 3 raised so that ``n - 1 - S + W < L``; the diagonal piece
    (d < S) also stays below L only while ``n <= 2L - W`` (past it no S can: it reaches ``n - L + W - 1``)."""
    local = _string_local(L)
    return {"shift": min(max(L // 3, n - L + local, local, 1), max(n - 1, 1)), "local": local}


def _string_local(L: int) -> int:
    """STRING's local window W: 128 at the authors' 128k, here min(128, L // 16)."""
    return min(128, L // 16)


def _retrieval_block(L: int) -> int:
    """InfLLM's block_size 128 at L = 8k: L // 64."""
    return max(1, L // 64)


def _retrieval_default(L, n, head_dim, base):
    b = _retrieval_block(L)
    return {"window": max(1, L // 2), "n_sinks": max(1, L // 64), "block": b, "top_k": max(1, L // 4 // b)}


def _dca_chunk(L: int) -> int:
    """ChunkLlama's chunk size: 3/4 of the pretraining length."""
    return max(2, L * 3 // 4)


def _dca_local(L: int) -> int:
    """ChunkLlama's local window: 1/16 of the pretraining length (below the chunk)."""
    return min(L // 16, _dca_chunk(L) - 1)


# ===================================================================== the registry
def _factor(rule: str = "required", **kw) -> Param:
    return Param("factor", rule=rule, minimum=1.0, **kw)


def _window(rule: str, fn: Callable[[int], int], filled: bool = False, original: str = "") -> Param:
    return Param("window", rule=rule, minimum=1, integer=True, from_train_len=fn, filled=filled, original=original)


_YARN_PARAMS = (_factor(), Param("beta_fast", 32.0, minimum=0.0, strict=True),
                Param("beta_slow", 1.0, minimum=0.0, strict=True),
                Param("attention_factor", rule="0.1 ln(factor) + 1", minimum=0.0, strict=True),
                Param("mscale", rule="off", minimum=0.0), Param("mscale_all_dim", rule="off", minimum=0.0),
                Param("truncate", True))

_ROPE = ("rope.scaling",)
_STEP = Param("step", 1, minimum=1, integer=True)  # dynamic schedules: recompute the length every `step` positions

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("pi", "frequencies", "Chen et al. 2023: positions divided by factor", "arXiv:2306.15595", _scaling,
           (_factor(),), _ROPE, scaling_type="linear", eval_defaults=_factor_default, hf_rope_type="linear",
           hf_native=True),
    Method("ntk", "frequencies", "NTK-aware: base * factor^(d/(d-2))", "https://redd.it/14lz7j5", _scaling,
           (_factor("required (or alpha)"), Param("alpha", rule="factor", minimum=1.0)), _ROPE,
           scaling_type="ntk", eval_defaults=_factor_default),
    Method("ntk_mixed", "frequencies", "Su: per-dimension exp(-a (i+1)^b) scaling", "https://kexue.fm/archives/9706",
           _scaling, (_factor(), Param("b", 0.75, minimum=0.0, strict=True)), _ROPE, scaling_type="ntk_mixed",
           eval_defaults=_factor_default),
    Method("dynamic_ntk", "frequencies", "HF dynamic NTK: base grows with length", "https://redd.it/14mrgpr",
           _dynamic, (Param("factor", 1.0, minimum=1.0, filled=True), _STEP), _ROPE,
           scaling_type="dynamic", dynamic=True, hf_rope_type="dynamic"),
    Method("dynamic_ntk_qwen", "frequencies", "Qwen: alpha = 2^(ceil(log2(t/L))+1) - 1", "arXiv:2309.16609",
           _dynamic, (_STEP,), _ROPE, scaling_type="dynamic_qwen", dynamic=True),
    Method("yarn", "frequencies", "Peng et al. 2023: NTK-by-parts + attention temperature", "arXiv:2309.00071",
           _scaling, _YARN_PARAMS, _ROPE, scaling_type="yarn", eval_defaults=_factor_default, hf_rope_type="yarn",
           hf_native=True, hf_original_len=True),
    Method("dynamic_yarn", "frequencies", "YaRN with s = max(1, n / L)", "arXiv:2309.00071", _dynamic,
           (*_YARN_PARAMS[1:3], _STEP), _ROPE, scaling_type="dynamic_yarn", dynamic=True),
    Method("llama3", "frequencies", "Meta Llama 3.1 frequency-band scaling", "arXiv:2407.21783", _scaling,
           (_factor(), Param("low_freq_factor", 1.0, minimum=0.0, strict=True, filled=True),
            Param("high_freq_factor", 4.0, minimum=0.0, strict=True, filled=True)), _ROPE, scaling_type="llama3",
           eval_defaults=_factor_default, hf_rope_type="llama3", hf_native=True, hf_original_len=True),
    Method("rope_base", "base", "Liu et al. 2023 (scaling laws): change the base", "arXiv:2310.05209",
           _base_change, (Param("base", rule="required", minimum=0.0, strict=True),), ("rope.base",),
           eval_defaults=_rope_base_default),
    Method("rerope", "remap", "Su: relative position min(d, w)", "https://kexue.fm/archives/9708", _remap,
           (_window("train_len // 2", lambda L: L // 2, filled=True, original="window"),), ("remap",),
           remap_kind="rerope", original="bojone/rerope rerope_patch.py",
           eval_defaults=lambda L, n, d, b: {"window": max(1, L // 2)}),
    Method("leaky_rerope", "remap", "Su: w + (d - w)/k beyond the window", "https://kexue.fm/archives/9708",
           _remap, (_window("train_len // 4", lambda L: L // 4, filled=True, original="window"),
                    Param("factor", 16.0, minimum=1.0, filled=True, original="scaling_factor")), ("remap",),
           remap_kind="leaky_rerope", original="bojone/rerope leaky_rerope_patch.py",
           eval_defaults=_leaky_default),
    Method("selfextend", "remap", "Jin et al. 2024: grouped positions beyond a neighbour window",
           "arXiv:2401.01325", _remap,
           (Param("group", 4, minimum=1, integer=True, filled=True,
                  original="group_size_1 (floor; LongLM's main patch uses W / G, equal when G divides W)"),
            _window("train_len // 2", lambda L: L // 2, filled=True, original="group_size_2 (neighbor window)")),
           ("remap",), remap_kind="selfextend", eval_defaults=_selfextend_default,
           original="datamllab/LongLM SelfExtend.py"),
    Method("logn", "logn", "Su: q scaled by max(1, log_L n)", "https://kexue.fm/archives/8823", _logn, (),
           ("logn",)),
    Method("sliding_window", "mask", "keys within the last `window` positions", "arXiv:2004.05150",
           _sliding_window, (_window("train_len", lambda L: L, original="sliding_window (transformers, Mistral)"),),
           ("mask",),
           eval_defaults=lambda L, n, d, b: {"window": L}),
    Method("lm_infinite", "mask", "Han et al. 2023: Lambda mask + distance ceiling", "arXiv:2308.16137",
           _lm_infinite, (_window("train_len", lambda L: L, original="local_branch"),
                          Param("n_global", 10, minimum=0, integer=True, original="global_branch"),
                          Param("ceiling", rule="train_len", minimum=1, integer=True, from_train_len=lambda L: L,
                                original="limit_distance")),
           ("mask", "remap"), remap_kind="ceiling", original="Glaciohound/LM-Infinite models/lambda_attention.py",
           eval_defaults=lambda L, n, d, b: {"window": L, "n_global": min(10, L // 2), "ceiling": L}),
    Method("streaming_llm", "mask", "Xiao et al. 2023: attention sinks + recent window", "arXiv:2309.17453",
           _streaming_llm, (_window("train_len - n_sinks", lambda L: L - 4,
                                    original="recent_size + 1 (recent_size does not count the current token)"),
                            Param("n_sinks", 4, minimum=0, integer=True, original="start_size")),
           ("mask", "remap"), remap_kind="streaming", eval_defaults=_streaming_default,
           original="mit-han-lab/streaming-llm streaming_llm/kv_cache.py"),
    Method("bca", "mask", "Sun et al. 2022: blockwise causal attention, block L/2", "arXiv:2212.10554", _bca,
           (Param("block", rule="train_len // 2", minimum=1, integer=True, from_train_len=lambda L: L // 2,
                  original="the paper's block (L/2); no runnable original"),),
           ("mask",), eval_defaults=lambda L, n, d, b: {"block": max(1, L // 2)}),
    Method("pcw", "remap", "Ratner et al. 2023: parallel context windows", "arXiv:2212.10947", _remap,
           (_window("train_len", lambda L: L, filled=True, original="the paper's context-window length"),
            Param("n_windows", 2, minimum=1, integer=True, filled=True, original="the paper's number of windows B")),
           ("remap",), remap_kind="pcw",
           eval_defaults=lambda L, n, d, b: {"window": L, "n_windows": max(1, math.ceil(n / L))}),
    Method("dca", "remap", "An et al. 2024: Dual Chunk Attention (intra / successive / inter-chunk positions); "
           "temperature= ChunkLlama's or Qwen2.5-1M's logit temperature", "arXiv:2402.17463", _dca,
           (Param("chunk", rule="train_len * 3 // 4", minimum=1, integer=True, filled=True, from_train_len=_dca_chunk,
                  original="chunk_size (pretraining_length * 3 // 4)"),
            Param("local", rule="train_len // 16", minimum=0, integer=True, filled=True, from_train_len=_dca_local,
                  original="local_window (replace_with_chunkllama's default: pretraining_length // 8)"),
            Param("temperature", "none", choices=("none", "chunkllama", "qwen"),
                  original="chunkllama: get_mscale 0.05 ln(n/L) + 1 on q and k; qwen: vLLM's 0.1 ln(n/L) + 1"),
            Param("temperature_length", "query", choices=("query", "sequence"),
                  original="n = kv_seq_len of the call (ChunkLlama's prefill: 'sequence')")),
           ("remap",), remap_kind="dca", original="HKUNLP/ChunkLlama chunkllama_attn_replace.py",
           eval_defaults=lambda L, n, d, b: {"chunk": _dca_chunk(L), "local": _dca_local(L)}),
    Method("hierarchical", "embedding", "Su: read a learned table through its hierarchical decomposition (n^2)",
           "https://kexue.fm/archives/7947", _hierarchical,
           (Param("alpha", 0.4, minimum=0.0, maximum=1.0, strict=True, strict_max=True),), ("embedding",),
           base_preset="learned"),
    Method("chunked_attention", "mask", "Llama 4: a query sees only the keys of its own chunk of `chunk` tokens",
           "https://ai.meta.com/blog/llama-4-multimodal-intelligence/", _chunked_attention,
           (Param("chunk", rule="train_len", minimum=1, integer=True, from_train_len=lambda L: L,
                  original="attention_chunk_size (transformers Llama4TextConfig)"),), ("mask",),
           eval_defaults=lambda L, n, d, b: {"chunk": L}),
    Method("temperature_tuning", "logn", "Llama 4: q x (1 + attn_scale log(floor((p+1)/floor_scale) + 1))",
           "arXiv:2501.19399", _temperature_tuning,
           (Param("attn_scale", 0.1, minimum=0.0, filled=True),
            Param("floor_scale", rule="train_len", minimum=0.0, strict=True, filled=True,
                  from_train_len=lambda L: float(L))), ("temperature",)),
    Method("string", "remap", "An et al. 2024 (STRING): d < S keeps d, beyond it d - S + W (well-trained positions "
           "shifted over the far ones)", "arXiv:2410.18745", _remap,
           (Param("shift", rule="train_len // 3", minimum=1, integer=True, filled=True,
                  from_train_len=lambda L: max(1, L // 3), original="shifted_offset (README: 0.25-0.4 L)"),
            Param("local", rule="min(128, train_len // 16)", minimum=0, integer=True, filled=True,
                  from_train_len=_string_local, original="small_local_value (local_value)"),
            Param("attention_factor", 1.0, minimum=0.0, strict=True,
                  original="attention_factor = 0.1 ln 2 + 1 on cos and sin (hidden; set 1.0693 to reproduce)")),
           ("remap",), remap_kind="string", eval_defaults=_string_default,
           original="HKUNLP/STRING string_for_llama.py"),
    Method("resonance", "frequencies", "Wang et al. 2024 (Resonance RoPE): every wavelength 2 pi / theta_i rounded "
           "to an integer; stacks on a frequency schedule", "arXiv:2403.00071", _resonance, (), _ROPE,
           original="sheryc/resonance_rope llama_finetuning/scaled_rope/modeling_llama_yarn.py"),
    Method("retrieval", "remap", "Xiao et al. 2024 (InfLLM): sinks + local window + the top-k far blocks by "
           "q . mean block key, far keys at distance `window`", "arXiv:2402.04617", _remap,
           (_window("train_len // 2", lambda L: max(1, L // 2), filled=True, original="n_local"),
            Param("n_sinks", rule="max(1, train_len // 64)", minimum=0, integer=True, filled=True,
                  from_train_len=lambda L: max(1, L // 64), original="n_init"),
            Param("block", rule="max(1, train_len // 64)", minimum=1, integer=True, filled=True,
                  from_train_len=_retrieval_block, original="block_size"),
            Param("top_k", rule="train_len // 4 // block", minimum=0, integer=True, filled=True,
                  from_train_len=lambda L: max(1, L // 4 // _retrieval_block(L)), original="topk"),
            Param("per_head", False, original="perhead")),
           ("remap",), remap_kind="retrieval", eval_defaults=_retrieval_default,
           original="thunlp/InfLLM inf_llm/attention/context_manager.py"),
    Method("duo", "remap", "Xiao et al. 2024 (DuoAttention): streaming heads see sinks + a window, retrieval heads "
           "everything (heads from posenc.evals.calibrate.calibrate_duo)", "arXiv:2410.10819", _duo,
           (Param("streaming", [], heads=True, filled=True,
                  original="query heads of the KV heads with full_attention_heads gate below the threshold"),
            Param("n_sinks", 4, minimum=0, integer=True, filled=True, original="sink_size"),
            Param("window", rule="train_len // 4", minimum=1, integer=True, filled=True,
                  from_train_len=lambda L: max(1, L // 4), original="recent_size (streaming mask d < recent_size)")),
           ("remap",), remap_kind="duo", original="mit-han-lab/duo-attention duo_attn/patch/streaming_attn.py",
           eval_defaults=lambda L, n, d, b: {"streaming": [0], "n_sinks": 4, "window": max(1, L // 4)}),
)}

# ===================================================================== p-RoPE; trained-in CoPE, FoX, FIRE
def _p_rope(m: Method, scheme, p=None):
    """Write transformers' ``proportional`` schedule with ``partial_rotary_factor = p`` (the fraction of the
    pairs, highest frequencies first, that stay rotated; the rest get frequency 0)."""
    rope = _need_rope(scheme, m.name)
    if rope.scaling is not None:
        raise ValueError(f"{scheme.name!r} already has rope scaling {rope.scaling.get('rope_type')!r}; "
                         f"frequency schedules do not stack")
    if rope.partial_rotary_factor != 1.0:
        raise ValueError(f"method {m.name!r} chooses the rotated pairs itself; {scheme.name!r} already rotates "
                         f"only partial_rotary_factor={rope.partial_rotary_factor} of the head")
    p = m.param("p").default if p is None else check_finite(f"{m.name}.p", p, minimum=0.0, maximum=1.0,
                                                                  strict_min=True)
    return replace(scheme, rope=replace(rope, scaling={"rope_type": "proportional", "partial_rotary_factor": p}))


METHODS["p_rope"] = Method(
    "p_rope", "frequencies", "Barbero et al. 2024: rotate only the highest-frequency fraction p of the pairs "
    "(the rest NoPE)", "arXiv:2410.06205", _p_rope,
    (Param("p", 0.25, minimum=0.0, maximum=1.0, strict=True),), _ROPE, scaling_type="proportional",
    hf_rope_type="proportional")


def _check_ranges(m: Method, params: dict) -> None:
    """``ValueError`` for a parameter ``m`` does not take or a value outside its documented range."""
    for name, value in params.items():
        p = m.param(name)
        if p is None:
            raise ValueError(f"preset {m.name!r} does not take parameter {name!r}; it takes {sorted(m.param_names)}")
        if not p.contains(value):
            rng = p.range_text()
            allowed = ("true or false" if rng == "true/false" else f"an {rng}" if rng.startswith("integer")
                       else f"a number {rng}" if rng else "a finite number")
            raise ValueError(f"{m.name}.{name} must be {allowed}, got {value!r}")


def _trained_part(field: str):
    """``apply`` of a trained-in method: set the scheme's ``field`` part to ``Part(method name, params)``
    (parameters checked against the record; ``from_train_len`` defaults filled in)."""

    def apply(m: Method, scheme, **params):
        _check_ranges(m, params)
        if getattr(scheme, field) is not None:
            raise ValueError(f"{scheme.name!r} already has a {field} part ({getattr(scheme, field).kind}); "
                             f"method {m.name!r} sets its own")
        if scheme.train_len is not None:
            params = {**m.filled_defaults(scheme.train_len), **params}
        return replace(scheme, **{field: Part(m.name, params)})

    return apply


# trained-in methods: each builds its part on ``base_preset`` (``PositionScheme.preset(name)``; the model
# is trained with it). The formulas live with the parts: posenc.parts.relative.CoPE,
# posenc.parts.gates.ForgetGate, posenc.parts.biases.FireBias.
TRAINED_METHODS: dict[str, Method] = {m.name: m for m in (
    Method("cope", "relative", "Golovneva et al. 2024: contextual positions p_ij = sum of sigmoid(q_i.k_t), "
           "t = j..i, interpolated learned embeddings", "arXiv:2405.18719", _trained_part("relative"),
           (Param("npos_max", 64, minimum=2, integer=True),), ("relative",), base_preset="nope"),
    Method("fox", "gate", "Lin et al. 2025: Forgetting Transformer, bias_ij = sum of log sigmoid(w.x_t + b), "
           "t = j+1..i", "arXiv:2503.02130", _trained_part("gate"),
           (Param("bias_init", 5.0),), ("gate",), base_preset="nope"),
    Method("fire", "bias", "Li et al. 2023: bias = MLP(psi(i-j) / psi(max(L, i))), psi(x) = log(c x + 1)",
           "arXiv:2310.04418", _trained_part("bias"),
           (Param("hidden", 32, minimum=1, integer=True), Param("c", 0.1, minimum=0.0, strict=True),
            Param("threshold", rule="train_len (else 512)", minimum=1.0, filled=True,
                  from_train_len=lambda L: float(L))), ("bias",), base_preset="nope"),
)}


# the model as it is ("none"; "default" is transformers' name for it)
NONE = Method("none", "identity", "the model as trained, no method", "", _identity, aliases=("default",))

# methods of transformers' names that posenc.hf.extend hands to transformers by default; "dynamic" exists only there,
# "longrope" also runs on posenc's engine with native=False (a dynamic schedule whose cached decoding equals the
# full forward across the original length, where transformers' switch of factor set leaves stale cached keys)
HF_ONLY: dict[str, Method] = {m.name: m for m in (
    Method("dynamic", "frequencies", "transformers' dynamic NTK (keys cached with the base they were rotated "
           "with); posenc's own is dynamic_ntk", "https://redd.it/14mrgpr", None, (_factor(),), _ROPE,
           scaling_type="dynamic", dynamic=True, hf_rope_type="dynamic", hf_native=True),
    Method("longrope", "frequencies", "Ding et al. 2024: searched per-dimension factors (Phi-3)",
           "arXiv:2402.13753", _dynamic, (Param("short_factor", rule="required"), Param("long_factor", rule="required"),
                                          Param("factor", rule="max_position_embeddings / train_len", minimum=1.0),
                                          Param("attention_factor", rule="sqrt(1 + ln(factor) / ln(L))",
                                                minimum=0.0, strict=True), _STEP),
           _ROPE, scaling_type="longrope", dynamic=True, hf_rope_type="longrope", hf_native=True,
           hf_original_len=True),
)}
_HF_ALIASES = {"linear": "pi"}  # transformers' name for PI


# ===================================================================== parsing "a+b"
class UnknownMethodError(ValueError):
    """A name that is not a registered method; ``name`` is the unknown part, ``known`` the known names."""

    def __init__(self, name: str, known):
        self.name, self.known = name, sorted(known)
        super().__init__(f"unknown method {name!r}; inference-time methods (combine with '+'): {self.known}")


def _table(identity: bool, hf: bool) -> Mapping[str, Method]:
    table: dict[str, Method] = dict(METHODS)
    if identity:
        table.update({n: NONE for n in (NONE.name, *NONE.aliases)})
    if hf:
        table.update(HF_ONLY)
        table.update({alias: METHODS[name] for alias, name in _HF_ALIASES.items()})
    return table


def hf_methods() -> dict[str, Method]:
    """Every name :func:`posenc.hf.extend` accepts (registry, transformers-only methods, ``linear``)."""
    return dict(_table(False, True))


def lookup(name: str, *, identity: bool = True, hf: bool = False) -> Method:
    """The record of one method name; :class:`UnknownMethodError` (a ``ValueError``) listing the known
    names otherwise. ``identity``: ``"none"``/``"default"`` give :data:`NONE`; ``hf``: also the names only
    transformers implements (``linear`` = ``pi``, ``dynamic``, ``longrope``)."""
    table = _table(identity, hf)
    if name not in table:
        raise UnknownMethodError(name, set(METHODS) | (set(HF_ONLY) | set(_HF_ALIASES) if hf else set()))
    return table[name]


def split_spec(spec, what: str = "method") -> list[str]:
    """``"a+b"`` -> ``["a", "b"]`` (names stripped, empty parts dropped); ``ValueError`` for a non-string
    or an empty spec. The one place a composition string is split."""
    if not isinstance(spec, str):
        raise ValueError(f"{what} must be a preset name string (see PositionScheme.presets()), got {spec!r}")
    names = [m.strip() for m in spec.split("+") if m.strip()]
    if not names:
        raise ValueError(f"{what} must be a non-empty preset name, got {spec!r}")
    return names


def parse_methods(spec, *, what: str = "method", identity: bool = True, hf: bool = False) -> tuple[Method, ...]:
    """The records of ``"a+b"``, in order (see :func:`split_spec` and :func:`lookup`)."""
    return tuple(lookup(n, identity=identity, hf=hf) for n in split_spec(spec, what))


def is_identity(spec) -> bool:
    """True for a spec that applies nothing: None, ``""``, ``"none"``, ``"default"`` (or only those,
    joined by ``+``); False for anything else, an unknown name included."""
    if spec is None or spec == "":
        return True
    try:
        return all(m.is_identity for m in parse_methods(spec))
    except ValueError:
        return False
