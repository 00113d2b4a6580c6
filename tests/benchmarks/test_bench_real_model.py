"""benchmarks/bench_real_model.py: the decode table of a --decode-only run and the table of a prefill-and-decode run,
on hand-made results."""

from __future__ import annotations

from benchmarks.bench_real_model import decode_table, run_table, summarize


def _length(untouched, rows):
    runs = {label: [{"prefill_s": None, "decode_tok_s": t, "peak_mb": 1.0, "rotated_keys_mb": mb} for t in ts]
            for label, (ts, mb) in rows.items()}
    base = [{"prefill_s": None, "decode_tok_s": t, "peak_mb": 1.0, "rotated_keys_mb": 0.0} for t in untouched]
    return {"untouched": base, "runs": runs, "summary": summarize(runs, base)}


def test_the_decode_table_shows_each_rows_ratio_its_lean_forms_and_the_memory_it_keeps():
    res = {"lengths": {
        "8192": _length([10.0, 8.0], {"selfextend": ([9.0, 8.0], 90.0), "selfextend@lean": ([7.0, 6.0], 0.0),
                                      "yarn": ([10.0, 8.0], 0.0)}),
        "16384": _length([5.0], {"selfextend": ([4.5], 180.0), "selfextend@lean": ([4.0], 0.0), "yarn": ([5.0], 0.0)}),
    }}
    text = decode_table(res)
    lines = text.splitlines()
    assert lines[0] == "| row | 8k decode / untouched | 16k decode / untouched | 16k rotated keys MB |"
    assert lines[2] == "| untouched (tok/s, each repeat) | 8.00, 10.00 | 5.00 | - |"
    assert lines[3] == "| selfextend | 0.95 [0.90, 1.00] (lean 0.72 [0.70, 0.75]) | 0.90 (lean 0.80) | 180 |"
    assert lines[4] == "| yarn | 1.00 [1.00, 1.00] | 1.00 | 0 |"
    assert len(lines) == 5  # the lean rows appear only beside their own row


def _timed(prefill, tok_s, peak, mb=0.0):
    return {"prefill_s": prefill, "decode_tok_s": tok_s, "peak_mb": peak, "rotated_keys_mb": mb}


def test_the_run_table_shows_prefill_and_decode_ratios_per_length_and_the_memory_at_the_longest():
    def length(base, rows):
        runs = {label: [_timed(*r) for r in rs] for label, rs in rows.items()}
        b = [_timed(*r) for r in base]
        return {"untouched": b, "runs": runs, "summary": summarize(runs, b)}

    res = {"lengths": {
        "8192": length([(30.0, 8.0, 100.0)], {"selfextend": [(33.0, 6.0, 110.0, 50.0)], "yarn": [(30.0, 8.0, 100.0)]}),
        "16384": length([(80.0, 4.0, 200.0), (100.0, 5.0, 220.0)],
                        {"selfextend": [(88.0, 4.4, 240.0, 150.0), (100.0, 5.0, 220.0, 150.0)]}),
    }}
    lines = run_table(res).splitlines()
    assert lines[0] == ("| row | prefill 8k | prefill 16k | decode 8k | decode 16k | peak memory 16k "
                        "| rotated keys MB 16k |")
    assert lines[2] == ("| untouched (s, tok/s, MB) | 30.0 s | 80.0 s, 100.0 s | 8.00 | 4.00, 5.00 "
                        "| 200 MB, 220 MB | - |")
    assert lines[3] == "| selfextend | 1.10 | 1.05 [1.00, 1.10] | 0.75 | 1.05 [1.00, 1.10] | 1.10 [1.00, 1.20] | 150 |"
    assert lines[4] == "| yarn | 1.00 | - | 1.00 | - | - | - |"  # a row not measured at 16k shows "-" there
    assert len(lines) == 5


def test_a_resumed_length_measures_the_baseline_again_and_only_the_rows_the_stopped_run_lacks(monkeypatch):
    import benchmarks.bench_real_model as brm

    calls = []

    def fake(model, row, n, decode, decode_only=False, synthetic=False):
        calls.append(None if row is None else row[0])
        return _timed(10.0 if row is None else 12.0, 5.0, 1.0)

    monkeypatch.setattr(brm, "run_one", fake)
    rows = [("a", "yarn", {}, {}), ("b", "rerope", {}, {}), ("c", "dca", {}, {})]
    stopped = {"untouched": [_timed(20.0, 4.0, 1.0)], "runs": {"a": [_timed(22.0, 4.0, 1.0)], "b": []}}
    res = brm.bench_length(None, 64, 1, rows, 2, False, lambda *_: None, prior=stopped)
    # the warm-up, the baseline, then only the rows without a measurement (in the order the repeat rotates to)
    assert calls[:2] == [None, None] and sorted(calls[2:]) == ["b", "c"]
    assert [r["prefill_s"] for r in res["untouched"]] == [20.0, 10.0] and res["repeats"] == 2
    assert res["runs"]["a"][1] is None and res["runs"]["b"][0] is None and res["runs"]["c"][0] is None
    # each ratio pairs a row with the baseline of its own sitting
    assert res["summary"]["a"]["prefill_ratio"]["median"] == 1.1
    assert res["summary"]["b"]["prefill_ratio"]["median"] == 1.2
    calls.clear()
    again = brm.bench_length(None, 64, 1, rows, 2, False, lambda *_: None, prior=res)
    assert calls == [] and again["untouched"] == res["untouched"]  # nothing left to measure
