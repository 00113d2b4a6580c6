"""posenc.evals.stats.pooling: seeds are pooled before they are reported."""

from __future__ import annotations

import math

import pytest

from posenc.evals.records import RetrievalRecord
from posenc.evals.report.headline import headline, headline_markdown
from posenc.evals.stats.intervals import ppl_interval, wilson
from posenc.evals.stats.pooling import far_interval, pool_records, pool_retrieval, ratio_interval

L = 64


def ret(method, n, d, acc, scheme="rope", task="recall", n_trials=16, seed=None):
    r = RetrievalRecord(task, scheme, method, L, n, d, acc, n_trials, 1 / 32).to_dict()
    return r if seed is None else {**r, "seed": seed}


def rec(method, n, ppl, scheme="rope", seed=None, status="ok"):
    r = {"scheme": scheme, "method": method, "train_len": L, "eval_len": n, "ppl": ppl, "loss": math.log(ppl),
         "accuracy": 0.4, "tokens": 100, "passkey": None, "status": status, "note": ""}
    return r if seed is None else {**r, "seed": seed}


# ------------------------------------------------------------------------------------------ pooling
def test_seeds_are_pooled():
    records, retrieval = [], []
    for seed, (a, b, acc) in enumerate(((7.0, 7.7, 1.0), (8.0, 8.4, 0.5), (9.0, 9.9, 0.75))):
        records += [rec("yarn", L, a, seed=seed), rec("yarn", 4 * L, b, seed=seed)]
        retrieval += [ret("yarn", 4 * L, 96, acc, seed=seed), ret("yarn", 4 * L, 192, acc, seed=seed),
                      ret("yarn", 4 * L, 8, 1.0, seed=seed)]
    pooled = pool_retrieval(retrieval)
    assert len(pooled) == 3 and all(r["n"] == 48 and r["seeds"] == 3 and "seed" not in r for r in pooled)
    assert pooled[0]["accuracy"] == pytest.approx((16 + 8 + 12) / 48)
    far = far_interval([r for r in retrieval if r["distance"] > L])
    assert far == wilson(72, 96)  # k summed over the far cells and the seeds
    ppl = pool_records(records)
    assert len(ppl) == 2 and ppl[0]["seeds"] == 3
    assert ppl[0]["ppl"] == pytest.approx(math.exp((math.log(7) + math.log(8) + math.log(9)) / 3))
    assert ppl[0]["ppl_interval"]["lo"] < ppl[0]["ppl"] < ppl[0]["ppl_interval"]["hi"]
    ratio = ratio_interval(records, "rope", "yarn", L, 4 * L)
    assert ratio == ppl_interval([math.log(b) - math.log(a) for a, b in ((7, 7.7), (8, 8.4), (9, 9.9))])
    assert ratio.known and ratio.n == 3
    _, _, (row,) = headline(records, retrieval)
    assert row.far == far and row.ratio == ratio and row.seeds == 3
    assert "t interval across 3 seeds" in headline_markdown(records, retrieval)
    assert pool_records(records[:2]) == records[:2]  # one run: unchanged
