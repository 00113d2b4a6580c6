"""95% intervals for the lab's measurements, and the one rule for calling a difference real.

- accuracy over ``n`` independent trials (a retrieval cell): the Wilson score interval (Wilson 1927, JASA 22;
  recommended over the normal "Wald" interval for small ``n`` and rates near 0 or 1 by Brown, Cai and DasGupta
  2001, Statistical Science 16(2)): with ``p = k / n`` and ``z`` the normal quantile,
  ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``;
- a mean over a few independent repeats (seeds, evaluation windows): Student's t interval
  ``mean +- t_{1-a/2, n-1} s / sqrt(n)`` (``s`` the sample standard deviation);
- perplexity: the interval of the mean *loss* (log-perplexity), exponentiated, so the centre is the geometric
  mean of the perplexities and the interval is never negative (:func:`ppl_interval`);
- the difference of two accuracies measured on the *same* trials (two methods answering the same queries):
  Newcombe's square-and-add interval for paired proportions (:func:`paired_difference`).

:func:`separated` is the rule the reports use: two estimates differ only when their intervals do not overlap.
Everything here is plain Python (``math``, ``statistics``): no SciPy at run time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Interval", "mean_interval", "paired_difference", "ppl_interval", "separated", "t_quantile", "wilson",
           "z_quantile"]

CONF = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided interval ``[lo, hi]`` at ``conf`` from ``n`` observations (trials,
    seeds or windows, as ``over`` says). ``lo``/``hi`` are NaN where no interval exists (one repeat)."""

    value: float
    lo: float
    hi: float
    n: int
    conf: float = CONF
    over: str = ""

    @property
    def known(self) -> bool:
        """True when the interval exists (both ends finite)."""
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def to_dict(self) -> dict:
        """``{"value", "lo", "hi", "n", "over"}`` (NaN ends as None, for JSON)."""
        clean = [None if not math.isfinite(x) else x for x in (self.value, self.lo, self.hi)]
        return {"value": clean[0], "lo": clean[1], "hi": clean[2], "n": self.n, "over": self.over}


def _check_conf(conf: float) -> float:
    if not isinstance(conf, (int, float)) or not 0.0 < conf < 1.0:
        raise ValueError(f"conf must be in (0, 1), got {conf!r}")
    return float(conf)


def z_quantile(p: float) -> float:
    """The standard normal quantile ``Phi^-1(p)`` (``statistics.NormalDist``), ``p`` in (0, 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    return statistics.NormalDist().inv_cdf(p)


def _t_cdf(t: float, df: int) -> float:
    """Student's t CDF for an integer ``df`` >= 1, in closed form (Abramowitz and Stegun 26.7.3 / 26.7.4):
    with ``theta = atan(t / sqrt(df))``, ``A(t|df)`` = P(|T| <= t) is a finite trigonometric series."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd: A = (2/pi)(theta + sin cos (1 + 2/3 cos^2 + ... ))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 3) // 2 + 1):
            term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        a = 2.0 / math.pi * (theta + (s * c * total if df > 1 else 0.0))
    else:  # even: A = sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
        term, total = 1.0, 1.0
        for k in range(1, (df - 2) // 2 + 1):
            term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return 0.5 + 0.5 * a  # a is odd in t, so this holds for negative t too


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile ``F^-1(p)`` for ``df`` >= 1 degrees of freedom (bisection on :func:`_t_cdf` to
    1e-12; df > 1000 uses the normal quantile, within 1e-3 there)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    if df > 1000:
        return z_quantile(p)
    lo, hi = -1.0, 1.0
    while _t_cdf(lo, df) > p:
        lo *= 2
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def wilson(k: int, n: int, conf: float = CONF) -> Interval:
    """Wilson score interval of a rate ``k / n`` (module docstring); ``n`` = 0 gives NaN everywhere."""
    conf = _check_conf(conf)
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if k > n:
        raise ValueError(f"k must be in [0, n = {n}], got {k}")
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, conf, "trials")
    z = z_quantile(0.5 + conf / 2)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # lo <= p <= hi holds exactly; rounding can put an end a hair past p (k = 0, n = 10: lo = 2.8e-17)
    return Interval(p, min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)), n, conf, "trials")


