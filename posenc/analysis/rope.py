"""Analysis helpers: closed-form curves of RoPE (decay, rotations per dimension, ...). Pure functions, float64.

- :func:`rope_decay_curve`: RoPE long-range decay (RoFormer, Su et al., arXiv 2104.09864, sec. 3.4.3).
- :func:`sinusoidal_inner_product`: ``p_0 . p_r`` of the Vaswani table (arXiv 1706.03762).
- :func:`yarn_rotations`: rotations per dimension over the training length and YaRN's ramp
  (Peng et al., arXiv 2309.00071, sec. 3.2 "NTK-by-parts").
- :func:`critical_dimension`, :func:`extrapolation_upper_bound`: "Scaling Laws of RoPE-based
  Extrapolation" (Liu et al., arXiv 2310.05209, sec. 3).

Frequency convention everywhere: ``theta_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1`` (RoPE / HF), unless an
explicit ``inv_freq`` is passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._util import check_even_int, check_finite, check_positive_int
from posenc.parts import frequencies

__all__ = [
    "DecayCurve",
    "YarnRotations",
    "critical_dimension",
    "default_inv_freq",
    "extrapolation_upper_bound",
    "rope_decay_curve",
    "sinusoidal_inner_product",
    "yarn_ramp",
    "yarn_rotations",
]


def _check_head_dim(head_dim) -> int:
    return check_even_int("head_dim", head_dim)


def default_inv_freq(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``theta_i = base^(-2i/d)``, i = 0..d/2-1, float64 ``[d/2]`` (RoFormer eq. 15 / HF default)."""
    head_dim = _check_head_dim(head_dim)
    base = check_finite("base", base, minimum=1.0, strict_min=True)
    return frequencies.default_inv_freq(head_dim, base)


def _distances(max_distance) -> torch.Tensor:
    max_distance = check_positive_int("max_distance", max_distance)
    return torch.arange(max_distance + 1, dtype=torch.float64, device="cpu")  # 0..max_distance inclusive


@dataclass(frozen=True)
class DecayCurve:
    """``distance [R]``, ``upper_bound [R]`` (RoFormer's relative bound), ``inner_product [R]``."""

    distance: torch.Tensor
    upper_bound: torch.Tensor
    inner_product: torch.Tensor


def rope_decay_curve(head_dim: int, max_distance: int, base: float = 10000.0,
                     inv_freq: torch.Tensor | None = None, chunk: int = 4096) -> DecayCurve:
    """RoPE long-range decay vs relative distance ``r = 0..max_distance`` (float64).

    ``upper_bound``: RoFormer's relative upper bound (Su et al., arXiv 2104.09864, sec. 3.4.3, fig. 2).
    With ``S_j = sum_{k=0}^{j-1} exp(i r theta_k)`` Abel summation gives
    ``|q^T R_r k| <= max_i |h_{i+1} - h_i| * sum_j |S_j|``, and the plotted curve is
    ``(1 / (d/2)) * sum_{j=1}^{d/2} |S_j|``. At ``r = 0`` it is its maximum ``(d/2 + 1) / 2``.

    ``inner_product``: ``(1 / (d/2)) * sum_i cos(r theta_i)``. This is the RoPE score of the all-ones
    query against the all-ones key at distance ``r`` divided by ``d`` (each pair contributes
    ``2 cos(r theta_i)``), and equally ``E[q . R_r q] / E[|q|^2]`` for a random ``q`` with i.i.d.
    zero-mean coordinates (for independent q, k the expectation is 0). It is 1 at ``r = 0``.

    ``inv_freq`` (e.g. a scaled schedule from ``posenc.rope_frequencies``) replaces the default
    frequencies; then ``d/2 = len(inv_freq)`` and ``head_dim``/``base`` are not used for them.
    """
    if inv_freq is None:
        theta = default_inv_freq(head_dim, base)
    else:
        # on the host with the distances, in float64, wherever the schedule came from (a model on a GPU)
        theta = torch.as_tensor(inv_freq).detach().to(device="cpu", dtype=torch.float64).flatten()
        if theta.numel() == 0 or not torch.isfinite(theta).all():
            raise ValueError("inv_freq must be a non-empty tensor of finite values")
    chunk = check_positive_int("chunk", chunk)
    r = _distances(max_distance)
    bounds, inners = [], []
    for start in range(0, r.numel(), chunk):  # [chunk, d/2] at a time keeps memory bounded
        angle = r[start:start + chunk, None] * theta[None, :]  # [c, d/2]
        partial_cos = torch.cumsum(torch.cos(angle), dim=-1)  # Re S_j, j = 1..d/2
        partial_sin = torch.cumsum(torch.sin(angle), dim=-1)  # Im S_j
        bounds.append(torch.hypot(partial_cos, partial_sin).mean(dim=-1))
        inners.append(partial_cos[:, -1] / theta.numel())
    return DecayCurve(r, torch.cat(bounds), torch.cat(inners))


