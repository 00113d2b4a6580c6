"""The committed results (benchmarks/results/) are the runs they claim: the default bench preset's results are
committed, each bench preset's results are that preset's run within its budget, and the committed 16k and 32k
tunes are what the suite rows run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posenc.evals.lab import bench
from posenc.evals.lab.probes import CONTENT_COPY, probe_cells, probe_tasks
from posenc.evals.records import RetrievalRecord
from posenc.evals.tune.factors import is_monotone
from tests.evals.lab.test_bench import expected_rows

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_the_default_presets_results_are_committed():
    """`make bench` runs quick: its results are what docs/results/quick.md quotes (other presets' folders, when present,
    are checked below; older runs live under results/archive/ with the commit that made them)."""
    assert (RESULTS / "bench-quick" / "results.json").exists()


@pytest.mark.parametrize("name", sorted(p.name.removeprefix("bench-") for p in RESULTS.glob("bench-*")
                                        if (p / "results.json").exists()))
def test_committed_results_are_this_presets_run_within_its_budget(name):
    """benchmarks/results/bench-NAME/results.json (what docs/results/ quotes) was produced by the preset as it
    is now, holds every row that preset runs, and ran within the time its description promises."""
    path = RESULTS / f"bench-{name}" / "results.json"
    results = json.loads(path.read_text())
    preset = bench.PRESETS[name]
    meta, recs = results["meta"], results["records"]
    assert meta["preset"] == name and meta["config"] == json.loads(json.dumps(preset.to_dict()))
    rows = [(r["scheme"], r["method"], r["eval_len"], r.get("seed", preset.seed)) for r in recs]
    assert len(rows) == len(set(rows)) and {row[:3] for row in rows} == expected_rows(meta["config"])
    seeds = {s: {row[3] for row in rows if row[0] == s} for s, *_ in rows}
    assert all(sorted(seeds[s]) == preset.seeds_for(s) for s in preset.schemes), seeds  # every seed of the headline
    for r in recs:
        if r["status"] != "ok":  # only the bare learned table beyond its L
            assert (r["scheme"], r["method"]) == ("learned", "none") and r["eval_len"] > preset.train_len, r
            continue
        assert r["ppl"] > 1 and 0 < r["tokens"] <= preset.max_windows * r["eval_len"], r
        assert (r["passkey"] is not None) == (r["eval_len"] in preset.passkey_lengths), r
    # retrieval: every model (seed) and method that ran at a recall length, at every probed task and distance,
    # and the content-copy control of the key-matching probes at each of those cells
    ret = {(r["task"], r["scheme"], r["method"], r.get("seed", preset.seed), r["eval_len"], r["distance"])
           for r in results["retrieval"] if r["task"] in probe_tasks(preset) and r["scheme"] != CONTENT_COPY}
    assert ret == {(t, r["scheme"], r["method"], r.get("seed", preset.seed), r["eval_len"], d) for r in recs
                   if r["status"] == "ok" and r["eval_len"] in preset.recall_lengths
                   for t, d in probe_cells(preset, r["eval_len"])}
    control = {(r["task"], r["eval_len"], r["distance"]) for r in results["retrieval"] if r["scheme"] == CONTENT_COPY}
    assert control == ({(t, n, d) for n in preset.recall_lengths for t, d in probe_cells(preset, n)}
                       if preset.recall_task == "kv" else set())
    for r in results["retrieval"]:
        assert RetrievalRecord.from_dict(r).to_dict() == r and r["n"] == preset.recall_trials
    # "<= 15 min" is a bound; "~1 h" allows a quarter over
    m = re.search(r"(<=|~) ?(\d+) (min|h)", preset.description)
    budget = int(m.group(2)) * (60 if m.group(3) == "min" else 3600) * (1.0 if m.group(1) == "<=" else 1.25)
    assert meta["timings"]["total"] <= budget


def test_the_committed_16k_tune_is_what_the_suite_rows_run():
    """benchmarks/results/tune-smollm2-16k: its winner is SelfExtend with exactly the parameters of the suite's
    ``selfextend`` row at 16k (so the committed suite cells measure the recommendation), and the
    ``smollm2_tune16k`` preset runs its best LongRoPE vector; the LongRoPE rows keep the paper's constraint."""
    from pathlib import Path

    from posenc.evals.suite.presets import SUITE_PRESETS
    from posenc.evals.suite.spec import method_params

    res = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "tune-smollm2-16k" /
                      "results.json").read_text())
    rows, meta = res["rows"], res["meta"]
    assert meta["length"] == 16384 and meta["train_len"] == 8192 and meta["budget_forwards"] == 32
    assert sum(r["contexts"] for r in rows) == 32 and [r["score"] for r in rows] == sorted(r["score"] for r in rows)
    win = res["winner"]
    assert win == rows[0] and win["method"] == "selfextend"
    assert win["params"] == method_params("selfextend", 8192, 16384, 64, 1e5, {})
    best_longrope = next(r for r in rows if r["method"] == "longrope")
    tuned = SUITE_PRESETS["smollm2_tune16k"].params
    assert tuned["longrope@tune16k"] == best_longrope["params"]
    assert tuned["longrope@engine16k"] == {**best_longrope["params"], "native": False, "step": 512}
    for r in rows:
        if r["method"] == "longrope":
            assert is_monotone(r["params"]["long_factor"], 4.0)
    assert res["saved"]["form"] == "engine" and "longrope" in res["saved"]["reason"]


def test_the_committed_32k_tune_is_what_the_suite_rows_run():
    """benchmarks/results/tune-smollm2-32k: the same budget as at 16k; its winner, NTK with factor 6, and its best
    LongRoPE vector (kept monotone) are exactly the ``smollm2_tune32k`` preset's tuned rows, the LongRoPE one on
    transformers' form and on posenc's engine; the winner is saved as posenc's extension and says why."""
    from pathlib import Path

    from posenc.evals.suite.presets import SUITE_PRESETS

    res = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "tune-smollm2-32k" /
                      "results.json").read_text())
    rows, meta = res["rows"], res["meta"]
    assert meta["length"] == 32768 and meta["train_len"] == 8192 and meta["budget_forwards"] == 32
    assert sum(r["contexts"] for r in rows) == 32 and [r["score"] for r in rows] == sorted(r["score"] for r in rows)
    win, best_longrope = res["winner"], next(r for r in rows if r["method"] == "longrope")
    assert win == rows[0] and win["method"] == "ntk"
    preset = SUITE_PRESETS["smollm2_tune32k"]
    assert preset.lengths == (8192, 16384, 32768) and preset.prune_from is None  # every row runs at 32k
    assert preset.params["ntk@tune32k"] == win["params"]
    assert preset.params["longrope@tune32k"] == best_longrope["params"]
    assert preset.params["longrope@engine32k"] == {**best_longrope["params"], "native": False, "step": 512}
    assert best_longrope["params"]["factor"] == 32768 / 8192
    for r in rows:
        if r["method"] == "longrope":  # the search's bound is twice the factor
            assert is_monotone(r["params"]["long_factor"], 8.0)
    assert res["saved"]["form"] == "engine" and "longrope" in res["saved"]["reason"]
