"""posenc.evals.stats.verdict: the one verdict rule's thresholds (inclusive), its borderline cases, and the
headline that states them."""

from __future__ import annotations

import math

from posenc.evals.records import RetrievalRecord
from posenc.evals.report.headline import headline_markdown
from posenc.evals.stats.intervals import Interval, wilson
from posenc.evals.stats.verdict import EXTENDS, FAILS, FAR_OK, LOCAL, PPL_KEEP, borderline, classify

L = 64


def ret(method, n, d, acc, scheme="rope", task="recall", n_trials=16, seed=None):
    r = RetrievalRecord(task, scheme, method, L, n, d, acc, n_trials, 1 / 32).to_dict()
    return r if seed is None else {**r, "seed": seed}


def rec(method, n, ppl, scheme="rope", seed=None, status="ok"):
    r = {"scheme": scheme, "method": method, "train_len": L, "eval_len": n, "ppl": ppl, "loss": math.log(ppl),
         "accuracy": 0.4, "tokens": 100, "passkey": None, "status": status, "note": ""}
    return r if seed is None else {**r, "seed": seed}


def paper_run(task="recall"):
    """The committed quick run's shape: plain RoPE copies far needles (0.91) at a 2.6x perplexity ratio; YaRN keeps
    both; a sliding window keeps perplexity and loses far needles."""
    records, retrieval = [], []
    for m, p4, far in (("none", 20.0, 0.9375), ("yarn", 8.84, 1.0), ("sliding_window", 7.17, 0.0)):
        records += [rec(m, L, 7.69), rec(m, 4 * L, p4)]
        for n in (L, 4 * L):
            for d in (8, 32, 96, 192):
                if d < n:
                    retrieval.append(ret(m, n, d, far if d > L else 1.0, task=task))
    return records, retrieval


# ------------------------------------------------------------------------------------------ verdicts
def test_verdict_thresholds():
    assert (PPL_KEEP, FAR_OK) == (1.5, 0.5)
    assert classify(PPL_KEEP, FAR_OK) == EXTENDS  # both thresholds are inclusive
    assert classify(PPL_KEEP + 1e-6, 1.0) == FAILS  # perplexity not kept: fails whatever the retrieval
    assert classify(1.0, FAR_OK - 1e-6) == LOCAL
    assert classify(None, 1.0) is None and classify(1.0, None) is None and classify(3.0, None) == FAILS
    one_seed = Interval(1.0, math.nan, math.nan, 1)
    assert borderline(one_seed, wilson(16, 16)) == []
    assert len(borderline(one_seed, wilson(8, 16))) == 1  # [0.28, 0.72] spans 0.5: not a firm verdict
    assert "spans 1.5" in borderline(Interval(1.4, 1.2, 1.6, 3), wilson(16, 16))[0]
    md = headline_markdown(*paper_run())
    assert f"PPL(N)/PPL(L) <= {PPL_KEEP:g}" in md and f">= {FAR_OK:g}" in md
