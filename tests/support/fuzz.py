"""Shared pieces of the differential fuzz tests: hypothesis profiles and strategies.

Profiles (registered on import, loaded from ``POSENC_HYPOTHESIS_PROFILE``):

``ci``    (default) derandomized: the same examples in every run and on every machine, so a CI failure
          reproduces with a plain re-run. Small example counts (the whole fuzz suite stays within ~40 s on
          2 cores); compiled FlexAttention only on the pinned ``@example`` shapes.
``fuzz``  randomised, long (``make fuzz``): many examples per test, compiled flex on drawn schemes too.

``POSENC_FUZZ_EXAMPLES`` overrides the example count of every fuzz test (both profiles) and
``POSENC_FUZZ_FLEX_EXAMPLES`` that of the compiled-flex test (it is a separate knob because each new
flex graph costs 10-30 s of compilation on CPU).

Schemes are drawn by construction, not by rejection: a trained base (any preset), then at most one
frequency schedule (RoPE bases only), one position remap, one mask method and log-n, each with parameters
anywhere in its valid range, combined with ``+`` when no parameter name is shared by two of the methods
(otherwise applied one ``extend`` at a time, so the tests do not depend on how ``+`` routes a shared
parameter), and optionally a logit soft-cap.
"""

from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from posenc import PositionScheme
from posenc.scheme.core import METHODS

PROFILE = os.environ.get("POSENC_HYPOTHESIS_PROFILE", "ci")
_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("fuzz", derandomize=False, database=None, **_COMMON)
if PROFILE not in ("ci", "fuzz"):
    raise ValueError(f"POSENC_HYPOTHESIS_PROFILE must be 'ci' or 'fuzz', got {PROFILE!r}")
settings.load_profile(PROFILE)
FUZZ = PROFILE == "fuzz"


def examples(ci: int, fuzz: int, env: str = "POSENC_FUZZ_EXAMPLES") -> int:
    """Example count for a test: ``env`` if set, else the profile's default."""
    value = os.environ.get(env)
    if value is not None:
        n = int(value)
        if n < 1:
            raise ValueError(f"{env} must be an integer >= 1, got {value!r}")
        return n
    return fuzz if FUZZ else ci


def flex_settings(ci_generated: int, fuzz: int) -> settings:
    """Settings of the compiled-flex tests: in CI only the pinned ``@example`` cases run unless
    ``POSENC_FUZZ_FLEX_EXAMPLES`` asks for generated ones too."""
    env = os.environ.get("POSENC_FUZZ_FLEX_EXAMPLES")
    if not FUZZ and env is None and ci_generated == 0:
        return settings(phases=[Phase.explicit])
    return settings(max_examples=examples(max(ci_generated, 1), fuzz, "POSENC_FUZZ_FLEX_EXAMPLES"))


# ====================================================================== schemes
ROPE_BASES = ("rope", "xpos")
BIAS_BASES = ("alibi", "kerple_power", "kerple_log", "sandwich", "t5")
EMBEDDING_BASES = ("nope", "sinusoidal", "learned", "hierarchical", "floater", "complex_order")
RELATIVE_BASES = ("shaw", "transformer_xl", "deberta")
SCALINGS = ("pi", "ntk", "ntk_mixed", "dynamic_ntk", "dynamic_ntk_qwen", "yarn", "dynamic_yarn", "llama3",
            "rope_base", "p_rope")
REMAPS = ("rerope", "leaky_rerope", "selfextend", "pcw", "lm_infinite", "streaming_llm", "dca", "string", "retrieval",
          "duo")
MASKS = ("sliding_window", "bca", "chunked_attention")
DRAWN_METHODS = set(SCALINGS) | set(REMAPS) | set(MASKS) | {"logn", "temperature_tuning", "resonance"}
# "hierarchical" reads a learned table (an embedding: nothing for attention to execute): drawn by the
# cached-decode test through the "hierarchical" trained preset instead.
assert DRAWN_METHODS | {"hierarchical"} == set(METHODS), "a method was added: teach tests/support/fuzz.py to draw it"

LONG = 400  # largest window / length parameter drawn


class Drawn:
    """A drawn scheme and the recipe that built it (printed by hypothesis on failure)."""

    def __init__(self, scheme: PositionScheme, recipe: str):
        self.scheme, self.recipe = scheme, recipe

    def __repr__(self) -> str:
        return self.recipe


def _factor():
    return st.floats(1.0, 64.0, allow_nan=False)


