"""posenc.evals.suite.results: paired differences between suite rows (the same queries of the same cells,
Newcombe's paired interval, refused when two rows' cells do not hold the same contexts), and row labels holding
an at sign."""

from functools import partial
from types import SimpleNamespace

import pytest

from posenc.evals.stats.intervals import paired_difference
from posenc.evals.suite import ContextSpec, SuitePreset
from posenc.evals.suite.results import paired_differences
from posenc.evals.suite.spec import cell_key, method_params

L = 1024

FACTS = SimpleNamespace(model_id="tiny", train_len=L, head_dim=16, base=10000.0, device="cpu", dtype="float32")

CONTEXTS = (ContextSpec("book", ("niah",), seeds=1, target=8), ContextSpec("noise", ("passkey",), seeds=3))


class Store(dict):
    def get(self, key):
        return super().get(repr(sorted(key.items())))

    def put(self, key, value):
        self[repr(sorted(key.items()))] = value


def _preset(**kw):
    return SuitePreset(**{**dict(name="t", description="t", model="tiny", lengths=(1024, 2048),
                                 methods=("none", "yarn", "selfextend"), contexts=CONTEXTS, reference_length=1024,
                                 compare_to=("selfextend",)), **kw})


def _fill(preset, outcomes: dict, depth_of=lambda method, seed: 0.1 * seed):
    """``outcomes[(method, length)]``: per pass-key seed, right or wrong; the book cell holds one uninformative
    multi-key needle every row gets right."""
    store = Store()
    for (method, n), hits in outcomes.items():
        params = method_params(method, L, n, FACTS.head_dim, FACTS.base, {})
        book = {"answers": [{"kind": "niah_mk", "correct": True, "depth": 0.5, "distance": 9, "chance": 0.25}]}
        store.put(cell_key("tiny", method, params, n, CONTEXTS[0], 0, False), book)
        for s, hit in enumerate(hits):
            ans = {"kind": "passkey", "correct": hit, "depth": depth_of(method, s), "distance": 9, "chance": 0.0}
            store.put(cell_key("tiny", method, params, n, CONTEXTS[1], s, False), {"answers": [ans]})
    return store


def test_rows_are_compared_query_by_query_past_the_trained_length():
    outcomes = {("none", 1024): [1, 1, 1], ("selfextend", 1024): [1, 1, 1], ("yarn", 1024): [1, 1, 1],
                ("none", 2048): [0, 0, 0], ("selfextend", 2048): [1, 1, 0], ("yarn", 2048): [0, 1, 1]}
    comps = paired_differences(_preset(), FACTS, _fill(_preset(), outcomes), ("passkey",))
    assert [(c["length"], c["method"], c["versus"]) for c in comps] == [(2048, "none", "selfextend"),
                                                                       (2048, "yarn", "selfextend")]
    none, yarn = comps
    # yarn against selfextend: equal totals (2 of 3 each) but not on the same queries: 1 win, 1 loss
    assert (yarn["value"], yarn["wins"], yarn["losses"], yarn["n"]) == (0.0, 1, 1, 3)
    assert (none["value"], none["wins"], none["losses"]) == (pytest.approx(-2 / 3), 0, 2)
    ref = paired_difference([False] * 3, [True, True, False])
    assert (none["lo"], none["hi"]) == pytest.approx((ref.lo, ref.hi))
    # the book's multi-key needle is not an informative kind here: only the pass keys are paired
    assert all(c["n"] == 3 for c in comps)
    assert paired_differences(_preset(compare_to=()), FACTS, _fill(_preset(), outcomes), ("passkey",)) == []


def test_only_queries_both_rows_answered_are_paired():
    outcomes = {("none", 2048): [0, 0, 0], ("selfextend", 2048): [1, 1], ("yarn", 2048): [1]}
    comps = {c["method"]: c for c in paired_differences(_preset(), FACTS, _fill(_preset(), outcomes), ("passkey",))}
    assert comps["none"]["n"] == 2 and comps["yarn"]["n"] == 1 and comps["yarn"]["value"] == 0


def test_cells_of_different_contexts_are_refused():
    outcomes = {("none", 2048): [0, 0, 0], ("selfextend", 2048): [1, 1, 1]}
    store = _fill(_preset(), outcomes, depth_of=lambda method, s: 0.1 * s + (0.05 if method == "none" else 0))
    with pytest.raises(ValueError, match="different depths"):
        paired_differences(_preset(), FACTS, store, ("passkey",))


def test_compare_to_must_name_rows_of_the_preset():
    with pytest.raises(ValueError, match="compare_to names rows"):
        _preset(compare_to=("dca",))


