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
from dataclasses import dataclass, replace
from typing import Any

from posenc._util import check_finite, check_positive_int
from posenc.scheme.part import Part

__all__ = ["HF_ONLY", "METHODS", "NONE", "TRAINED_METHODS", "Method", "Param", "UnknownMethodError", "hf_methods",
           "is_identity", "lookup", "parse_methods", "split_spec"]

Scheme = Any  # a posenc.scheme.core.PositionScheme (core imports this module, not the other way round)


# ===================================================================== records
@dataclass(frozen=True)
class Param:
    """One parameter of a method. ``default`` is the value used when it is not given; when that is not a
    constant, ``rule`` says how it is chosen (``"required"``, ``"train_len // 2"``, ...) and
    ``from_train_len`` computes it. ``minimum``/``maximum`` (``strict``: minimum excluded, ``integer``)
    are the range the part validates (``strict_max``: maximum excluded). ``filled``: the method writes
    the default into the scheme."""

    name: str
    default: Any = None
    rule: str = ""
    minimum: float | None = None
    maximum: float | None = None
    strict: bool = False
    strict_max: bool = False
    integer: bool = False
    filled: bool = False
    from_train_len: Callable[[int], Any] | None = None

    @property
    def required(self) -> bool:
        return self.rule.startswith("required")

    def default_for(self, train_len: int):
        """The default at ``train_len`` (None: required, or applied by the part)."""
        return self.from_train_len(train_len) if self.from_train_len is not None else self.default

    def contains(self, value) -> bool:
        """True when ``value`` is inside the documented range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return isinstance(value, bool) and self.minimum is None and self.maximum is None
        if not math.isfinite(value) or self.integer and not float(value).is_integer():
            return False
        if self.minimum is not None and (value <= self.minimum if self.strict else value < self.minimum):
            return False
        return self.maximum is None or (value < self.maximum if self.strict_max else value <= self.maximum)

    def range_text(self) -> str:
        """The allowed values alone: ``"integer >= 1"``, ``">= 0, <= 1"``, ``"true/false"``, or ``""``."""
        lo = "" if self.minimum is None else f"{'>' if self.strict else '>='} {self.minimum:g}"
        hi = "" if self.maximum is None else f"{'<' if self.strict_max else '<='} {self.maximum:g}"
        rng = ", ".join(x for x in (lo, hi) if x)
        if isinstance(self.default, bool):
            return "true/false"
        return f"integer {rng}".strip() if self.integer else rng

    def describe(self) -> str:
        """``"window=train_len // 2 (integer >= 1)"``."""
        default = self.rule or repr(self.default)
        rng = self.range_text()
        return f"{self.name}={default}" + (f" ({rng})" if rng else "")


# fn(train_len, eval_len, head_dim, base) -> parameters
LengthDefaults = Callable[[int, int, "int | None", float], dict]


@dataclass(frozen=True)
class Method:
    """One method (see the module docstring): inference-time in :data:`METHODS`, trained-in in
    :data:`TRAINED_METHODS`."""

    name: str
    kind: str  # "frequencies" | "base" | "remap" | "logn" | "mask" | "embedding" | "identity"; trained-in
    #            (TRAINED_METHODS): "bias" | "relative" | "gate"
    description: str
    paper: str  # "arXiv:NNNN.NNNNN", or the URL of the post that introduced it
    apply: Callable[..., Scheme] | None  # fn(method, scheme, **params) -> scheme; None: transformers only
    params: tuple[Param, ...] = ()
    sets: tuple[str, ...] = ()  # the PositionScheme fields it changes
    scaling_type: str | None = None  # posenc.parts.frequencies rope_type it writes into rope.scaling
    remap_kind: str | None = None  # posenc.parts.remap kind it sets
    dynamic: bool = False  # the frequencies depend on the sequence length
    base_preset: str = "rope"  # the trained-in preset it applies to (tests, `posenc schemes`)
    eval_defaults: LengthDefaults | None = None  # per-length defaults (lab evaluation); None: no parameters
    hf_rope_type: str | None = None  # transformers' rope_type for the same schedule, where it has one
    hf_native: bool = False  # posenc.hf.extend runs transformers' own code for it (unless native=False)
    hf_original_len: bool = False  # transformers reads original_max_position_embeddings for it
    aliases: tuple[str, ...] = ()

    @property
    def is_identity(self) -> bool:
        return self.kind == "identity"

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def filled_defaults(self, train_len: int | None = None) -> dict:
        """The defaults the method writes into the scheme (``train_len`` for the length-derived ones)."""
        return {p.name: p.default_for(train_len) for p in self.params if p.filled}

    def length_defaults(self, train_len: int, eval_len: int, head_dim: int | None = None,
                        base: float = 10000.0) -> dict:
        """Parameters to evaluate at ``eval_len`` a model trained at ``train_len`` (see
        :func:`posenc.lab.evaluate.length_defaults`)."""
        return {} if self.eval_defaults is None else self.eval_defaults(train_len, eval_len, head_dim, base)

    def build(self, scheme: Scheme, **params) -> Scheme:
        if self.apply is None:
            raise ValueError(f"method {self.name!r} exists only in transformers (posenc.hf.extend)")
        return self.apply(self, scheme, **params)


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
    if rope.scaling is not None:
        raise ValueError(f"{scheme.name!r} already has rope scaling {rope.scaling.get('rope_type')!r}; "
                         f"frequency schedules do not stack")
    needs_factor = m.param("factor") is not None and m.param("factor").required
    if needs_factor and factor is None and "alpha" not in params:
        raise ValueError(f"method {rope_type!r} needs factor (e.g. target length / train_len = "
                         f"N/{train_len})")
    scaling = {"rope_type": rope_type, "original_max_position_embeddings": train_len,
               **m.filled_defaults(train_len), **params}
    if factor is not None:
        scaling["factor"] = check_finite(f"{rope_type}.factor", factor, minimum=1.0)
    return replace(scheme, rope=replace(rope, scaling=scaling))


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
    sinks = m.param("n_sinks").default if n_sinks is None else n_sinks
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
        params["alpha"] = alpha
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


def _dca_chunk(L: int) -> int:
    """ChunkLlama's chunk size: 3/4 of the pretraining length."""
    return max(2, L * 3 // 4)


def _dca_local(L: int) -> int:
    """ChunkLlama's local window: 1/16 of the pretraining length (below the chunk)."""
    return min(L // 16, _dca_chunk(L) - 1)


# ===================================================================== the registry
def _factor(rule: str = "required", **kw) -> Param:
    return Param("factor", rule=rule, minimum=1.0, **kw)


def _window(rule: str, fn: Callable[[int], int], filled: bool = False) -> Param:
    return Param("window", rule=rule, minimum=1, integer=True, from_train_len=fn, filled=filled)


_YARN_PARAMS = (_factor(), Param("beta_fast", 32.0, minimum=0.0, strict=True),
                Param("beta_slow", 1.0, minimum=0.0, strict=True),
                Param("attention_factor", rule="0.1 ln(factor) + 1", minimum=0.0, strict=True),
                Param("mscale", rule="off", minimum=0.0), Param("mscale_all_dim", rule="off", minimum=0.0),
                Param("truncate", True))

_ROPE = ("rope.scaling",)

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
           _scaling, (Param("factor", 1.0, minimum=1.0, filled=True),), _ROPE, scaling_type="dynamic",
           dynamic=True, hf_rope_type="dynamic"),
    Method("dynamic_ntk_qwen", "frequencies", "Qwen: alpha = 2^(ceil(log2(t/L))+1) - 1", "arXiv:2309.16609",
           _scaling, (), _ROPE, scaling_type="dynamic_qwen", dynamic=True),
    Method("yarn", "frequencies", "Peng et al. 2023: NTK-by-parts + attention temperature", "arXiv:2309.00071",
           _scaling, _YARN_PARAMS, _ROPE, scaling_type="yarn", eval_defaults=_factor_default, hf_rope_type="yarn",
           hf_native=True, hf_original_len=True),
    Method("dynamic_yarn", "frequencies", "YaRN with s = max(1, n / L)", "arXiv:2309.00071", _scaling,
           _YARN_PARAMS[1:3], _ROPE, scaling_type="dynamic_yarn", dynamic=True),
    Method("llama3", "frequencies", "Meta Llama 3.1 frequency-band scaling", "arXiv:2407.21783", _scaling,
           (_factor(), Param("low_freq_factor", 1.0, minimum=0.0, strict=True, filled=True),
            Param("high_freq_factor", 4.0, minimum=0.0, strict=True, filled=True)), _ROPE, scaling_type="llama3",
           eval_defaults=_factor_default, hf_rope_type="llama3", hf_native=True, hf_original_len=True),
    Method("rope_base", "base", "Liu et al. 2023 (scaling laws): change the base", "arXiv:2310.05209",
           _base_change, (Param("base", rule="required", minimum=0.0, strict=True),), ("rope.base",),
           eval_defaults=_rope_base_default),
    Method("rerope", "remap", "Su: relative position min(d, w)", "https://kexue.fm/archives/9708", _remap,
           (_window("train_len // 2", lambda L: L // 2, filled=True),), ("remap",), remap_kind="rerope",
           eval_defaults=lambda L, n, d, b: {"window": max(1, L // 2)}),
    Method("leaky_rerope", "remap", "Su: w + (d - w)/k beyond the window", "https://kexue.fm/archives/9708",
           _remap, (_window("train_len // 4", lambda L: L // 4, filled=True),
                    Param("factor", 16.0, minimum=1.0, filled=True)), ("remap",), remap_kind="leaky_rerope",
           eval_defaults=_leaky_default),
    Method("selfextend", "remap", "Jin et al. 2024: grouped positions beyond a neighbour window",
           "arXiv:2401.01325", _remap, (Param("group", 4, minimum=1, integer=True, filled=True),
                                        _window("train_len // 2", lambda L: L // 2, filled=True)),
           ("remap",), remap_kind="selfextend", eval_defaults=_selfextend_default),
    Method("logn", "logn", "Su: q scaled by max(1, log_L n)", "https://kexue.fm/archives/8823", _logn, (),
           ("logn",)),
    Method("sliding_window", "mask", "keys within the last `window` positions", "arXiv:2004.05150",
           _sliding_window, (_window("train_len", lambda L: L),), ("mask",),
           eval_defaults=lambda L, n, d, b: {"window": L}),
    Method("lm_infinite", "mask", "Han et al. 2023: Lambda mask + distance ceiling", "arXiv:2308.16137",
           _lm_infinite, (_window("train_len", lambda L: L), Param("n_global", 10, minimum=0, integer=True),
                          Param("ceiling", rule="train_len", minimum=1, integer=True, from_train_len=lambda L: L)),
           ("mask", "remap"), remap_kind="ceiling",
           eval_defaults=lambda L, n, d, b: {"window": L, "n_global": min(10, L // 2), "ceiling": L}),
    Method("streaming_llm", "mask", "Xiao et al. 2023: attention sinks + recent window", "arXiv:2309.17453",
           _streaming_llm, (_window("train_len - n_sinks", lambda L: L - 4),
                            Param("n_sinks", 4, minimum=0, integer=True)),
           ("mask", "remap"), remap_kind="streaming", eval_defaults=_streaming_default),
    Method("bca", "mask", "Sun et al. 2022: blockwise causal attention, block L/2", "arXiv:2212.10554", _bca,
           (Param("block", rule="train_len // 2", minimum=1, integer=True, from_train_len=lambda L: L // 2),),
           ("mask",), eval_defaults=lambda L, n, d, b: {"block": max(1, L // 2)}),
    Method("pcw", "remap", "Ratner et al. 2023: parallel context windows", "arXiv:2212.10947", _remap,
           (_window("train_len", lambda L: L, filled=True), Param("n_windows", 2, minimum=1, integer=True,
                                                                  filled=True)),
           ("remap",), remap_kind="pcw",
           eval_defaults=lambda L, n, d, b: {"window": L, "n_windows": max(1, math.ceil(n / L))}),
    Method("dca", "remap", "An et al. 2024: Dual Chunk Attention (intra / successive / inter-chunk positions)",
           "arXiv:2402.17463", _remap,
           (Param("chunk", rule="train_len * 3 // 4", minimum=1, integer=True, filled=True, from_train_len=_dca_chunk),
            Param("local", rule="train_len // 16", minimum=0, integer=True, filled=True, from_train_len=_dca_local)),
           ("remap",), remap_kind="dca",
           eval_defaults=lambda L, n, d, b: {"chunk": _dca_chunk(L), "local": _dca_local(L)}),
    Method("hierarchical", "embedding", "Su: read a learned table through its hierarchical decomposition (n^2)",
           "https://kexue.fm/archives/7947", _hierarchical,
           (Param("alpha", 0.4, minimum=0.0, maximum=1.0, strict=True, strict_max=True),), ("embedding",),
           base_preset="learned"),
    Method("chunked_attention", "mask", "Llama 4: a query sees only the keys of its own chunk of `chunk` tokens",
           "https://ai.meta.com/blog/llama-4-multimodal-intelligence/", _chunked_attention,
           (Param("chunk", rule="train_len", minimum=1, integer=True, from_train_len=lambda L: L),), ("mask",),
           eval_defaults=lambda L, n, d, b: {"chunk": L}),
    Method("temperature_tuning", "logn", "Llama 4: q x (1 + attn_scale log(floor((p+1)/floor_scale) + 1))",
           "arXiv:2501.19399", _temperature_tuning,
           (Param("attn_scale", 0.1, minimum=0.0, filled=True),
            Param("floor_scale", rule="train_len", minimum=0.0, strict=True, filled=True,
                  from_train_len=lambda L: float(L))), ("temperature",)),
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

# methods posenc.hf.extend hands to transformers and posenc itself does not implement
HF_ONLY: dict[str, Method] = {m.name: m for m in (
    Method("dynamic", "frequencies", "transformers' dynamic NTK (keys cached with the base they were rotated "
           "with); posenc's own is dynamic_ntk", "https://redd.it/14mrgpr", None, (_factor(),), _ROPE,
           scaling_type="dynamic", dynamic=True, hf_rope_type="dynamic", hf_native=True),
    Method("longrope", "frequencies", "Ding et al. 2024: searched per-dimension factors (Phi-3)",
           "arXiv:2402.13753", None, (Param("short_factor", rule="required"), Param("long_factor", rule="required"),
                                      Param("factor", rule="max_position_embeddings / train_len", minimum=1.0),
                                      Param("attention_factor", rule="sqrt(1 + ln(factor) / ln(L))", minimum=0.0,
                                            strict=True)),
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