def _base():
    return st.sampled_from([10.0, 100.0, 500.0, 10000.0, 5e5, 1e6])


@st.composite
def _trained(draw, allowed: tuple[str, ...], train_len: int, head_dim: int):
    name = draw(st.sampled_from(allowed))
    kw: dict = {"train_len": train_len}
    if name == "rope":
        kw["base"] = draw(_base())
        kw["layout"] = draw(st.sampled_from(["half", "interleaved"]))
        halves = [f for f in (1.0, 0.5, 0.25) if int(head_dim * f) % 2 == 0 and int(head_dim * f) >= 4]
        kw["partial_rotary_factor"] = draw(st.sampled_from(halves))
    elif name == "xpos":
        kw["base"] = draw(_base())
        kw["scale_base"] = draw(st.integers(8, 4096))
    elif name == "t5":
        kw["num_buckets"] = draw(st.integers(2, 64))
        kw["max_distance"] = draw(st.integers(kw["num_buckets"] // 2 + 1, 512))
        kw["init_std"] = draw(st.floats(0.0, 2.0))
    elif name == "sandwich":
        kw["dim"] = 2 * draw(st.integers(1, 64))
        kw["base"] = draw(st.floats(2.0, 1e5))
    elif name in ("shaw", "deberta"):
        kw["max_distance"] = draw(st.integers(1, 128))
    elif name == "transformer_xl":
        kw["base"] = draw(_base())
        kw["mem_len"] = 0  # the recurrence lives in the model (and refuses a KV cache)
    return name, kw


@st.composite
def _scaling(draw, head_dim: int, partial: float):
    # p_rope picks the rotated pairs itself: only on a whole-head rotation, with p * head_dim even
    fractions = [p for p in (0.25, 0.5, 0.75, 1.0) if float(p * head_dim).is_integer() and int(p * head_dim) % 2 == 0
                 and p * head_dim >= 2]
    m = draw(st.sampled_from(SCALINGS if partial == 1.0 and fractions else SCALINGS[:-1]))
    if m == "p_rope":
        return m, {"p": draw(st.sampled_from(fractions))}
    if m == "rope_base":
        return m, {"base": draw(st.floats(1.5, 1e7))}
    if m in ("pi", "dynamic_ntk"):
        return m, {"factor": draw(_factor())}
    if m == "ntk":
        return m, {draw(st.sampled_from(["factor", "alpha"])): draw(_factor())}
    if m == "ntk_mixed":
        return m, {"factor": draw(_factor()), "b": draw(st.floats(0.1, 2.0))}
    if m == "llama3":
        low = draw(st.floats(0.5, 4.0))
        return m, {"factor": draw(_factor()), "low_freq_factor": low,
                   "high_freq_factor": low + draw(st.floats(0.25, 8.0))}
    if m in ("yarn", "dynamic_yarn"):
        slow = draw(st.floats(0.25, 4.0))
        kw = {"beta_slow": slow, "beta_fast": slow + draw(st.floats(0.5, 64.0))}
        if m == "yarn":
            kw["factor"] = draw(_factor())
            temp = draw(st.sampled_from(["default", "attention_factor", "mscale"]))
            if temp == "attention_factor":
                kw["attention_factor"] = draw(st.floats(0.25, 2.0))
            elif temp == "mscale":
                kw["mscale"] = draw(st.floats(0.1, 2.0))
                kw["mscale_all_dim"] = draw(st.floats(0.1, 2.0))
            kw["truncate"] = draw(st.booleans())
        return m, kw
    return m, {}  # dynamic_ntk_qwen


@st.composite
def _remap(draw, has_rope: bool):
    m = draw(st.sampled_from(REMAPS if has_rope else tuple(r for r in REMAPS if r not in ("pcw", "retrieval", "duo",
                                                                                          "string"))))
    w = draw(st.integers(1, LONG))
    if m == "rerope":
        return m, {"window": w}
    if m == "leaky_rerope":  # window * (factor - 1) must be an integer
        return m, {"window": w, "factor": 1.0 + draw(st.integers(0, 8 * w)) / w}
    if m == "selfextend":
        return m, {"window": w, "group": draw(st.integers(1, 16))}
    if m == "pcw":
        return m, {"window": w, "n_windows": draw(st.integers(1, 8))}
    if m == "lm_infinite":
        return m, {"window": w, "n_global": draw(st.integers(0, 16)), "ceiling": draw(st.integers(1, LONG))}
    if m == "dca":
        chunk = draw(st.integers(2, LONG))
        kw = {"chunk": chunk, "local": draw(st.integers(0, chunk - 1))}
        temperature = draw(st.sampled_from(["none", "chunkllama", "qwen"]))
        if temperature != "none":  # "sequence" (ChunkLlama's prefill) is length-of-call: engine tests only
            kw["temperature"] = temperature
        return m, kw
    if m == "string":
        shift = draw(st.integers(1, LONG))
        return m, {"shift": shift, "local": draw(st.integers(0, shift)),
                   "attention_factor": draw(st.sampled_from([1.0, 1.0 + 0.1 * 0.6931471805599453]))}
    if m == "retrieval":
        return m, {"window": w, "n_sinks": draw(st.integers(0, 16)), "block": draw(st.integers(1, 32)),
                   "top_k": draw(st.integers(0, 8)), "per_head": draw(st.booleans())}
    if m == "duo":  # query heads 0..2 exist in every drawn case (H >= 1): draw among the first ones
        return m, {"streaming": draw(st.lists(st.integers(0, 0), max_size=1, unique=True)),
                   "n_sinks": draw(st.integers(0, 16)), "window": w}
    return m, {"window": w, "n_sinks": draw(st.integers(0, 16))}  # streaming_llm


@st.composite
def _mask(draw):
    m = draw(st.sampled_from(MASKS))
    if m == "sliding_window":
        return m, {"window": draw(st.integers(1, LONG))}
    if m == "chunked_attention":
        return m, {"chunk": draw(st.integers(1, 200))}
    return m, {"block": draw(st.integers(1, 200))}


def _compose(base: PositionScheme, methods: list[tuple[str, dict]]) -> PositionScheme:
    """``base.extend("a+b", **params)`` when no parameter name is accepted by two of the methods, else
    one ``extend`` per method (so neither the old nor the new routing of shared names matters)."""
    if not methods:
        return base
    accepted = [set(METHODS[m].param_names) for m, _ in methods]
    given = [k for _, p in methods for k in p]
    shared = any(sum(k in a for a in accepted) > 1 for k in given)
    if not shared:
        merged = {k: v for _, p in methods for k, v in p.items()}
        return base.extend("+".join(m for m, _ in methods), **merged)
    for m, p in methods:
        base = base.extend(m, **p)
    return base


@st.composite
def schemes(draw, head_dim: int, *, bases: tuple[str, ...] | None = None, softcap: bool = True,
            train_len=None) -> Drawn:
    """A random scheme for ``head_dim`` (see the module docstring)."""
    bases = bases or (ROPE_BASES + BIAS_BASES + EMBEDDING_BASES + RELATIVE_BASES)
    L = draw(train_len if train_len is not None else st.integers(4, 256))
    name, kw = draw(_trained(bases, L, head_dim))
    base = PositionScheme.preset(name, **kw)
    methods: list[tuple[str, dict]] = []
    if base.rope is not None and draw(st.booleans()):
        methods.append(draw(_scaling(head_dim, base.rope.partial_rotary_factor)))
    if base.rope is not None and draw(st.integers(0, 4)) == 0 and not any(m == "p_rope" for m, _ in methods):
        methods.append(("resonance", {}))  # Resonance RoPE rounds any schedule's wavelengths (p_rope sets its own)
    remap = None
    if (base.rope is not None or base.bias is not None) and draw(st.booleans()):
        remap = draw(_remap(base.rope is not None))
        methods.append(remap)
    if (remap is None or remap[0] not in ("lm_infinite", "streaming_llm")) and draw(st.integers(0, 2)) == 0:
        methods.append(draw(_mask()))
    if draw(st.integers(0, 3)) == 0:
        methods.append(("logn", {}))
    dca_temperature = remap is not None and "temperature" in remap[1]  # temperatures do not stack
    if not dca_temperature and draw(st.integers(0, 3)) == 0:
        methods.append(("temperature_tuning", {"attn_scale": draw(st.floats(0.0, 1.0)),
                                               "floor_scale": draw(st.floats(0.5, 64.0))}))
    methods = draw(st.permutations(methods))
    scheme = _compose(base, methods)
    cap = draw(st.none() | st.floats(0.5, 50.0)) if softcap else None
    if cap is not None:
        scheme = replace(scheme, softcap=cap)
    recipe = f"preset({name!r}, **{kw!r})" + "".join(f".extend({m!r}, **{p!r})" for m, p in methods)
    if cap is not None:
        recipe += f" softcap={cap!r}"
    return Drawn(scheme, recipe)
