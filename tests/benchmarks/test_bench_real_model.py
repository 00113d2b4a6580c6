"""benchmarks/bench_real_model.py: the decode table of a --decode-only run, on a hand-made result."""

from __future__ import annotations

from benchmarks.bench_real_model import decode_table, summarize


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
