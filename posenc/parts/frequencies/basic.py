"""RoPE's default ladder and its one-number changes: ``default``, ``linear`` (Position Interpolation) and
``base`` (a new base)."""

from __future__ import annotations

from posenc.parts.frequencies.registry import RopeFrequencies, register, unscaled
from posenc.parts.frequencies.shared import default_inv_freq, plain, stated_factor


@register("default", factor=unscaled)
def _default(head_dim, dim, base, params, seq_len):
    """Original RoPE: ``theta_i = base ** (-2i/d)`` (RoFormer, arXiv 2104.09864). Equals HF's default."""
    return plain(dim, base)


def _linear_factor(params, seq_len):
    """``factor`` (required)."""
    return stated_factor(params, "linear")


@register("linear", ("factor",), factor=_linear_factor)
def _linear(head_dim, dim, base, params, seq_len):
    """Position Interpolation: ``theta_i = base ** (-2i/d) / factor`` (arXiv 2306.15595). Equals HF linear.

    ``factor = L_test / L_train >= 1`` divides the frequencies: the same angles as multiplying positions by
    ``1 / factor``. To map a test length into a range shorter than the trained one (trained 4k but well
    covered only to 3k, test 8k), pass ``factor = 8k / 3k`` rather than ``8k / 4k``.
    """
    return RopeFrequencies(default_inv_freq(dim, base) / stated_factor(params, "linear"), 1.0)


@register("base", ("base",), factor=unscaled)
def _base_change(head_dim, dim, base, params, seq_len):
    """Base change: ``theta_i = base' ** (-2i/d)`` with ``base'`` from key ``base`` or ``rope_theta``.

    Scaling Laws of RoPE-based Extrapolation, arXiv 2310.05209: both larger bases (Code Llama 1e6,
    Llama 2 Long 5e5) and smaller ones (e.g. 500) extrapolate after tuning at the original length.
    Refuses ``base`` and ``rope_theta`` that disagree, and neither given.
    """
    if "base" in params and "rope_theta" in params and params["base"] != params["rope_theta"]:
        raise ValueError(f"scaling['base'] ({params['base']}) and scaling['rope_theta'] "
                         f"({params['rope_theta']}) disagree; give one")
    if "base" not in params and "rope_theta" not in params:
        raise ValueError("rope_type 'base' needs the new base in scaling['base'] or scaling['rope_theta'] "
                         "(a finite number > 0)")
    return plain(dim, params.get("base", base))