def sinusoidal_inner_product(dim: int, max_distance: int, base: float = 10000.0) -> torch.Tensor:
    """``p_0 . p_r = sum_{i=0}^{dim/2-1} cos(r / base^(2i/dim))`` for ``r = 0..max_distance`` (float64).

    Vaswani et al. (arXiv 1706.03762) table ``p_r = [sin(r w_i), cos(r w_i)]``; ``sin a sin b + cos a cos b
    = cos(a - b)``, so it depends only on ``r`` and equals ``dim/2`` at ``r = 0`` (the "long-range decay"
    picture).
    """
    dim = check_positive_int("dim", dim, minimum=2)
    if dim % 2:
        raise ValueError(f"dim must be even (sin/cos pairs), got {dim}")
    w = default_inv_freq(dim, base)  # [dim/2]
    r = _distances(max_distance)
    return torch.cat([torch.cos(r[i:i + 4096, None] * w).sum(-1) for i in range(0, r.numel(), 4096)])


def yarn_ramp(rotations: torch.Tensor, beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """YaRN's ramp ``gamma(r)`` (Peng et al., arXiv 2309.00071, eq. 18, alpha = beta_slow, beta = beta_fast)::

        gamma(r) = 0                                   if r < beta_slow   (interpolate: theta / s)
                 = 1                                   if r > beta_fast   (keep theta)
                 = (r - beta_slow) / (beta_fast - beta_slow) otherwise

    and YaRN sets ``theta_new = (1 - gamma) theta / s + gamma theta``. (The reference code and HF ramp
    linearly in the *dimension index* between the rounded correction dims instead of linearly in
    ``r``; see ``YarnRotations.gamma_hf``.)
    """
    beta_slow = check_finite("beta_slow", beta_slow, minimum=0.0, strict_min=True)
    beta_fast = check_finite("beta_fast", beta_fast, minimum=beta_slow, strict_min=True)
    r = torch.as_tensor(rotations, dtype=torch.float64)
    return ((r - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)


@dataclass(frozen=True)
class YarnRotations:
    """Per dimension pair ``i``: ``inv_freq``, ``rotations`` r_i, paper ``gamma`` and HF/reference ``gamma_hf``
    (1 = keep the frequency, 0 = interpolate), plus the correction range ``low``/``high`` (pair index)."""

    index: torch.Tensor
    inv_freq: torch.Tensor
    rotations: torch.Tensor
    gamma: torch.Tensor
    gamma_hf: torch.Tensor
    low: float
    high: float


def yarn_rotations(head_dim: int, base: float = 10000.0, train_len: int = 4096,
                   beta_fast: float = 32.0, beta_slow: float = 1.0) -> YarnRotations:
    """Rotations per dimension over the training length (YaRN, arXiv 2309.00071, sec. 3.2)::

        r_i = L_train / lambda_i = L_train * theta_i / (2 pi),   lambda_i = 2 pi / theta_i (wavelength)

    (the paper's ratio is ``L / lambda``.) Dimensions
    with ``r_i > beta_fast`` have turned many times during training and are kept; ``r_i < beta_slow``
    are interpolated. ``gamma`` is the paper's ramp (:func:`yarn_ramp`). ``gamma_hf`` is what HF /
    the YaRN repo compute: ``low = floor(d_c(beta_fast))``, ``high = ceil(d_c(beta_slow))`` with
    ``d_c(n) = d * ln(L / (2 pi n)) / (2 ln base)``, clipped to ``[0, d-1]``, and
    ``gamma_hf = 1 - clamp((i - low) / (high - low), 0, 1)``.
    """
    head_dim = _check_head_dim(head_dim)
    train_len = check_positive_int("train_len", train_len)
    theta = default_inv_freq(head_dim, base)
    rotations = train_len * theta / (2 * math.pi)
    gamma = yarn_ramp(rotations, beta_fast, beta_slow)
    low, high = frequencies.yarn_correction_range(head_dim, base, train_len, beta_fast, beta_slow)
    index = torch.arange(head_dim // 2, dtype=torch.float64)
    gamma_hf = 1.0 - ((index - low) / (high - low)).clamp(0.0, 1.0)
    return YarnRotations(index, theta, rotations, gamma, gamma_hf, float(low), float(high))


def critical_dimension(head_dim: int, base: float = 10000.0, train_len: int = 4096) -> int:
    """Critical dimension (Liu et al., "Scaling Laws of RoPE-based Extrapolation", arXiv 2310.05209)::

        d_extra = 2 * ceil((d/2) * log_base(L_train / (2 pi)))

    The pairs ``i < d_extra/2`` have period ``2 pi / theta_i <= L_train``: they saw a whole turn during
    training. LLaMA2 (d=128, base=10000, L=4096): 64 * 0.70355 = 45.03 -> 46 pairs -> 92, as in the
    paper. Clipped to ``[0, head_dim]`` (a training length shorter than 2 pi, or longer than every
    period).
    """
    head_dim = _check_head_dim(head_dim)
    base = check_finite("base", base, minimum=1.0, strict_min=True)
    train_len = check_positive_int("train_len", train_len)
    pairs = math.ceil(head_dim / 2 * math.log(train_len / (2 * math.pi)) / math.log(base))
    return 2 * min(max(pairs, 0), head_dim // 2)


def extrapolation_upper_bound(head_dim: int, base: float = 10000.0, train_len: int = 4096) -> float:
    """Extrapolation upper bound ``T_extra = 2 pi * base^(d_extra / d)`` (arXiv 2310.05209, eq. for
    T_extra): the period of the first dimension past the critical one, beyond which its unseen angles
    make attention OOD. LLaMA2 (d=128, base=10000, L=4096): ``2 pi * 10000^(92/128) = 4711.9``.
    """
    d_extra = critical_dimension(head_dim, base, train_len)
    return 2 * math.pi * float(base) ** (d_extra / head_dim)
