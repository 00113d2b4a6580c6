"""``PositionScheme``: one typed, validated config naming every positional part.

A method from the papers is a *preset* of it; attention asks the scheme for its parts and nothing
else in the code branches on method names. Parts and where they act:

==============  =====================================  =========================================
part            field                                  built by
==============  =====================================  =========================================
embedding       ``embedding: Part``                    ``posenc.parts.absolute.EMBEDDINGS``
frequencies     ``rope.base``, ``rope.scaling``        ``posenc.parts.frequencies.rope_frequencies``
q/k transform   ``rope`` (layout, partial, xpos)       ``posenc.parts.rotary``
score bias      ``bias: Part``                         ``posenc.parts.biases.BIASES``
content-rel.    ``relative: Part``                     ``posenc.parts.relative.RELATIVE``
mask            ``mask: MaskSpec``                     ``posenc.parts.masks``
position remap  ``remap: Part``                        ``posenc.parts.remap.REMAPS``
logit scale     ``logn`` (+ YaRN factor), ``softcap``  ``posenc.parts.remap.logn_scale``
q temperature   ``temperature: Part``                  ``posenc.parts.remap.TEMPERATURES``
memory          ``memory: Part``                       ``posenc.parts.memory.MEMORIES``
multi-axis      ``multiaxis: Part`` (+ ``rope``)       ``posenc.parts.multiaxis.MULTIAXIS``
forget gate     ``gate: Part``                         ``posenc.parts.gates.GATES``
==============  =====================================  =========================================

A *layer pattern* is a scheme whose ``layers`` holds one scheme per layer, repeated: layer i of a model uses
``layers[i % len(layers)]`` (:meth:`PositionScheme.layer`). The pattern itself keeps only the model-level
parts (``embedding``, ``train_len``, ``name``). Presets: ``irope`` (Llama 4), ``local_global`` (Gemma 3),
``nope_every4`` (SmolLM3); ``extend`` applies a method to the pattern's RoPE layers, or to the ``layers=``
chosen.

A scheme with a ``multiaxis`` part takes positions ``[batch, seq, n_axes]`` (2D patch grids, Qwen2-VL's
t/h/w ids); ``[batch, seq]`` positions mean the same coordinate on every axis.

Two kinds of presets:

- trained-in schemes (``PositionScheme.preset("alibi")``), used to build and train a model;
- inference-time methods applied to a trained RoPE scheme: ``scheme.extend("yarn", factor=4)``
  keeps the model's base, layout and train length and changes only what the method changes.
  ``PositionScheme.preset("yarn", factor=4, train_len=512)`` is the same applied to a default RoPE
  scheme. Methods compose with ``+``: ``scheme.extend("rerope+logn")``, ``"ntk_mixed+logn"``.
  Each method is a record of :data:`posenc.methods.METHODS` (what it sets, its parameters,
  paper, evaluation defaults, Hugging Face type); :func:`posenc.methods.parse_methods` reads ``"a+b"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from posenc._util import check_finite, check_positive_int
from posenc.methods import METHODS, TRAINED_METHODS, UnknownMethodError, parse_methods, split_spec
from posenc.parts.masks import MaskSpec
from posenc.scheme.part import Part, _check_keys, _check_params


def _check_bool(name: str, value) -> bool:
    """JSON ``"no"`` is truthy: accept only real booleans."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _from_mapping(cls, where: str, d):
    """Build dataclass ``cls`` from a JSON object, naming ``where`` for a wrong type or unknown field."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be an object (dict) of {sorted(f.name for f in fields(cls))}, got {d!r}")
    _check_keys(where, d, [f.name for f in fields(cls)])
    return cls(**d)


# scheme field -> (module, registry name, arguments the model supplies when it builds the part)
_PART_REGISTRIES = {
    "embedding": ("posenc.parts.absolute", "EMBEDDINGS", ("dim", "vocab_size")),
    "bias": ("posenc.parts.biases", "BIASES", ("num_heads",)),
    "relative": ("posenc.parts.relative", "RELATIVE", ("n_heads", "head_dim")),
    "memory": ("posenc.parts.memory", "MEMORIES", ("n_heads", "head_dim")),
    "multiaxis": ("posenc.parts.multiaxis", "MULTIAXIS", ("rotary_dim", "n_heads", "base")),
    "temperature": ("posenc.parts.remap", "TEMPERATURES", ()),
    "gate": ("posenc.parts.gates", "GATES", ("dim", "n_heads")),
}
_XL_MEMORY_PARAMS = ("mem_len",)  # memory 'xl_recurrence' lives in TinyLM, not in a registry class


def _check_part(field_name: str, part: Part) -> None:
    """Refuse an unknown kind or parameter when the scheme is built, not at the first forward."""
    import importlib
    import inspect

    module, registry, supplied = _PART_REGISTRIES[field_name]
    classes = getattr(importlib.import_module(module), registry)
    if part.kind not in classes:
        raise ValueError(f"{field_name} kind must be one of {sorted(classes)}, got {part.kind!r}")
    cls = classes[part.kind]
    if cls is None:
        accepted = set(_XL_MEMORY_PARAMS)
    else:
        sig = inspect.signature(cls.__init__).parameters
        accepted = {n for n, p in sig.items() if p.kind is p.POSITIONAL_OR_KEYWORD} - {"self", *supplied}
    unknown = sorted(set(part.params) - accepted)
    if unknown:
        raise ValueError(f"{field_name} {part.kind!r} does not take parameter(s) {unknown}; "
                         f"it takes {sorted(accepted)}")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary part: frequencies (``base`` + an HF-style ``scaling`` dict) and the q/k transform.

    ``dynamic`` decides what length a dynamic schedule (dynamic NTK, dynamic YaRN) sees:
    ``"query"`` (default): the query at position m uses the schedule for length m + 1 (rounded up
    to a multiple of ``dynamic_step``), so a full forward equals token-by-token decoding with a
    cache; ``"sequence"``: every query uses the length of the whole call (Hugging Face's forward).
    """

    base: float = 10000.0
    scaling: dict | None = None
    layout: str = "half"
    partial_rotary_factor: float = 1.0
    xpos: bool = False
    xpos_scale_base: int = 512
    dynamic: str = "query"
    dynamic_step: int = 1

    def __post_init__(self):
        check_finite("rope.base", self.base, minimum=0.0, strict_min=True)
        check_finite("rope.partial_rotary_factor", self.partial_rotary_factor, minimum=0.0,
                     maximum=1.0, strict_min=True)
        if self.layout not in ("half", "interleaved"):
            raise ValueError(f"rope.layout must be 'half' or 'interleaved', got {self.layout!r}")
        if self.dynamic not in ("query", "sequence"):
            raise ValueError(f"rope.dynamic must be 'query' or 'sequence', got {self.dynamic!r}")
        _check_bool("rope.xpos", self.xpos)
        check_positive_int("rope.dynamic_step", self.dynamic_step)
        check_positive_int("rope.xpos_scale_base", self.xpos_scale_base)
        if self.scaling is not None:
            if not isinstance(self.scaling, dict):
                raise ValueError(f"rope.scaling must be a dict or None, got {type(self.scaling).__name__}")
            _check_params("rope.scaling", self.scaling)
            from posenc.parts.frequencies import validate_rope_scaling

            validate_rope_scaling(self.scaling, base=self.base)  # the whole dict, now, not at the first forward

    def to_dict(self) -> dict:
        return asdict(self)


