"""Frequency schedules (``kind`` ``frequencies``/``base``): each writes a ``rope_type`` into the scheme's
``rope.scaling`` (or changes its base); the formulas are :mod:`posenc.parts.frequencies`. ``TRANSFORMERS_ONLY``: the
schedules of transformers' names that only :func:`posenc.hf.extend` takes (``dynamic``; ``longrope``, which also runs
on posenc's engine with ``native=False``)."""

from __future__ import annotations

from dataclasses import replace

from posenc._util import check_finite
from posenc.methods.common import ROPE, STEP, dynamic, factor_param, need_rope, scaling
from posenc.methods.records import Method, Param


def _base_change(m: Method, scheme, base=None):
    rope = need_rope(scheme, m.name)
    if base is None:
        raise ValueError(f"method {m.name!r} needs base=<new RoPE base> (larger or smaller than the trained one)")
    return replace(scheme, rope=replace(rope, base=check_finite("base", base, minimum=0.0, strict_min=True)))


def _resonance(m: Method, scheme):
    """Add ``resonance: True`` to the rope scaling (a plain RoPE gets ``{"rope_type": "default", ...}``): every
    schedule's wavelengths are then rounded to integers (:func:`posenc.parts.frequencies.rope_frequencies`)."""
    rope = need_rope(scheme, m.name)
    scaling = dict(rope.scaling or {"rope_type": "default"})
    if scaling.get("resonance"):
        raise ValueError(f"{scheme.name!r} already has Resonance RoPE")
    return replace(scheme, rope=replace(rope, scaling={**scaling, "resonance": True}))


def _p_rope(m: Method, scheme, p=None):
    """Write transformers' ``proportional`` schedule with ``partial_rotary_factor = p`` (the fraction of the
    pairs, highest frequencies first, that stay rotated; the rest get frequency 0)."""
    rope = need_rope(scheme, m.name)
    if rope.scaling is not None:
        raise ValueError(
            f"{scheme.name!r} already has rope scaling {rope.scaling.get('rope_type')!r}; "
            f"frequency schedules do not stack"
        )
    if rope.partial_rotary_factor != 1.0:
        raise ValueError(
            f"method {m.name!r} chooses the rotated pairs itself; {scheme.name!r} already rotates "
            f"only partial_rotary_factor={rope.partial_rotary_factor} of the head"
        )
    p = m.param("p").default if p is None else check_finite(f"{m.name}.p", p, minimum=0.0, maximum=1.0, strict_min=True)
    return replace(scheme, rope=replace(rope, scaling={"rope_type": "proportional", "partial_rotary_factor": p}))


def _factor_default(L, n, head_dim, base):
    return {"factor": max(1.0, n / L)}


def _rope_base_default(L, n, head_dim, base):
    if head_dim is None or head_dim <= 2:
        raise ValueError("method 'rope_base' needs head_dim (> 2) to choose the new base")
    return {"base": float(base) * max(1.0, n / L) ** (head_dim / (head_dim - 2))}


YARN_PARAMS = (
    factor_param(),
    Param(name="beta_fast", default=32.0, minimum=0.0, strict=True),
    Param(name="beta_slow", default=1.0, minimum=0.0, strict=True),
    Param(name="attention_factor", rule="0.1 ln(factor) + 1", minimum=0.0, strict=True),
    Param(name="mscale", rule="off", minimum=0.0),
    Param(name="mscale_all_dim", rule="off", minimum=0.0),
    Param(name="truncate", default=True),
)