def test_a_row_label_holding_an_at_sign_keeps_its_lengths():
    from posenc.evals.suite.results import _lengths_of

    pairs = {"dca@qwen@32768": "pruned", "dca@16384": "pruned", "dca@qwen@16384": "pruned"}
    assert _lengths_of("dca@qwen", pairs) == [16384, 32768] and _lengths_of("dca", pairs) == [16384]


def test_perplexity_ratios_are_paired_over_passages_against_a_hand_computation():
    import math

    from posenc.evals.suite.results import ppl_ratio

    row = {"book:niah/0": 3.0, "book:niah/1": 3.2, "book:niah/2": 2.9, "book:niah/3": 3.1, "book:niah/9": 9.0}
    ref = {"book:niah/0": 2.9, "book:niah/1": 3.0, "book:niah/2": 2.9, "book:niah/3": 3.0}
    got = ppl_ratio(row, ref)
    d = [0.1, 0.2, 0.0, 0.1]  # log ratios of the 4 shared passages (the fifth is not paired)
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = 3.182446 * sd / 2  # t(0.975, 3) x sd / sqrt(4)
    assert got["n"] == 4 and got["value"] == pytest.approx(math.exp(mean))
    assert (got["lo"], got["hi"]) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-5)
    one = ppl_ratio({"a/0": 3.0}, {"a/0": 2.0})
    assert one["n"] == 1 and one["lo"] is None and ppl_ratio({"a/0": 1.0}, {"b/0": 1.0}) is None


def test_keys_are_counted_by_distance_bin():
    from posenc.evals.suite.results import by_bin

    bins = [[256, 2048], [2048, 8192], [8192, 32768]]
    answers = [{"kind": "niah_keys", "correct": c, "distance": d} for c, d in
               ((True, 300), (False, 1000), (True, 3000), (True, 9000), (False, 20000))]
    answers.append({"kind": "passkey", "correct": True, "distance": 500})  # the control is not binned
    got = by_bin(answers, bins)
    assert [(b["bin"], b["interval"]["k"], b["interval"]["n"], b["distance"]) for b in got] == [
        (0, 1, 2, 650), (1, 1, 1, 3000), (2, 1, 2, 14500)]


def test_a_wrong_answer_with_another_keys_value_is_counted_per_bin():
    """Prefill 1: the far key answered with the near key's value (counted); prefill 2: both wrong, the far one
    with the near one's wrong answer (not counted: no key of that prefill was answered with it); the pass key
    control is left as it was."""
    from posenc.evals.suite.results import by_bin, mark_other_key

    def a(correct, distance, answer, kind="niah_keys"):
        return {"kind": kind, "correct": correct, "distance": distance, "answer": answer}

    cells = [(None, 0, {"answers": [a(True, 500, ": 1234567"), a(False, 5000, "1234567")]}),
             (None, 1, {"answers": [a(False, 600, "7654321"), a(False, 6000, "7654321"),
                                    a(True, 90, "42", "passkey")]})]
    marked = mark_other_key(cells)
    assert [x.get("other_key") for x in marked] == [False, True, False, False, None]
    assert "other_key" not in cells[0][2]["answers"][1]  # the stored values are not changed
    got = by_bin(marked, [[256, 2048], [2048, 8192]])
    assert [(b["interval"]["k"], b["interval"]["n"], b["other_key"]) for b in got] == [(1, 2, 0), (0, 2, 1)]


