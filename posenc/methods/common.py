"""How methods apply, shared by the families: the checks every method makes of the scheme it extends (``need_rope``,
``need_train_len``), writing a frequency schedule into ``rope.scaling`` (``scaling``, ``dynamic``), setting a remap
part (``set_remap``, ``remap``), and the parameter builders the records share (``factor_param``, ``window_param``,
``ROPE``, ``STEP``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from posenc._util import check_finite, check_positive_int
from posenc.methods.records import Method, Param
from posenc.scheme.part import Part


def need_rope(scheme, method: str):
    if scheme.rope is None:
        raise ValueError(f"method {method!r} applies to a RoPE scheme; {scheme.name!r} has no rotary part")
    return scheme.rope


def need_train_len(scheme, method: str) -> int:
    if scheme.train_len is None:
        raise ValueError(f"method {method!r} needs the scheme's train_len (the length it was trained at)")
    return scheme.train_len


def scaling(m: Method, scheme, factor=None, **params):
    """Write ``m.scaling_type`` into ``rope.scaling`` (messages name the rope_type, as the parts do)."""
    rope_type = m.scaling_type
    rope = need_rope(scheme, rope_type)
    train_len = need_train_len(scheme, rope_type)
    carried = {}
    if rope.scaling == {"rope_type": "default", "resonance": True}:  # Resonance RoPE stacks on a schedule
        carried, rope = {"resonance": True}, replace(rope, scaling=None)
    if rope.scaling is not None:
        raise ValueError(
            f"{scheme.name!r} already has rope scaling {rope.scaling.get('rope_type')!r}; "
            f"frequency schedules do not stack"
        )
    needs_factor = m.param("factor") is not None and m.param("factor").required
    if needs_factor and factor is None and "alpha" not in params:
        raise ValueError(f"method {rope_type!r} needs factor (e.g. target length / train_len = N/{train_len})")
    scaling = {
        "rope_type": rope_type,
        "original_max_position_embeddings": train_len,
        **m.filled_defaults(train_len),
        **params,
        **carried,
    }
    if factor is not None:
        scaling["factor"] = check_finite(f"{rope_type}.factor", factor, minimum=1.0)
    return replace(scheme, rope=replace(rope, scaling=scaling))


def dynamic(m: Method, scheme, step=None, **params):
    """A dynamic schedule (:func:`scaling`) whose length is recomputed every ``step`` positions:
    ``rope.dynamic_step`` (query m uses the schedule of length ``ceil((m + 1) / step) * step``, so a full
    forward still equals cached decoding; ``step=1`` is the exact per-token form). A larger step lets the
    engine run the queries of one step in one call instead of one call per position."""
    s = scaling(m, scheme, **params)
    if step is None:
        return s
    return replace(s, rope=replace(s.rope, dynamic_step=check_positive_int(f"{m.name}.step", step)))


def set_remap(scheme, kind: str, params: dict, defaults: Callable[[int], dict] = lambda L: {}):
    if scheme.rope is None and scheme.bias is None:
        raise ValueError(
            f"method {kind!r} remaps relative positions; {scheme.name!r} has neither a rotary nor a bias part"
        )
    if scheme.remap is not None:
        raise ValueError(f"{scheme.name!r} already remaps positions ({scheme.remap.kind}); remaps do not stack")
    train_len = need_train_len(scheme, kind)
    return replace(scheme, remap=Part(kind, {**defaults(train_len), **params}))


def remap(m: Method, scheme, **params):
    return set_remap(scheme, m.remap_kind, params, m.filled_defaults)


def positive_or_default(name: str, value, default: int) -> int:
    """``None`` -> ``default``; else an integer >= 1 (0 is refused, never silently replaced)."""
    return default if value is None else check_positive_int(name, value)


def identity(m: Method, scheme):
    return scheme


def factor_param(rule: str = "required", required: bool = True, **kw) -> Param:
    """The ``factor`` of a frequency schedule (>= 1); required unless ``required=False``."""
    return Param(name="factor", rule=rule, minimum=1.0, required=required, **kw)


def window_param(rule: str, fn: Callable[[int], int], filled: bool = False, original: str = "") -> Param:
    return Param(name="window", rule=rule, minimum=1, integer=True, from_train_len=fn, filled=filled, original=original)


ROPE = ("rope.scaling",)
STEP = Param(
    name="step", default=1, minimum=1, integer=True
)  # dynamic schedules: recompute the length every `step` positions