def mean_interval(xs: Sequence[float], conf: float = CONF, over: str = "seeds") -> Interval:
    """Student's t interval of the mean of ``xs`` (independent repeats); one value gives NaN ends."""
    conf = _check_conf(conf)
    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError("xs must hold at least one value")
    m = statistics.fmean(xs)
    if len(xs) == 1:
        return Interval(m, math.nan, math.nan, 1, conf, over)
    half = t_quantile(0.5 + conf / 2, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return Interval(m, m - half, m + half, len(xs), conf, over)


def ppl_interval(losses: Sequence[float], conf: float = CONF, over: str = "seeds") -> Interval:
    """Perplexity from mean losses (nats) of independent repeats: ``exp`` of :func:`mean_interval` of the
    losses (the geometric mean of the perplexities, and an interval that stays positive)."""
    i = mean_interval(losses, conf, over)
    return Interval(math.exp(i.value), math.exp(i.lo) if i.known else math.nan,
                    math.exp(i.hi) if i.known else math.nan, i.n, conf, over)


def paired_difference(a: Sequence[bool], b: Sequence[bool], conf: float = CONF) -> Interval:
    """Interval of ``p_a - p_b``, the difference of two accuracies over the same ``n`` trials (``a[i]`` and
    ``b[i]`` are the two outcomes of trial ``i``): Newcombe's method 10 (Newcombe 1998, Statistics in Medicine
    17:2635-2650), the square-and-add of the two Wilson intervals with the paired correlation.

    With the 2x2 counts ``e`` (both right), ``f`` (a only), ``g`` (b only), ``h`` (neither), ``p_a = (e + f) / n``,
    ``p_b = (e + g) / n``, their Wilson intervals ``[l_a, u_a]``, ``[l_b, u_b]``, and the continuity-corrected
    correlation ``phi = C / sqrt((e + f)(g + h)(e + g)(f + h))`` where ``C = eh - fg - n/2`` if ``eh - fg > n/2``,
    ``eh - fg`` if it is negative, else 0 (``phi = 0`` when a margin is empty):

        lo = (p_a - p_b) - sqrt((p_a - l_a)^2 - 2 phi (p_a - l_a)(u_b - p_b) + (u_b - p_b)^2)
        hi = (p_a - p_b) + sqrt((u_a - p_a)^2 - 2 phi (u_a - p_a)(p_b - l_b) + (p_b - l_b)^2)

    Pairing matters: two methods that fail on the same hard needles differ less than two independent samples
    would suggest, and the interval narrows accordingly (``phi > 0``). ``n`` = 0 gives NaN everywhere."""
    conf = _check_conf(conf)
    a, b = [bool(x) for x in a], [bool(x) for x in b]
    if len(a) != len(b):
        raise ValueError(f"a and b must hold the outcomes of the same trials, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, conf, "paired trials")
    e = sum(x and y for x, y in zip(a, b))
    f = sum(x and not y for x, y in zip(a, b))
    g = sum(y and not x for x, y in zip(a, b))
    h = n - e - f - g
    ia, ib = wilson(e + f, n, conf), wilson(e + g, n, conf)
    margins = (e + f) * (g + h) * (e + g) * (f + h)
    cross = e * h - f * g
    c = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = c / math.sqrt(margins) if margins else 0.0
    pa, pb = ia.value, ib.value
    lo_sq = (pa - ia.lo) ** 2 - 2 * phi * (pa - ia.lo) * (ib.hi - pb) + (ib.hi - pb) ** 2
    hi_sq = (ia.hi - pa) ** 2 - 2 * phi * (ia.hi - pa) * (pb - ib.lo) + (pb - ib.lo) ** 2
    d = pa - pb
    return Interval(d, max(-1.0, d - math.sqrt(max(lo_sq, 0.0))), min(1.0, d + math.sqrt(max(hi_sq, 0.0))), n, conf,
                    "paired trials")


def separated(a: Interval, b: Interval) -> bool:
    """True when both intervals exist and do not overlap: the only case a report calls ``a`` and ``b``
    different."""
    return a.known and b.known and (a.hi < b.lo or b.hi < a.lo)
