"""Layer patterns: a :class:`~posenc.scheme.PositionScheme` whose ``layers`` holds one scheme per layer.

Layer i of a model uses ``layers[i % len(layers)]``, so a pattern is one period of the model's layers:
Llama 4's iRoPE (three chunked-attention RoPE layers, then a NoPE layer with temperature tuning), Gemma 3's
five sliding-window RoPE layers (base 1e4) and one global layer (base 1e6), SmolLM3's NoPE every 4th layer.
The pattern keeps only the model-level parts (``name``, ``embedding``, ``train_len``); every other part
lives in its layers. This module checks a pattern (:func:`check_pattern`) and applies inference-time
methods to chosen layers (:func:`extend_pattern`); the presets are in :mod:`posenc.scheme.core`.
"""

from __future__ import annotations

from dataclasses import fields, replace

from posenc.methods import parse_methods

__all__ = ["check_pattern", "choose_layers", "extend_pattern"]

_MODEL_LEVEL = ("name", "embedding", "train_len", "layers")


def check_pattern(scheme, cls) -> tuple:
    """The pattern's ``layers`` as a tuple of ``cls`` (a PositionScheme), after checking that it is one:
    a non-empty list of schemes without their own embedding, memory or nested pattern, and a pattern
    whose own fields other than ``name``/``embedding``/``train_len`` are unset."""
    layers = scheme.layers
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(f"scheme.layers must be a non-empty tuple of PositionSchemes, got {layers!r}")
    layers = tuple(layers)
    for i, s in enumerate(layers):
        if not isinstance(s, cls):
            raise ValueError(f"scheme.layers[{i}] must be a PositionScheme, got {type(s).__name__}")
        if s.layers is not None:
            raise ValueError(f"scheme.layers[{i}] ({s.name!r}) is itself a layer pattern; patterns do not nest")
        if s.embedding.kind != "nope":
            raise ValueError(f"scheme.layers[{i}] ({s.name!r}) has a {s.embedding.kind!r} embedding; the embedding "
                             f"is added once, before the first layer: put it on the pattern (embedding=...)")
        if s.memory is not None:
            raise ValueError(f"scheme.layers[{i}] ({s.name!r}) carries memory ({s.memory.kind}); layer patterns "
                             f"take attention parts only")
    default = cls()
    own = [f.name for f in fields(cls) if f.name not in _MODEL_LEVEL
           and getattr(scheme, f.name) != getattr(default, f.name)]
    if own:
        raise ValueError(f"layer pattern {scheme.name!r} sets {own} on itself; a pattern holds only name, embedding "
                         f"and train_len, and its layers hold every attention part")
    return layers


def choose_layers(scheme, layers) -> list[int]:
    """Indices into ``scheme.layers``: ``layers`` checked (integers in range, no repeats), or, when None, the
    layers with a RoPE part (``ValueError`` when there are none)."""
    n = len(scheme.layers)
    if layers is None:
        chosen = [i for i, s in enumerate(scheme.layers) if s.rope is not None]
        if not chosen:
            raise ValueError(f"layer pattern {scheme.name!r} has no RoPE layer; choose the layers with layers=[...]")
        return chosen
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    try:
        chosen = list(layers)
    except TypeError:
        raise ValueError(f"layers must be a list of layer indices, got {layers!r}") from None
    bad = [i for i in chosen if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise ValueError(f"layers must be distinct indices in [0, {n}) of pattern {scheme.name!r}'s layers, "
                         f"got {layers!r}")
    return sorted(chosen)


def extend_pattern(scheme, method: str, layers, params: dict):
    """``scheme.extend(method, layers=layers, **params)`` for a layer pattern: each chosen layer (default: the
    RoPE layers) becomes ``layer.extend(method, **params)``; the others stay as they are. A method that sets
    the embedding (``hierarchical``) applies to the pattern's own embedding and takes no ``layers``."""
    if scheme.layers is None:
        raise ValueError(f"layers= chooses layers of a layer pattern; {scheme.name!r} is one scheme for every "
                         f"layer (TinyLM.with_scheme(method, layers=...) makes a pattern of a model's layers)")
    methods = [m for m in parse_methods(method) if not m.is_identity]
    on_embedding = ["embedding" in m.sets for m in methods]
    if any(on_embedding):
        if not all(on_embedding) or layers is not None:
            raise ValueError(f"method {method!r} mixes an embedding method with layer methods or names layers; "
                             f"apply the embedding method on its own, without layers=")
        flat = replace(scheme, layers=None, name="custom").extend(method, **params)
        return replace(scheme, embedding=flat.embedding, name=f"{scheme.name}:{method}")
    chosen = choose_layers(scheme, layers)
    new = list(scheme.layers)
    for i in chosen:
        new[i] = new[i].extend(method, **params)
    return replace(scheme, layers=tuple(new), name=f"{scheme.name}:{method}")

