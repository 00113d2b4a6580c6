"""Trained-in methods whose part is new with them (CoPE, FoX, FIRE): each record builds its part on ``base_preset``, and
:mod:`posenc.scheme.core` turns it into a trained-in preset. The formulas live with the parts:
:class:`posenc.parts.relative.CoPE`, :class:`posenc.parts.gates.ForgetGate`, :class:`posenc.parts.biases.FireBias`."""

from __future__ import annotations

from dataclasses import replace

from posenc.methods.records import Method, Param
from posenc.scheme.part import Part


def _check_ranges(m: Method, params: dict) -> None:
    """``ValueError`` for a parameter ``m`` does not take or a value outside its documented range."""
    for name, value in params.items():
        p = m.param(name)
        if p is None:
            raise ValueError(f"preset {m.name!r} does not take parameter {name!r}; it takes {sorted(m.param_names)}")
        if not p.contains(value):
            rng = p.range_text()
            allowed = (
                "true or false"
                if rng == "true/false"
                else f"an {rng}"
                if rng.startswith("integer")
                else f"a number {rng}"
                if rng
                else "a finite number"
            )
            raise ValueError(f"{m.name}.{name} must be {allowed}, got {value!r}")


def _trained_part(field: str):
    """``apply`` of a trained-in method: set the scheme's ``field`` part to ``Part(method name, params)``
    (parameters checked against the record; ``from_train_len`` defaults filled in)."""

    def apply(m: Method, scheme, **params):
        _check_ranges(m, params)
        if getattr(scheme, field) is not None:
            raise ValueError(
                f"{scheme.name!r} already has a {field} part ({getattr(scheme, field).kind}); "
                f"method {m.name!r} sets its own"
            )
        if scheme.train_len is not None:
            params = {**m.filled_defaults(scheme.train_len), **params}
        return replace(scheme, **{field: Part(m.name, params)})

    return apply


RECORDS = (
    Method(
        name="cope",
        kind="relative",
        description="Golovneva et al. 2024: contextual positions p_ij = sum of sigmoid(q_i.k_t), "
        "t = j..i, interpolated learned embeddings",
        paper="arXiv:2405.18719",
        apply=_trained_part("relative"),
        params=(Param(name="npos_max", default=64, minimum=2, integer=True),),
        sets=("relative",),
        base_preset="nope",
    ),
    Method(
        name="fox",
        kind="gate",
        description="Lin et al. 2025: Forgetting Transformer, bias_ij = sum of log sigmoid(w.x_t + b), t = j+1..i",
        paper="arXiv:2503.02130",
        apply=_trained_part("gate"),
        params=(Param(name="bias_init", default=5.0),),
        sets=("gate",),
        base_preset="nope",
    ),
    Method(
        name="fire",
        kind="bias",
        description="Li et al. 2023: bias = MLP(psi(i-j) / psi(max(L, i))), psi(x) = log(c x + 1)",
        paper="arXiv:2310.04418",
        apply=_trained_part("bias"),
        params=(
            Param(name="hidden", default=32, minimum=1, integer=True),
            Param(name="c", default=0.1, minimum=0.0, strict=True),
            Param(
                name="threshold",
                rule="train_len (else 512)",
                minimum=1.0,
                filled=True,
                from_train_len=lambda L: float(L),
            ),
        ),
        sets=("bias",),
        base_preset="nope",
    ),
)