_PART_FIELDS = ("embedding", "bias", "relative", "remap", "memory", "multiaxis", "gate", "temperature")
_OMITTED_WHEN_NONE = ("temperature", "layers")  # absent from to_dict when off: older schemes keep their JSON


@dataclass(frozen=True)
class PositionScheme:
    """Typed config of every positional part. See the module docstring for the parts."""

    name: str = "custom"
    embedding: Part = field(default_factory=lambda: Part("nope"))
    rope: RopeSpec | None = None
    bias: Part | None = None
    relative: Part | None = None
    mask: MaskSpec = field(default_factory=MaskSpec)
    remap: Part | None = None
    logn: bool = False
    memory: Part | None = None
    train_len: int | None = None
    softcap: float | None = None
    multiaxis: Part | None = None
    gate: Part | None = None
    temperature: Part | None = None
    layers: tuple[PositionScheme, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise ValueError(f"scheme name must be a string, got {self.name!r}")
        _check_bool("logn", self.logn)
        for name, typ in (("embedding", Part), ("rope", RopeSpec), ("bias", Part), ("relative", Part),
                          ("mask", MaskSpec), ("remap", Part), ("memory", Part), ("multiaxis", Part),
                          ("gate", Part), ("temperature", Part)):
            value = getattr(self, name)
            if not isinstance(value, typ) and not (value is None and name not in ("embedding", "mask")):
                raise ValueError(f"scheme.{name} must be a {typ.__name__}, got {value!r}")
            if isinstance(value, Part) and name in _PART_REGISTRIES:
                _check_part(name, value)
        if self.train_len is not None:
            check_positive_int("train_len", self.train_len)
        if self.softcap is not None:
            check_finite("softcap", self.softcap, minimum=0.0, strict_min=True)
        if self.remap is not None and self.rope is None and self.bias is None:
            raise ValueError(f"remap {self.remap.kind!r} needs a RoPE or bias part to remap positions for")
        if self.logn and self.train_len is None:
            raise ValueError("logn scaling needs train_len (the log base); pass train_len=...")
        if self.gate is not None and self.memory is not None:
            raise ValueError(f"a forget gate ({self.gate.kind}) runs over one sequence of keys; memory "
                             f"{self.memory.kind!r} splits it into segments: use one or the other")
        if self.remap is not None:
            self.build_remap()  # validates its parameters now, not at the first forward
        if self.multiaxis is not None:
            self._check_multiaxis()
        if self.temperature is not None:
            self.build_temperature()  # validates its parameters now
        if self.layers is not None:
            from posenc.scheme.pattern import check_pattern

            object.__setattr__(self, "layers", check_pattern(self, PositionScheme))

    def _check_multiaxis(self) -> None:
        """A multi-axis part rotates with the scheme's RoPE, and nothing re-maps its 1-D positions."""
        if self.rope is None or self.rope.xpos:
            raise ValueError(f"multiaxis {self.multiaxis.kind!r} needs a plain RoPE part (rope, no xpos)")
        if self.remap is not None or self.memory is not None:
            raise ValueError(f"multiaxis {self.multiaxis.kind!r} does not combine with a position remap or "
                             f"memory (they work on 1-D positions)")
        from posenc.parts.multiaxis import check_multiaxis

        check_multiaxis(self.multiaxis.kind, dict(self.multiaxis.params))  # freqs, grid, sections: now, not at forward

    # ---------------------------------------------------------------- parts
    def build_remap(self):
        from posenc.parts.remap import build_remap

        return build_remap(self.remap.kind if self.remap else None,
                           **(dict(self.remap.params) if self.remap else {}))

    def build_temperature(self):
        from posenc.parts.remap import build_temperature

        return build_temperature(self.temperature.kind, **dict(self.temperature.params))

    def layer(self, i: int) -> PositionScheme:
        """The scheme of layer ``i`` (``layers[i % len(layers)]`` for a pattern, else this scheme)."""
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"layer index must be an integer >= 0, got {i!r}")
        return self if self.layers is None else self.layers[i % len(self.layers)]

    @property
    def uses_rope(self) -> bool:
        if self.layers is not None:
            return any(s.rope is not None for s in self.layers)
        return self.rope is not None

    @property
    def is_dynamic(self) -> bool:
        from posenc.parts.frequencies import is_dynamic

        if self.layers is not None:
            return any(s.is_dynamic for s in self.layers)
        return self.rope is not None and self.rope.scaling is not None and is_dynamic(self.rope.scaling)

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the embedding can address (a learned table), else None."""
        from posenc.parts.absolute import table_reach

        return table_reach(self.embedding.kind, int(self.embedding.params.get("max_positions", self.train_len or 0)))

    # ---------------------------------------------------------------- serialisation
    def to_dict(self) -> dict:
        d: dict[str, Any] = {"name": self.name}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "name" or (f.name in _OMITTED_WHEN_NONE and v is None):
                continue
            if f.name == "layers":
                d[f.name] = [s.to_dict() for s in v]
                continue
            d[f.name] = v.to_dict() if hasattr(v, "to_dict") else v
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PositionScheme:
        if not isinstance(d, dict):
            raise ValueError(f"scheme must be a dict, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown scheme fields {sorted(unknown)}; known: {sorted(known)}")
        kw: dict[str, Any] = {}
        for k, v in d.items():
            if k in _PART_FIELDS:
                kw[k] = Part.from_dict(v, k) if v is not None else (Part("nope") if k == "embedding" else None)
            elif k == "rope":
                kw[k] = _from_mapping(RopeSpec, "rope", v) if v is not None else None
            elif k == "mask":
                kw[k] = _from_mapping(MaskSpec, "mask", v)
            elif k == "layers" and v is not None:
                if not isinstance(v, (list, tuple)):
                    raise ValueError(f"scheme.layers must be a list of scheme dicts, got {v!r}")
                kw[k] = tuple(cls.from_dict(x) for x in v)
            else:
                kw[k] = v
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> PositionScheme:
        if not isinstance(s, (str, bytes)):
            raise ValueError(f"from_json needs a JSON string, got {type(s).__name__}")
        try:
            d = json.loads(s)
        except json.JSONDecodeError as exc:
            raise ValueError(f"scheme JSON is not valid JSON: {exc}") from None
        return cls.from_dict(d)

    # ---------------------------------------------------------------- presets
    @staticmethod
    def presets() -> dict[str, str]:
        """Preset name -> one-line description (trained-in schemes and inference-time methods)."""
        out = {k: v[1] for k, v in TRAINED.items()}
        out.update({k: m.description for k, m in METHODS.items()})
        return out

    @classmethod
    def preset(cls, name: str, **params) -> PositionScheme:
        """Build a preset. Inference-time methods apply to a default RoPE scheme (``train_len``
        required); ``"a+b"`` composes methods in order (see :meth:`extend` for how parameters are
        shared). Unknown names and parameters raise ``ValueError`` here, not at the first forward."""
        split_spec(name, "preset name")
        if name in TRAINED:
            return _call_preset(name, TRAINED[name][0], params)
        try:
            methods = parse_methods(name, identity=False)
        except UnknownMethodError as exc:
            raise ValueError(f"unknown preset {exc.name!r}; trained-in presets: {sorted(TRAINED)}; "
                             f"inference-time methods (combine with '+'): {sorted(METHODS)}") from None
        accepted = {a for m in methods for a in m.param_names}
        base_keys = ("train_len", "layout") + (() if "base" in accepted else ("base",))
        base_kw = {k: params.pop(k) for k in base_keys if k in params}
        if "train_len" not in base_kw:
            raise ValueError(f"preset {name!r} is an inference-time method: pass train_len=<trained length>")
        base = TRAINED["rope"][0](**base_kw)
        return base.extend(name, **params)

    def extend(self, method: str, layers=None, *, hf: bool = False, **params) -> PositionScheme:
        """Apply an inference-time method (or ``"a+b"``) to this scheme, keeping what it trained with.

        Each parameter goes to *every* method of the composition that accepts it:
        ``extend("sliding_window+streaming_llm", window=4)`` gives ``window=4`` to both. A parameter
        that no method of the composition accepts raises ``ValueError``. For a layer pattern the method
        applies to the layers with a RoPE part, or to the indices into ``layers`` given as ``layers=``
        (:func:`posenc.scheme.pattern.extend_pattern`); an embedding method applies to the pattern's embedding.
        ``hf``: also the methods named as Hugging Face models name them (``longrope``, ``linear``), as
        :func:`posenc.hf.extend` reads them."""
        if self.layers is not None or layers is not None:
            from posenc.scheme.pattern import extend_pattern

            return extend_pattern(self, method, layers, params)
        methods = [m for m in parse_methods(method, hf=hf) if not m.is_identity]
        scheme = self
        used: set[str] = set()
        for m in methods:
            mine = {k: v for k, v in params.items() if k in m.param_names}
            used.update(mine)
            scheme = m.build(scheme, **mine)
        unused = sorted(set(params) - used)
        if unused:
            accepted = sorted({a for m in methods for a in m.param_names})
            raise ValueError(f"parameters {unused} are not used by method {method!r}; it takes {accepted}")
        name = method if self.name in ("rope", "custom") else f"{self.name}:{method}"
        return replace(scheme, name=name)

    def describe(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name) not in (None, False) and f.name != "name"]
        return f"{self.name}(" + ", ".join(parts) + ")"


def _call_preset(name: str, fn: Callable[..., PositionScheme], params: dict, *scheme) -> PositionScheme:
    """Call a preset factory; an unexpected keyword becomes a ``ValueError`` naming it and the accepted ones."""
    import inspect
    import re

    try:
        return fn(*scheme, **params)
    except TypeError as exc:
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if bad is None:
            raise
        sig = inspect.signature(fn).parameters.values()
        accepted = {p.name for p in sig if p.kind is p.POSITIONAL_OR_KEYWORD} - {"scheme"}
        if any(p.kind is p.VAR_KEYWORD for p in sig):  # rope-like presets pass the rest to RopeSpec
            accepted |= {f.name for f in fields(RopeSpec)}
        raise ValueError(f"preset {name!r} does not take parameter {bad.group(1)!r}; it takes "
                         f"{sorted(accepted)}") from None


# ===================================================================== trained-in presets
def _multiaxis(name: str, kind: str, causal: bool, layout: str):
    """Multi-axis RoPE presets: ``base``/``layout``/``partial_rotary_factor`` go to the RoPE part, ``causal``
    to the mask (ViT-style presets attend both ways), the rest to the multi-axis part."""

    def make(train_len=None, base=10000.0, layout=layout, partial_rotary_factor=1.0, causal=causal, **params):
        return PositionScheme(name=name,
                              rope=RopeSpec(base=base, layout=layout, partial_rotary_factor=partial_rotary_factor),
                              mask=MaskSpec(causal=causal), multiaxis=Part(kind, params), train_len=train_len)

    return make


def _rope(train_len=None, base=10000.0, layout="half", partial_rotary_factor=1.0, **kw):
    return PositionScheme(name="rope", rope=RopeSpec(base=base, layout=layout,
                                                     partial_rotary_factor=partial_rotary_factor, **kw),
                          train_len=train_len)


def _xpos(train_len=None, base=10000.0, scale_base=512):
    return PositionScheme(name="xpos", rope=RopeSpec(base=base, xpos=True, xpos_scale_base=scale_base),
                          train_len=train_len)


def _embedding(kind):
    def make(train_len=None, **params):
        from posenc.parts.absolute import has_table

        if has_table(kind):
            if train_len is None and "max_positions" not in params:
                raise ValueError(f"preset {kind!r} needs train_len (the size of its learned table)")
            size = params.get("max_positions", train_len)
            params["max_positions"] = check_positive_int(f"{kind}.max_positions", size)
        record = METHODS.get(kind)  # a preset that is also a method (hierarchical): its ranges, now
        for key in [k for k in params if record is not None and record.param(k) is not None]:
            params[key] = record.param(key).checked(kind, params[key])
        return PositionScheme(name=kind, embedding=Part(kind, params), train_len=train_len)

    return make


def _bias(kind):
    def make(train_len=None, **params):
        return PositionScheme(name=kind, bias=Part(kind, params), train_len=train_len)

    return make


def _relative(kind):
    def make(train_len=None, **params):
        memory = None
        if kind == "transformer_xl":
            mem_len = params.pop("mem_len", train_len)
            memory = Part("xl_recurrence", {"mem_len": mem_len}) if mem_len else None
        return PositionScheme(name=kind, relative=Part(kind, params), train_len=train_len, memory=memory)

    return make


def _infini(train_len=None, segment_len=None, rope=True, delta_rule=False, **params):
    """``delta_rule`` goes to the memory (Munkhdalai et al. 2024, eq. 10); other parameters to RoPE."""
    seg = check_positive_int("infini.segment_len", segment_len) if segment_len is not None else (
        train_len // 4 if train_len else None)  # 0 is refused, not replaced by the default
    if seg is None:
        raise ValueError("preset 'infini' needs train_len or segment_len")
    _check_bool("infini.rope", rope)
    if not isinstance(delta_rule, bool):
        raise TypeError(f"infini.delta_rule must be a bool, got {delta_rule!r}")
    memory = {"segment_len": seg, **({"delta_rule": True} if delta_rule else {})}
    return PositionScheme(name="infini", rope=RopeSpec(**params) if rope else None,
                          memory=Part("infini", memory), train_len=train_len)


# ===================================================================== layer patterns
def _period(name: str, every) -> int:
    every = check_positive_int(f"{name}.every", every)  # 2.0 -> 2: a float period would repeat a tuple 2.0 times
    if every < 2:
        raise ValueError(f"{name}.every must be >= 2 (one special layer after every - 1 others), got {every}")
    return every


def _pattern(name: str, train_len, every: int, regular: PositionScheme, special: PositionScheme) -> PositionScheme:
    """``every - 1`` regular layers, then one special layer (transformers' ``(i + 1) % every == 0`` rule)."""
    return PositionScheme(name=name, train_len=train_len,
                          layers=(replace(regular, train_len=train_len),) * (every - 1)
                          + (replace(special, train_len=train_len),))


def _irope(train_len=None, every=4, chunk=None, base=10000.0, attn_scale=0.1, floor_scale=None, layout="half"):
    """Llama 4's iRoPE (Meta, "The Llama 4 herd", ai.meta.com/blog/llama-4-multimodal-intelligence;
    transformers ``Llama4TextConfig``: ``no_rope_layers``, ``attention_chunk_size``, ``attn_temperature_tuning``):
    RoPE layers with chunked attention (a query sees its own ``chunk`` only) and every ``every``-th layer NoPE
    with full causal attention and query temperature ``1 + attn_scale log(floor((p + 1) / floor_scale) + 1)``.
    Llama 4: every 4, chunk 8192, floor_scale 8192, attn_scale 0.1, base 5e5, ``layout="interleaved"``. Lab
    defaults: chunk = train_len // 4, floor_scale = chunk, base 1e4, half layout. (Llama 4's L2 norm of q and k
    in RoPE layers, ``use_qk_norm``, is not a position part and is not modelled.)"""
    every = _period("irope", every)
    if chunk is None:
        if train_len is None:
            raise ValueError("preset 'irope' needs train_len or chunk")
        chunk = max(1, train_len // 4)
    chunk = check_positive_int("irope.chunk", chunk)
    rope = PositionScheme(name="rope_chunked", rope=RopeSpec(base=base, layout=layout), mask=MaskSpec(chunk=chunk))
    floor_scale = float(chunk) if floor_scale is None else floor_scale  # the part checks a given value
    temp = Part("llama4", {"attn_scale": attn_scale, "floor_scale": floor_scale})
    return _pattern("irope", train_len, every, rope, PositionScheme(name="nope_temperature", temperature=temp))


def _local_global(train_len=None, every=6, window=None, local_base=10000.0, global_base=1000000.0):
    """Gemma 3's local/global attention (Gemma Team, arXiv 2503.19786): ``every - 1`` sliding-window RoPE
    layers (base ``local_base``) then one global RoPE layer (base ``global_base``). Gemma 3: 5 local : 1
    global (``every=6``), window 1024, bases 1e4 / 1e6. Lab default window: train_len // 4; for a 2-4
    layer model pass ``every=2`` (local, global alternating)."""
    every = _period("local_global", every)
    if window is None:
        if train_len is None:
            raise ValueError("preset 'local_global' needs train_len or window")
        window = max(1, train_len // 4)
    window = check_positive_int("local_global.window", window)
    local = PositionScheme(name="rope_local", rope=RopeSpec(base=local_base), mask=MaskSpec(window=window))
    return _pattern("local_global", train_len, every, local,
                    PositionScheme(name="rope_global", rope=RopeSpec(base=global_base)))


def _nope_every(train_len=None, every=4, base=10000.0):
    """SmolLM3's NoPE layers (Hugging Face, huggingface.co/blog/smollm3; after Yang et al., "RoPE to NoRoPE
    and back again", arXiv 2501.18795; transformers ``SmolLM3Config.no_rope_layers``): RoPE layers and every
    ``every``-th layer without positional encoding. For a 2-3 layer model pass ``every=2``."""
    every = _period("nope_every4", every)
    return _pattern("nope_every4", train_len, every, PositionScheme(name="rope", rope=RopeSpec(base=base)),
                    PositionScheme(name="nope"))


TRAINED: dict[str, tuple[Callable[..., PositionScheme], str]] = {
    "nope": (_embedding("nope"), "no positional information (causal mask only)"),
    "sinusoidal": (_embedding("sinusoidal"), "Vaswani et al. 2017: fixed sin/cos added to embeddings"),
    "learned": (_embedding("learned"), "trained absolute table (GPT-2/BERT); fails beyond its length"),
    "hierarchical": (_embedding("hierarchical"), "Su: learned table extended to n^2 by decomposition"),
    "floater": (_embedding("floater"), "Liu et al. 2020: positions from a neural ODE"),
    "complex_order": (_embedding("complex_order"), "Wang et al. 2020: r e^{i(w p + theta)} embeddings"),
    "shaw": (_relative("shaw"), "Shaw et al. 2018: clipped relative K and V embeddings"),
    "transformer_xl": (_relative("transformer_xl"), "Dai et al. 2019: u, v, R terms + segment recurrence"),
    "t5": (_bias("t5"), "Raffel et al. 2020: learned bucketed relative bias"),
    "deberta": (_relative("deberta"), "He et al. 2021: disentangled c2p + p2c attention"),
    "rope": (_rope, "Su et al. 2021: rotary position embedding"),
    "xpos": (_xpos, "Sun et al. 2022: RoPE with exponential decay scale"),
    "alibi": (_bias("alibi"), "Press et al. 2021: linear distance penalty per head"),
    "kerple_power": (_bias("kerple_power"), "Chi et al. 2022: -r1 |m-n|^r2"),
    "kerple_log": (_bias("kerple_log"), "Chi et al. 2022: -r1 log(1 + r2 |m-n|)"),
    "sandwich": (_bias("sandwich"), "Chi et al. 2023: sinusoidal inner product bias"),
    "infini": (_infini, "Munkhdalai et al. 2024: compressive memory + local attention"),
    "rope_2d": (_multiaxis("rope_2d", "axial", causal=False, layout="interleaved"),
                "axial 2D RoPE (rotary-embedding-torch get_axial_freqs; Heo et al. 2024, arXiv 2403.13298)"),
    "rope_mixed": (_multiaxis("rope_mixed", "mixed", causal=False, layout="interleaved"),
                   "Heo et al. 2024: RoPE-Mixed, learned per-head 2D frequencies (arXiv 2403.13298)"),
    "mrope": (_multiaxis("mrope", "mrope", causal=True, layout="half"),
              "Wang et al. 2024: Qwen2-VL M-RoPE, t/h/w sections (arXiv 2409.12191)"),
    "irope": (_irope, "Llama 4 iRoPE: chunked RoPE layers + every 4th NoPE with temperature (layer pattern)"),
    "local_global": (_local_global, "Gemma 3: 5 sliding-window RoPE (1e4) : 1 global (1e6) (layer pattern)"),
    "nope_every4": (_nope_every, "SmolLM3: RoPE layers, every 4th layer NoPE (layer pattern)"),
}


def _from_record(m):
    """A trained-in preset from its :data:`~posenc.methods.TRAINED_METHODS` record: the record's
    part on its ``base_preset``."""

    def make(train_len=None, **params):
        return replace(m.build(TRAINED[m.base_preset][0](train_len=train_len), **params), name=m.name)

    return make


TRAINED.update({name: (_from_record(m), m.description) for name, m in TRAINED_METHODS.items()})