def _newcombe_by_hand(e, f, g, h):
    """Newcombe's method 10 written out from the paper's formulas (z = 1.959964), independent of posenc."""
    import math

    z, n = 1.959964, e + f + g + h

    def wil(k):
        p = k / n
        c = (p + z * z / (2 * n)) / (1 + z * z / n)
        w = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return p, c - w, c + w

    (pa, la, ua), (pb, lb, ub) = wil(e + f), wil(e + g)
    cross = e * h - f * g
    c = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0)
    phi = c / math.sqrt((e + f) * (g + h) * (e + g) * (f + h))
    d = pa - pb
    lo = d - math.sqrt((pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2)
    hi = d + math.sqrt((ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2)
    return d, lo, hi


def test_suite_comparisons_are_newcombes_interval_by_hand():
    """24 keys per row: 14 both found, 6 only the row, 1 only the other, 3 neither."""
    a = [1] * 14 + [1] * 6 + [0] * 1 + [0] * 3
    b = [1] * 14 + [0] * 6 + [1] * 1 + [0] * 3
    outcomes = {("none", 1024): [1] * 24, ("selfextend", 1024): [1] * 24, ("yarn", 1024): [1] * 24,
                ("none", 2048): [0] * 24, ("selfextend", 2048): b, ("yarn", 2048): a}
    contexts = (CONTEXTS[0], ContextSpec("noise", ("passkey",), seeds=24))
    preset = _preset(contexts=contexts)
    store = Store()
    for (method, n), hits in outcomes.items():
        params = method_params(method, L, n, FACTS.head_dim, FACTS.base, {})
        for s, hit in enumerate(hits):
            ans = {"kind": "passkey", "correct": bool(hit), "depth": 0.5, "distance": 9, "chance": 0.0}
            store.put(cell_key("tiny", method, params, n, contexts[1], s, False), {"answers": [ans]})
    yarn = next(c for c in paired_differences(preset, FACTS, store, ("passkey",)) if c["method"] == "yarn")
    d, lo, hi = _newcombe_by_hand(14, 6, 1, 3)
    assert (yarn["value"], yarn["lo"], yarn["hi"]) == pytest.approx((d, lo, hi), abs=1e-6)
    assert (yarn["wins"], yarn["losses"], yarn["n"]) == (6, 1, 24) and yarn["lo"] < 0 < yarn["hi"]  # 6-1: not separated


def test_a_context_for_some_rows_adds_paired_passages_and_leaves_the_perplexity_column_alone():
    """A book context run for some rows only (``ContextSpec.methods``): those rows' cells hold it and their
    paired ratios take its passages, while every row's perplexity is over the passages all rows score."""
    import math

    from posenc.evals.suite.results import _cells_of, _record, ppl_ratio
    from posenc.evals.suite.spec import plan

    shared = ContextSpec("book", ("niah",), seeds=2, target=8)
    extra = ContextSpec("book", ("niah",), seeds=2, first_seed=2, target=8, methods=("none", "yarn"))
    preset = _preset(contexts=(shared, extra), compare_to=())
    assert {(m, s) for n, m, spec, s in plan(preset) if spec is extra} == {
        (m, s) for m in ("none", "yarn") for s in (2, 3)}
    assert sum(spec is shared for n, m, spec, s in plan(preset)) == 2 * 3 * 2  # lengths x rows x seeds

    loss = {0: 3.0, 1: 3.2, 2: 9.0, 3: 1.0}  # the extra passages far from the shared ones: the mean would move
    store = Store()
    for method in ("none", "yarn", "selfextend"):
        params = method_params(method, L, 2048, FACTS.head_dim, FACTS.base, {})
        for spec in (shared, extra):
            for s in spec.seed_range:
                store.put(cell_key("tiny", method, params, 2048, spec, s, False), {
                    "answers": [], "prefill_s": 1.0, "peak_rss_mb": 1.0, "decode_s": 0.0, "decode_tokens": 0,
                    "loadavg": [1.0], "target": {"loss": loss[s], "accuracy": 0.5, "tokens": 8,
                                                 "block_losses": [loss[s]]}})
    rec = {m: _record("tiny", FACTS, preset, m, 2048, _cells_of(store, FACTS, preset, m, 2048), ())
           for m in ("none", "yarn", "selfextend")}
    assert len(rec["yarn"]["passages"]) == 4 and len(rec["selfextend"]["passages"]) == 2  # no cell of it is read
    for r in rec.values():
        assert r["ppl"] == pytest.approx(math.exp(3.1)) and r["tokens"] == 16
    assert ppl_ratio(rec["yarn"]["passages"], rec["none"]["passages"])["n"] == 4
    assert ppl_ratio(rec["selfextend"]["passages"], rec["none"]["passages"])["n"] == 2


def test_a_context_naming_a_row_outside_the_preset_is_refused():
    with pytest.raises(ValueError, match="names rows that are not methods of the preset: \\['dca'\\]"):
        _preset(contexts=(ContextSpec("book", ("niah",), target=8, methods=("none", "dca")),))


_PRUNE_CONTEXTS = (ContextSpec("noise", ("keys",), seeds=3), ContextSpec("book", ("niah",), seeds=2, target=8))


def _put_keys_and_passages(store, method, n, hits, losses):
    """Row ``method``'s cells at ``n`` in ``_PRUNE_CONTEXTS``: 12 keys (``hits``, 4 per context) and one target
    loss per passage (``losses``)."""
    keys, book = _PRUNE_CONTEXTS
    params = method_params(method, L, n, FACTS.head_dim, FACTS.base, {})
    for s in range(3):
        ans = [{"kind": "niah_keys", "correct": bool(h), "depth": 0.5, "distance": 9, "chance": 0.0}
               for h in hits[4 * s:4 * s + 4]]
        store.put(cell_key("tiny", method, params, n, keys, s, False), {"answers": ans})
    for s, loss in enumerate(losses):
        store.put(cell_key("tiny", method, params, n, book, s, False), {"answers": [], "target": {"loss": loss}})


def test_under_the_interval_rule_a_row_is_left_out_only_once_it_lost_something():
    """Pruning of an interval-judged preset follows the verdict at the previous length, not a point estimate: a
    row one key short of the reference (undecided) runs on, a row whose perplexity interval lies above the bound
    (``neither``) or whose keys' interval lies below the reference's (``keeps perplexity only``) is left out."""
    from posenc.evals.suite.grid import _pruned

    preset = _preset(contexts=_PRUNE_CONTEXTS, lengths=(1024, 2048, 4096), prune_from=4096, compare_to=(),
                     retrieval_kinds=("niah_keys",), methods=("none", "yarn", "selfextend", "dca"))
    store = Store()
    put = partial(_put_keys_and_passages, store)
    put("none", 1024, [1] * 8 + [0] * 4, [3.0, 3.2])  # 8/12: Wilson [0.39, 0.86]
    put("yarn", 2048, [1] * 7 + [0] * 5, [3.02, 3.21])  # 7/12, perplexity kept: undecided, runs on
    put("selfextend", 2048, [1] * 8 + [0] * 4, [3.5, 3.71])  # keys kept, perplexity x1.66: neither
    put("dca", 2048, [0] * 12, [3.01, 3.22])  # 0/12: Wilson [0, 0.24] below 0.39: keeps perplexity only
    assert _pruned(store, FACTS, preset, "yarn", 4096) is None
    assert _pruned(store, FACTS, preset, "selfextend", 4096).startswith("neither at 2048 (keys 8/12, the untouched")
    assert _pruned(store, FACTS, preset, "dca", 4096).startswith("keeps perplexity only at 2048 (keys 0/12")
    assert _pruned(store, FACTS, preset, "none", 4096) is None  # the untouched model always runs


def test_prune_unless_extends_runs_on_only_the_rows_that_extended_and_the_rows_compared_with():
    """``prune_unless_extends``: an undecided row is left out too, naming its verdict; a row that extended runs on,
    and so do the untouched model and a ``compare_to`` row whatever their verdicts (the paired intervals at the
    length are taken against them)."""
    from posenc.evals.suite.grid import _pruned

    preset = _preset(contexts=_PRUNE_CONTEXTS, lengths=(1024, 2048, 4096), prune_from=4096, prune_unless_extends=True,
                     compare_to=("selfextend",), retrieval_kinds=("niah_keys",),
                     methods=("none", "yarn", "selfextend", "dca"))
    store = Store()
    put = partial(_put_keys_and_passages, store)
    put("none", 1024, [1] * 8 + [0] * 4, [3.0, 3.2])  # 8/12: Wilson [0.39, 0.86]
    put("yarn", 2048, [1] * 11 + [0], [3.0, 3.2])  # 11/12 [0.65, 0.99], perplexity kept: extends
    put("dca", 2048, [1] * 7 + [0] * 5, [3.02, 3.21])  # 7/12 [0.32, 0.81] spans 0.39: undecided
    put("selfextend", 2048, [0] * 12, [3.5, 3.71])  # neither, but the row the others are compared with
    assert _pruned(store, FACTS, preset, "yarn", 4096) is None
    assert _pruned(store, FACTS, preset, "dca", 4096).startswith("undecided at 2048 (keys 7/12, the untouched")
    assert _pruned(store, FACTS, preset, "selfextend", 4096) is None
    assert _pruned(store, FACTS, preset, "none", 4096) is None
    assert _pruned(store, FACTS, preset, "dca", 2048) is None  # before prune_from every row runs
    with pytest.raises(ValueError, match="prune_unless_extends needs prune_from and retrieval_kinds"):
        _preset(contexts=_PRUNE_CONTEXTS, prune_unless_extends=True)


def test_a_rows_machine_speed_is_the_range_of_its_cells_probes_and_how_many_probed():
    from posenc.evals.suite.results import machine_speed

    cells = [(None, None, {"gflops": 150.0}), (None, None, {"gflops": 90.0}), (None, None, {"prefill_s": 1.0})]
    assert machine_speed(cells) == {"lo": 90.0, "hi": 150.0, "cells": 2}
    assert machine_speed([(None, None, {"gflops": None}), (None, None, {})]) is None
