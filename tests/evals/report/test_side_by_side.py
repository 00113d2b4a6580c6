"""posenc.evals.report.side_by_side: two runs at the same multiples of their own trained lengths, each judged by its
own rule, only the methods both ran."""

from __future__ import annotations

from posenc.evals.report.side_by_side import block, methods_in_all, rule_line, table


def _rec(method, n, k, total):
    return {"method": method, "eval_len": n, "ppl": 10.0,
            "retrieval": {"k": k, "n": total, "value": k / total, "lo": k / total / 2, "hi": min(1.0, k / total + .1)}}


def _interval_run():
    """A model trained at 32 judged by the interval rule (its verdicts stored)."""
    recs = [_rec("none", 32, 6, 12), _rec("none", 64, 1, 12), _rec("yarn", 64, 7, 12), _rec("yarn", 128, 3, 8),
            _rec("only_here", 64, 1, 12)]
    return {"meta": {"model": "big: a hybrid", "train_len": 32}, "records": recs,
            "reference": {"rule": "interval", "interval": {"k": 6, "n": 12, "lo": 0.25, "hi": 0.75}},
            "verdicts": {"none": {"verdict": "neither"}, "yarn": {"verdict": "extends to 64"},
                         "only_here": {"verdict": "neither"}}}


def _threshold_run():
    """A model trained at 8 judged by the earlier threshold rule (no verdicts stored: computed from the records)."""
    recs = [_rec("none", 8, 3, 4), _rec("yarn", 8, 3, 4), _rec("yarn", 16, 4, 4), _rec("none", 16, 0, 4)]
    return {"meta": {"model": "small: a llama", "train_len": 8}, "records": recs,
            "reference": {"method": "none", "length": 8, "retrieval": 0.75, "fraction": 0.85, "threshold": 0.6375}}


def test_rows_are_the_methods_both_ran_and_columns_the_same_multiples_of_each_trained_length():
    runs = [_interval_run(), _threshold_run()]
    assert methods_in_all(runs) == ["none", "yarn"]
    t = table(runs)
    assert t.header == ("method", "big: keys at 32 (L)", "big: keys at 64 (2L)", "big: keys at 128 (4L)",
                        "big: verdict", "small: keys at 8 (L)", "small: keys at 16 (2L)", "small: keys at 32 (4L)",
                        "small: verdict")
    assert t.rows[1] == ("yarn", "-", "7/12 (0.58 [0.29, 0.68])", "3/8 (0.38 [0.19, 0.47])", "extends to 64",
                         "3/4 (0.75 [0.38, 0.85])", "4/4 (1.00 [0.50, 1.00])", "-", "extends to 16")
    assert t.rows[0][4] == "neither" and t.rows[0][-1] == "untouched"


def test_each_run_states_the_rule_it_was_judged_by_and_the_block_is_marked_by_both_names():
    a, b = _interval_run(), _threshold_run()
    assert rule_line(a) == ("big (trained at 32): the interval rule, against the untouched model's 6/12 [0.25, 0.75] "
                            "at 32 and a perplexity bound.")
    assert "threshold rule" in rule_line(b) and "0.85 x the untouched model's 0.75 at 8" in rule_line(b)
    text = block([a, b], ["run-a", "run-b"])
    assert text.startswith("<!-- side-by-side:run-a,run-b:begin -->") and text.endswith(
        "<!-- side-by-side:run-a,run-b:end -->")
    assert "| yarn |" in text and "only_here" not in text


def test_a_stored_verdict_prints_its_length_as_the_report_does():
    """The interval rule stores ``extends to 65536``; the side-by-side prints ``64k``, as the run's own verdict table
    does (:func:`posenc.evals.report.suite_answer.verdict_rows`), not the raw token count."""
    from posenc.evals.report.suite_answer import verdict_rows

    run = _interval_run()
    run["verdicts"]["yarn"] = {"verdict": "extends to 65536"}
    assert table([run, _threshold_run()]).rows[1][4] == "extends to 64k"
    assert dict((m, v) for m, v, _ in verdict_rows(run))["yarn"] == "extends to 64k"
