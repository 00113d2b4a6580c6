"""The suite's verdict rule, written once: does a method let a model trained at ``L`` read ``n`` tokens?

A row (a method at its per-length parameters) is judged at each length ``n`` on two measurements, each with its
interval, against the untouched model at its trained length ``L`` (the *reference*):

- **retrieval** (keys found, Wilson 95% interval ``[lo_n, hi_n]``) against the reference's interval
  ``[lo_ref, hi_ref]``: *kept* when ``lo_n >= lo_ref`` (the row's whole interval lies at or above the reference's
  lower end), *lost* when ``hi_n < lo_ref`` (the row's interval lies wholly below the reference's), *undecided*
  when the row's interval spans ``lo_ref``;
- **perplexity**: the geometric mean over the target passages of the row's perplexity over the untouched model's at
  ``L`` on the same passage (a paired ratio; Student's t 95% interval over passages, which are independent
  texts, not neighbouring blocks of one), against the stated bound ``B`` (``SuitePreset.ppl_bound``, 1.25):
  *kept* when the interval's upper end is below ``B``, *lost* when its lower end is above ``B``, *undecided*
  when it spans ``B`` (or there is one passage). A preset without passages judges on retrieval alone.

At a length the row **extends** when both are kept; it **keeps perplexity only** when retrieval is lost and
perplexity kept; it is **neither** when perplexity is lost; and **undecided** otherwise (an interval spans its
threshold and nothing is lost, or retrieval is undecided with perplexity kept). The verdict of a method is
``extends to N`` for the longest ``N`` past ``L`` such that it extends at every length from ``L`` up to ``N``;
otherwise the verdict at its first length past ``L``. The **effective length** of a row (the untouched model's
included) follows the same rule from its shortest length: the longest length up to which it extends at every
length (None: not even at the shortest).

How this differs from RULER (Hsieh et al. 2024, arXiv 2404.06654): RULER calls a length effective when the mean
score there is at or above a fixed 85.6% (Llama-2-7B's score at 4k), a point estimate against a threshold taken
from another model. Here the threshold is this model's own retrieval at its trained length, the decision uses the
intervals of both (so a row with few keys is undecided rather than passed or failed on one key), and a row that
keeps the keys but loses the text's perplexity does not extend.
"""

from __future__ import annotations

import math

__all__ = ["EXTENDS", "KEEPS_PPL", "KEPT", "LOST", "NEITHER", "UNDECIDED", "at_length", "judge", "ppl_status",
           "retrieval_status", "rule_text"]

KEPT, LOST, UNDECIDED = "kept", "lost", "undecided"
EXTENDS, KEEPS_PPL, NEITHER = "extends", "keeps perplexity only", "neither"


def retrieval_status(row: dict, reference: dict) -> str:
    """``kept``/``lost``/``undecided`` of a row's retrieval interval (``{"lo", "hi", "n"}``) against the reference's
    (module docstring); ``undecided`` when either has no trials."""
    if not row.get("n") or not reference.get("n"):
        return UNDECIDED
    if row["lo"] >= reference["lo"]:
        return KEPT
    if row["hi"] < reference["lo"]:
        return LOST
    return UNDECIDED


def ppl_status(ratio: dict | None, bound: float) -> str | None:
    """``kept``/``lost``/``undecided`` of a paired perplexity ratio interval (``{"value", "lo", "hi", "n"}``)
    against ``bound``; None when there is no ratio (no passages)."""
    if ratio is None or not ratio.get("n"):
        return None
    lo, hi = ratio.get("lo"), ratio.get("hi")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNDECIDED
    if hi < bound:
        return KEPT
    if lo > bound:
        return LOST
    return UNDECIDED


def at_length(retrieval: str, ppl: str | None) -> str:
    """The verdict at one length from the two statuses (module docstring)."""
    if ppl == LOST:
        return NEITHER
    if ppl in (KEPT, None):
        return {KEPT: EXTENDS, LOST: KEEPS_PPL}.get(retrieval, UNDECIDED)
    return UNDECIDED  # perplexity undecided: nothing else lost, nothing firm


def judge(rows: dict[int, dict], reference: dict, train_len: int, bound: float) -> dict:
    """The verdict and effective length of one method from ``rows`` = ``{length: {"retrieval": interval,
    "ppl_ratio": interval | None}}``: ``{"verdict", "extends_to", "effective_length", "undecided_at",
    "per_length": {length: {"retrieval", "ppl", "verdict"}}}`` (``verdict``: ``extends to N`` /
    ``keeps perplexity only`` / ``neither`` / ``undecided`` / ``not run past L``)."""
    per = {}
    for n in sorted(rows):
        r = retrieval_status(rows[n]["retrieval"], reference)
        p = ppl_status(rows[n].get("ppl_ratio"), bound)
        per[n] = {"retrieval": r, "ppl": p, "verdict": at_length(r, p)}

    def run_from(lengths):
        best = None
        for n in lengths:
            if per[n]["verdict"] != EXTENDS:
                return best, n
            best = n
        return best, None

    effective, _ = run_from(sorted(per))
    past = sorted(n for n in per if n > train_len)
    if not past:
        return {"verdict": "not run past L", "extends_to": None, "effective_length": effective,
                "undecided_at": None, "per_length": per}
    extends_to, stop = run_from(past)
    if extends_to is not None:
        verdict = f"{EXTENDS} to {extends_to}"
    else:
        verdict = per[past[0]]["verdict"]
    undecided = stop if stop is not None and per[stop]["verdict"] == UNDECIDED else None
    return {"verdict": verdict, "extends_to": extends_to, "effective_length": effective, "undecided_at": undecided,
            "per_length": per}


def rule_text(bound: float) -> str:
    """The rule in one paragraph, for the report and the README."""
    return (f"Verdict rule: at a length n a method extends when its keys' Wilson 95% interval lies at or above the "
            f"lower end of the untouched model's interval at its trained length L (lost when wholly below it) and "
            f"the geometric mean of its perplexity over the untouched model's at L on the same passages has a 95% "
            f"interval below {bound:g} (lost when wholly above); an interval spanning its threshold is undecided. "
            f"'Extends to N': it extends at every length from L to N; effective length: the same from the "
            f"shortest length. RULER (arXiv 2404.06654) instead compares the mean score at n with a fixed 85.6%, "
            f"with no interval and no perplexity.")
