"""Query scales: log-n scaling and Llama 4's temperature tuning (:func:`posenc.parts.remap.logn_scale`,
:data:`posenc.parts.remap.TEMPERATURES`)."""

from __future__ import annotations

from dataclasses import replace

from posenc._util import check_finite
from posenc.methods.common import need_train_len
from posenc.methods.records import Method, Param
from posenc.scheme.part import Part


def _logn(m: Method, scheme):
    need_train_len(scheme, m.name)
    return replace(scheme, logn=True)


def _temperature_tuning(m: Method, scheme, attn_scale=None, floor_scale=None):
    L = need_train_len(scheme, m.name)
    if scheme.temperature is not None:
        raise ValueError(
            f"{scheme.name!r} already has a query temperature ({scheme.temperature.kind}); temperatures do not stack"
        )
    params = {
        **m.filled_defaults(L),
        **{k: v for k, v in (("attn_scale", attn_scale), ("floor_scale", floor_scale)) if v is not None},
    }
    for k, v in params.items():
        p = m.param(k)
        check_finite(f"{m.name}.{k}", v, minimum=p.minimum, strict_min=p.strict)
    return replace(scheme, temperature=Part("llama4", params))


RECORDS = (
    Method(
        name="logn",
        kind="scale",
        description="Su: q scaled by max(1, log_L n)",
        paper="https://kexue.fm/archives/8823",
        apply=_logn,
        params=(),
        sets=("logn",),
    ),
    Method(
        name="temperature_tuning",
        kind="scale",
        description="Llama 4: q x (1 + attn_scale log(floor((p+1)/floor_scale) + 1))",
        paper="arXiv:2501.19399",
        apply=_temperature_tuning,
        params=(
            Param(name="attn_scale", default=0.1, minimum=0.0, filled=True),
            Param(
                name="floor_scale",
                rule="train_len",
                minimum=0.0,
                strict=True,
                filled=True,
                from_train_len=lambda L: float(L),
            ),
        ),
        sets=("temperature",),
    ),
)
