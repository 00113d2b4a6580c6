"""Layer 6, analysis: closed-form properties of RoPE schedules (``rope``: long-range decay, YaRN's
rotation counts, the critical dimension) and their plots (``plots``, needs matplotlib)."""

from posenc.analysis.rope import (
    DecayCurve,
    YarnRotations,
    critical_dimension,
    default_inv_freq,
    extrapolation_upper_bound,
    rope_decay_curve,
    sinusoidal_inner_product,
    yarn_ramp,
    yarn_rotations,
)

__all__ = ["DecayCurve", "YarnRotations", "critical_dimension", "default_inv_freq", "extrapolation_upper_bound",
           "rope_decay_curve", "sinusoidal_inner_product", "yarn_ramp", "yarn_rotations"]