RECORDS = (
    Method(
        name="pi",
        kind="frequencies",
        description="Chen et al. 2023: positions divided by factor",
        paper="arXiv:2306.15595",
        apply=scaling,
        params=(factor_param(),),
        sets=ROPE,
        scaling_type="linear",
        eval_defaults=_factor_default,
        hf_rope_type="linear",
        hf_native=True,
    ),
    Method(
        name="ntk",
        kind="frequencies",
        description="NTK-aware: base * factor^(d/(d-2))",
        paper="https://redd.it/14lz7j5",
        apply=scaling,
        params=(factor_param("required (or alpha)"), Param(name="alpha", rule="factor", minimum=1.0)),
        sets=ROPE,
        scaling_type="ntk",
        eval_defaults=_factor_default,
    ),
    Method(
        name="ntk_mixed",
        kind="frequencies",
        description="Su: per-dimension exp(-a (i+1)^b) scaling",
        paper="https://kexue.fm/archives/9706",
        apply=scaling,
        params=(factor_param(), Param(name="b", default=0.75, minimum=0.0, strict=True)),
        sets=ROPE,
        scaling_type="ntk_mixed",
        eval_defaults=_factor_default,
    ),
    Method(
        name="dynamic_ntk",
        kind="frequencies",
        description="HF dynamic NTK: base grows with length",
        paper="https://redd.it/14mrgpr",
        apply=dynamic,
        params=(Param(name="factor", default=1.0, minimum=1.0, filled=True), STEP),
        sets=ROPE,
        scaling_type="dynamic",
        dynamic=True,
        hf_rope_type="dynamic",
    ),
    Method(
        name="dynamic_ntk_qwen",
        kind="frequencies",
        description="Qwen: alpha = 2^(ceil(log2(t/L))+1) - 1",
        paper="arXiv:2309.16609",
        apply=dynamic,
        params=(STEP,),
        sets=ROPE,
        scaling_type="dynamic_qwen",
        dynamic=True,
    ),
    Method(
        name="yarn",
        kind="frequencies",
        description="Peng et al. 2023: NTK-by-parts + attention temperature",
        paper="arXiv:2309.00071",
        apply=scaling,
        params=YARN_PARAMS,
        sets=ROPE,
        scaling_type="yarn",
        eval_defaults=_factor_default,
        hf_rope_type="yarn",
        hf_native=True,
        hf_original_len=True,
    ),
    Method(
        name="dynamic_yarn",
        kind="frequencies",
        description="YaRN with s = max(1, n / L)",
        paper="arXiv:2309.00071",
        apply=dynamic,
        params=(*YARN_PARAMS[1:3], STEP),
        sets=ROPE,
        scaling_type="dynamic_yarn",
        dynamic=True,
    ),
    Method(
        name="llama3",
        kind="frequencies",
        description="Meta Llama 3.1 frequency-band scaling",
        paper="arXiv:2407.21783",
        apply=scaling,
        params=(
            factor_param(),
            Param(name="low_freq_factor", default=1.0, minimum=0.0, strict=True, filled=True),
            Param(name="high_freq_factor", default=4.0, minimum=0.0, strict=True, filled=True),
        ),
        sets=ROPE,
        scaling_type="llama3",
        eval_defaults=_factor_default,
        hf_rope_type="llama3",
        hf_native=True,
        hf_original_len=True,
    ),
    Method(
        name="rope_base",
        kind="base",
        description="Liu et al. 2023 (scaling laws): change the base",
        paper="arXiv:2310.05209",
        apply=_base_change,
        params=(Param(name="base", rule="required", minimum=0.0, strict=True, required=True),),
        sets=("rope.base",),
        eval_defaults=_rope_base_default,
    ),
    Method(
        name="resonance",
        kind="frequencies",
        description="Wang et al. 2024 (Resonance RoPE): every wavelength 2 pi / theta_i rounded "
        "to an integer; stacks on a frequency schedule",
        paper="arXiv:2403.00071",
        apply=_resonance,
        params=(),
        sets=ROPE,
        original="sheryc/resonance_rope llama_finetuning/scaled_rope/modeling_llama_yarn.py",
    ),
    Method(
        name="p_rope",
        kind="frequencies",
        description="Barbero et al. 2024: rotate only the highest-frequency fraction p of the pairs (the rest NoPE)",
        paper="arXiv:2410.06205",
        apply=_p_rope,
        params=(Param(name="p", default=0.25, minimum=0.0, maximum=1.0, strict=True),),
        sets=ROPE,
        scaling_type="proportional",
        hf_rope_type="proportional",
    ),
)


TRANSFORMERS_ONLY = (
    Method(
        name="dynamic",
        kind="frequencies",
        description="transformers' dynamic NTK (keys cached with the base they were rotated "
        "with); posenc's own is dynamic_ntk",
        paper="https://redd.it/14mrgpr",
        apply=None,
        params=(factor_param(),),
        sets=ROPE,
        scaling_type="dynamic",
        dynamic=True,
        hf_rope_type="dynamic",
        hf_native=True,
    ),
    Method(
        name="longrope",
        kind="frequencies",
        description="Ding et al. 2024: searched per-dimension factors (Phi-3)",
        paper="arXiv:2402.13753",
        apply=dynamic,
        params=(
            Param(name="short_factor", rule="required", required=True),
            Param(name="long_factor", rule="required", required=True),
            Param(name="factor", rule="max_position_embeddings / train_len", minimum=1.0),
            Param(name="attention_factor", rule="sqrt(1 + ln(factor) / ln(L))", minimum=0.0, strict=True),
            STEP,
        ),
        sets=ROPE,
        scaling_type="longrope",
        dynamic=True,
        hf_rope_type="longrope",
        hf_native=True,
        hf_original_len=True,
    ),
)
