"""Pooling repeated runs (seeds) of the lab's records before they are reported.

A bench run with several seeds writes one perplexity record per (scheme, method, eval length, seed) and one
retrieval record per (task, scheme, method, eval length, distance, seed); the ``seed`` key is an int, and
records without one count as one run. The reports show one value per cell, pooled here:

- retrieval: the trials of every seed are pooled, ``k = sum round(accuracy * n)`` correct out of ``sum n``
  (:func:`pool_retrieval`), so a cell's Wilson interval (:func:`posenc.evals.stats.intervals.wilson`) covers all seeds;
- perplexity: the seeds are independent repeats; a cell's perplexity is ``exp`` of the mean loss over seeds
  (:func:`pool_records`) and its interval Student's t across seeds (:func:`posenc.evals.stats.intervals.ppl_interval`);
- a perplexity *ratio* PPL(N)/PPL(L) is formed per seed (same trained model at both lengths) and the seeds'
  log-ratios get the t interval (:func:`ratio_interval`): no interval from one seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from posenc.evals.stats.intervals import Interval, ppl_interval, wilson
from posenc.methods import is_identity

__all__ = ["far_interval", "method_key", "pool_records", "pool_retrieval", "ratio_interval", "seed_of", "successes"]


def method_key(method) -> str:
    """``"none"`` for the model as trained (None, "", "none", "default"), else the method spec."""
    return "none" if is_identity(method) else str(method)


def seed_of(rec: dict):
    """The record's ``seed`` (None when it has none: one run)."""
    return rec.get("seed")


def successes(rec: dict) -> int:
    """Correct trials of a retrieval record: ``round(accuracy * n)``."""
    return int(round(float(rec["accuracy"]) * int(rec["n"])))


def _loss(rec: dict) -> float | None:
    """The record's mean loss (nats), from ``loss`` or ``log(ppl)``; None for a failed cell."""
    if rec.get("status", "ok") != "ok":
        return None
    loss = rec.get("loss")
    if isinstance(loss, (int, float)) and math.isfinite(loss):
        return float(loss)
    ppl = rec.get("ppl")
    if isinstance(ppl, (int, float)) and math.isfinite(ppl) and ppl > 0:
        return math.log(ppl)
    return None


def pool_records(records: Sequence[dict]) -> list[dict]:
    """One perplexity record per (scheme, method, eval length), in first-seen order. A cell measured once is
    returned as it is; for several seeds ``ppl`` is ``exp(mean loss)``, ``loss`` the mean loss, ``accuracy`` the
    mean, ``seeds`` the number of seeds that succeeded and ``ppl_interval`` the t interval across them."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r.get("scheme"), method_key(r.get("method")), int(r["eval_len"])), []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        ok = [r for r in group if _loss(r) is not None]
        if not ok:
            out.append(group[0])
            continue
        losses = [_loss(r) for r in ok]
        iv = ppl_interval(losses, over="seeds")
        accs = [float(r["accuracy"]) for r in ok if isinstance(r.get("accuracy"), (int, float))]
        pooled = {k: v for k, v in ok[0].items() if k != "seed"}
        pooled.update(ppl=iv.value, loss=sum(losses) / len(losses), seeds=len(ok), ppl_interval=iv.to_dict(),
                      accuracy=sum(accs) / len(accs) if accs else None)
        out.append(pooled)
    return out


def pool_retrieval(retrieval: Sequence[dict]) -> list[dict]:
    """One retrieval record per (task, scheme, method, eval length, distance), in first-seen order: the trials of
    every seed pooled (``n`` summed, ``accuracy = sum k / sum n``, ``seeds`` their number)."""
    groups: dict[tuple, list[dict]] = {}
    for r in retrieval:
        key = (r.get("task"), r.get("scheme"), method_key(r.get("method")), int(r["eval_len"]), int(r["distance"]))
        groups.setdefault(key, []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        k, n = sum(successes(r) for r in group), sum(int(r["n"]) for r in group)
        pooled = {key: v for key, v in group[0].items() if key != "seed"}
        pooled.update(accuracy=k / n if n else 0.0, n=n, seeds=len(group))
        out.append(pooled)
    return out


def far_interval(cells: Sequence[dict]) -> Interval:
    """Wilson interval of the pooled accuracy of ``cells`` (retrieval records): ``sum k`` of ``sum n``."""
    return wilson(sum(successes(r) for r in cells), sum(int(r["n"]) for r in cells))


def ratio_interval(records: Sequence[dict], scheme: str, method, short: int, long: int) -> Interval | None:
    """PPL(long)/PPL(short) of one row: per seed ``exp(loss(long) - loss(short))``, then the geometric mean over
    seeds with its t interval (NaN ends from one seed). None when no seed has both cells."""
    want = method_key(method)
    by_seed: dict = {}
    for r in records:
        if r.get("scheme") == scheme and method_key(r.get("method")) == want:
            by_seed.setdefault(seed_of(r), {})[int(r["eval_len"])] = r
    logs = []
    for cells in by_seed.values():
        a, b = cells.get(short), cells.get(long)
        la, lb = (_loss(a) if a else None), (_loss(b) if b else None)
        if la is not None and lb is not None:
            logs.append(lb - la)
    return ppl_interval(logs, over="seeds") if logs else None
