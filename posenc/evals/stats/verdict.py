"""The one verdict rule of the lab's reports: does a method extend the context, only look locally, or fail?

A row (a trained scheme, or a method applied to one) is judged at a length ``N`` past its trained length ``L`` on
two measurements, both needed:

- perplexity kept: ``PPL(N) / PPL(L) <= PPL_KEEP``;
- far needles retrieved: accuracy on needles farther back than ``L`` (pooled trials) ``>= FAR_OK``.

``extends`` = both; ``local only`` = perplexity kept, far needles lost (a window or sink method: StreamingLLM's own
README says it does not extend the context, arXiv:2309.17453); ``fails`` = perplexity not kept (whatever the
retrieval). A verdict is *firm* only when the intervals clear the thresholds
(:func:`posenc.evals.stats.intervals.separated` against the threshold); otherwise it is reported as borderline.
"""

from __future__ import annotations

import math

from posenc.evals.stats.intervals import Interval, separated

__all__ = ["EXTENDS", "FAILS", "FAR_OK", "LOCAL", "PPL_KEEP", "VERDICTS", "borderline", "classify", "thresholds_text"]

PPL_KEEP = 1.5  # perplexity kept: PPL(N) / PPL(L) at most this (the bench's "an extension holds" bar)
FAR_OK = 0.5  # far needles retrieved: accuracy on needles beyond L at least this
EXTENDS, LOCAL, FAILS = "extends", "local only", "fails"
VERDICTS = (EXTENDS, LOCAL, FAILS)


def _num(x) -> float | None:
    if isinstance(x, Interval):
        x = x.value
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def classify(ratio, far) -> str | None:
    """``extends`` / ``local only`` / ``fails`` from the perplexity ratio and the far-needle accuracy (numbers or
    :class:`~posenc.evals.stats.intervals.Interval`); None when the ratio is missing, or the ratio is kept and far is
    missing."""
    ratio, far = _num(ratio), _num(far)
    if ratio is None:
        return None
    if ratio > PPL_KEEP:
        return FAILS
    if far is None:
        return None
    return EXTENDS if far >= FAR_OK else LOCAL


def _point(x: float) -> Interval:
    return Interval(x, x, x, 1)


def borderline(ratio: Interval | None, far: Interval | None) -> list[str]:
    """Why a verdict is not firm: the measurements whose interval overlaps its threshold (empty: firm, or no
    interval to judge by). The far-needle accuracy only counts when the perplexity is kept."""
    out = []
    if ratio is not None and ratio.known and not separated(ratio, _point(PPL_KEEP)):
        out.append(f"PPL ratio interval [{ratio.lo:.2f}, {ratio.hi:.2f}] spans {PPL_KEEP:g}")
    kept = ratio is not None and _num(ratio) is not None and ratio.value <= PPL_KEEP
    if kept and far is not None and far.known and not separated(far, _point(FAR_OK)):
        out.append(f"far-needle interval [{far.lo:.2f}, {far.hi:.2f}] spans {FAR_OK:g}")
    return out


def thresholds_text() -> str:
    """The thresholds, as the reports print them."""
    return (f"keeps perplexity: PPL(N)/PPL(L) <= {PPL_KEEP:g}; retrieves far needles: accuracy on needles farther "
            f"back than L >= {FAR_OK:g}. extends = both; local only = perplexity kept, far needles lost; fails = "
            f"perplexity not kept.")
