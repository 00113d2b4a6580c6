"""benchmarks/bench_real_model_memory.py: the rows it measures, the ratios and the table of a hand-made result, and
(slow tier) a short run on SmolLM2, one process per cell, resumed without measuring a cell twice."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_real_model_memory import UNTOUCHED, _row, ratios, rows, run, table


def test_the_untouched_model_comes_first_and_an_unknown_row_is_refused_naming_the_flag():
    assert rows(["selfextend", "yarn@engine"]) == [UNTOUCHED, "yarn@engine", "selfextend"]
    assert rows()[0] == UNTOUCHED and "dca" in rows() and len(rows()) == len(set(rows()))
    with pytest.raises(ValueError, match="--methods: no row 'selfextnd'"):
        rows(["selfextnd"])


def test_an_engine_row_has_a_lean_form_and_a_native_row_has_none():
    assert rows(["selfextend@lean", "dca", "selfextend"]) == [UNTOUCHED, "selfextend", "selfextend@lean", "dca"]
    method, fixed, kw = _row("yarn@engine@lean")
    assert (method, kw) == ("yarn", {"native": False, "rotated_keys": False}), kw
    assert _row("selfextend") == ("selfextend", {}, {})  # the row itself keeps its rotated keys (extend's default)
    with pytest.raises(ValueError, match="--methods: yarn@lean is not a row: yarn runs on transformers' own code"):
        rows(["yarn@lean"])


def test_each_rows_peak_is_read_against_the_untouched_models_at_its_length():
    cells = {UNTOUCHED: {"peak_mb": 400.0}, "selfextend": {"peak_mb": 600.0}, "dca": {"error": "timeout"}}
    assert ratios(cells) == {"selfextend": 1.5, "dca": None}
    assert ratios({"selfextend": {"peak_mb": 600.0}}) == {"selfextend": None}


def test_the_table_shows_peak_ratio_rotated_keys_and_cache_per_length_and_errors_as_they_are():
    cell = {"peak_mb": 600.4, "rotated_keys_mb": 203.0, "kv_cache_mb": 360.0}
    res = {"lengths": {"16384": {"cells": {UNTOUCHED: {**cell, "peak_mb": 400.0, "rotated_keys_mb": 0.0}},
                                 "peak_ratio": {}},
                       "8192": {"cells": {UNTOUCHED: {**cell, "peak_mb": 300.0, "rotated_keys_mb": 0.0},
                                          "selfextend": cell, "dca": {"error": "exit 1: boom"}},
                                "peak_ratio": {"selfextend": 2.0014, "dca": None}}}}
    lines = table(res).splitlines()
    assert lines[0] == ("| row | peak 8k (MB, ratio) | peak 16k (MB, ratio) | rotated keys 8k (MB) "
                        "| rotated keys 16k (MB) | key/value cache 8k (MB) | key/value cache 16k (MB) |")
    assert lines[2] == "| untouched | 300 | 400 | 0 | 0 | 360 | 360 |"
    assert lines[3] == "| selfextend | 600 (2.00) | - | 203 | - | 360 | - |"
    assert lines[4] == "| dca | exit 1: boom | - | - | - | - | - |"


@pytest.mark.slow
def test_a_short_run_measures_each_cell_in_its_own_process_and_a_rerun_measures_nothing_again(tmp_path):
    logs = []
    res = run(lengths=(512,), labels=["selfextend", "selfextend@lean"], decode=2, layers=1, out_dir=tmp_path,
              name="m", log=logs.append)
    cells = res["lengths"]["512"]["cells"]
    assert set(cells) == {UNTOUCHED, "selfextend", "selfextend@lean"}, cells
    assert cells["selfextend"]["rotated_keys_mb"] > 0 and cells["selfextend@lean"]["rotated_keys_mb"] == 0, cells
    for label, c in cells.items():
        assert c["allocator"] == {"MALLOC_MMAP_THRESHOLD_": "131072"}, (label, c)  # each cell's process pinned it
        assert c["peak_mb"] > 0 and c["prefill_peak_mb"] <= c["peak_mb"], (label, c)
        # one layer's keys and values after 512 + 2 tokens: 2 x 3 heads x 514 x 64 x 4 bytes
        assert c["kv_cache_mb"] == pytest.approx(2 * 3 * 514 * 64 * 4 / 2 ** 20), (label, c)
    assert cells["selfextend"]["params"]["window"] > 0 and cells[UNTOUCHED]["params"] == {}
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["lengths"]["512"]["peak_ratio"]["selfextend"] == pytest.approx(
        cells["selfextend"]["peak_mb"] / cells[UNTOUCHED]["peak_mb"])
    logs.clear()
    again = run(lengths=(512,), labels=["selfextend", "selfextend@lean"], decode=2, layers=1, out_dir=tmp_path,
                name="m", log=logs.append)
    assert logs == [f"0 cells to measure (3 already in {tmp_path / 'm.json'})"]
    assert again["lengths"] == saved["lengths"] and len(again["sittings"]) == 2
    with pytest.raises(ValueError, match="pass --name for a new file"):
        run(lengths=(512,), labels=["selfextend"], decode=4, layers=1, out_dir=tmp_path, name="m")


@pytest.mark.slow
def test_rows_that_run_the_untouched_models_own_computation_read_the_same_peak(tmp_path):
    """PI and YaRN on transformers' code at factor 1 are the untouched model's computation with other cos/sin: with
    the allocator pinned their peaks agree within a few MB (four layers at 8k: 277-279 MB; unpinned, glibc's heap left
    them 311-380 MB)."""
    res = run(lengths=(8192,), labels=["pi", "yarn"], decode=2, layers=4, out_dir=tmp_path, name="m",
              log=lambda _: None)
    peaks = [c["peak_mb"] for c in res["lengths"]["8192"]["cells"].values()]
    assert max(peaks) - min(peaks) <= 10, peaks
