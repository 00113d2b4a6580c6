"""posenc.evals.report.suite: the comparison tables (difference, interval, wins, losses, n) and the summary's
verdict rule."""

from __future__ import annotations

from posenc.evals.report.suite import comparison_tables, readme_block

L = 1024


def test_the_tables_show_difference_interval_wins_losses_and_n():
    comps = [{"length": 2048, "method": "none", "versus": "selfextend", "n": 4, "value": -1.0, "lo": -1.0,
              "hi": -0.307, "wins": 0, "losses": 4},
             {"length": 2048, "method": "yarn", "versus": "selfextend", "n": 0, "value": float("nan"), "lo": None,
              "hi": None, "wins": 0, "losses": 0}]
    (n, table), = comparison_tables({"comparisons": comps})
    assert n == 2048 and table.header == ("method", "minus selfextend")
    assert table.rows == (("none", "-1.00 [-1.00, -0.31] (0-4 of 4)"), ("yarn", "-"))
    results = {"meta": {"model": "tiny", "train_len": L}, "records": [], "reference": {}, "comparisons": comps}
    assert "Paired differences in retrieval at 2k" in readme_block(results, "x")
    assert comparison_tables({"records": []}) == []


def _rec(method, n, ppl, k, total=4):
    lo_hi = {"lo": 0.0, "hi": 1.0}
    return {"method": method, "eval_len": n, "ppl": ppl, "prefill_s": 10.0 * n, "peak_rss_mb": 1024.0 * n,
            "retrieval": {"k": k, "n": total, "value": k / total, **lo_hi}}


def test_verdict_follows_its_stated_rule():
    """``extends to N``: retrieval past the trained length at the threshold (0.85 x 0.75 here), even after a miss at
    a shorter length; ``keeps perplexity only``: every perplexity past it within 1.25 x the untouched model's at
    the reference length (100), a boundary case included; ``neither`` otherwise."""
    from posenc.evals.report.suite import summary_table, verdict

    recs = [_rec("none", 8, 100.0, 3), _rec("none", 16, 900.0, 0),
            _rec("a", 8, 100.0, 0), _rec("a", 16, 110.0, 3), _rec("a", 32, 5000.0, 0),  # 3/4 >= 0.6375
            _rec("b", 8, 100.0, 3), _rec("b", 16, 125.0, 2), _rec("b", 32, 120.0, 1),  # 125 = 1.25 x 100
            _rec("c", 8, 100.0, 3), _rec("c", 16, 126.0, 2),  # 126 > 125
            _rec("d", 8, 100.0, 4)]
    results = {"records": recs, "meta": {"train_len": 8},
               "reference": {"method": "none", "length": 8, "threshold": 0.85 * 0.75},
               "effective": {"a": {"effective_length": None}, "b": {"effective_length": 8}}}
    got = {m: verdict(results, m) for m in ("none", "a", "b", "c", "d")}
    assert got == {"none": "untouched", "a": "extends to 16", "b": "keeps perplexity only", "c": "neither",
                   "d": "not run past the trained length"}
    table = summary_table(results)
    assert table.header[-2:] == ("prefill s at 16 / 32", "peak RSS")
    assert table.rows[1] == ("a", "100, 0/4", "110, 3/4", "5000, 0/4", "< 8", "extends to 16", "160 / 320",
                             "32.0 GiB at 32")
