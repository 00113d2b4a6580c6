"""posenc.evals.report.suite_answer: the answer-first report of a run judged by the interval rule, on hand-made
results: the verdict list and one figure on the first screen (a Chromium screenshot, as for the docs pages),
left-out rows in one line, one colour per row, times compared only under a similar load."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from posenc.evals.report import suite_answer as a
from posenc.evals.report.suite import write_report
from posenc.evals.stats.intervals import wilson

L = 8192
METHODS = ("none", "yarn", "selfextend", "ntk", "dca", "streaming_llm", "string", "rerope")


def _iv(k, n):
    i = wilson(k, n)
    return {"k": k, "n": n, "value": i.value, "lo": i.lo, "hi": i.hi}


def results(load=lambda m, n: 2.0, speed=lambda m, n: None) -> dict:
    hits = {"none": (20, 2), "yarn": (20, 15), "selfextend": (21, 20), "ntk": (20, 12), "dca": (20, 19),
            "streaming_llm": (20, 8), "string": (21, 21), "rerope": (19, 5)}
    records = []
    for m in METHODS:
        for i, n in enumerate((L, 2 * L)):
            k = hits[m][i]
            bins = [{"bin": b, "from": lo, "to": hi, "distance": (lo + hi) // 2, "interval": _iv(min(k // 3, 8), 8)}
                    for b, (lo, hi) in enumerate(((256, 2048), (2048, 8192), (8192, 32768))[:2 + i])]
            records.append({"method": m, "eval_len": n, "retrieval": _iv(k, 24), "ppl": 10.0 + i, "cells": 11,
                            "ppl_ratio": {"value": 1.0 + 0.1 * i, "lo": 0.95, "hi": 1.1 + 0.2 * i, "n": 4},
                            "ppl_vs": {"none": {"value": 0.9, "lo": 0.8, "hi": 1.0, "n": 4}} if m != "none" else {},
                            "by_bin": bins, "prefill_s": 80.0 * (i + 1), "loadavg": load(m, n),
                            "gflops": speed(m, n),
                            "tasks": {"niah_keys": {**_iv(k, 24), "chance": 1 / 8}}})
    verdicts = {"none": {"verdict": "keeps perplexity only", "effective_length": L, "undecided_at": None},
                "selfextend": {"verdict": f"extends to {2 * L}", "effective_length": 2 * L, "undecided_at": None},
                "yarn": {"verdict": "undecided", "effective_length": L, "undecided_at": 2 * L}}
    verdicts.update({m: {"verdict": "neither", "effective_length": L, "undecided_at": None} for m in METHODS[3:]})
    return {"meta": {"preset": "smollm2", "model": "smollm2", "model_id": "smollm2-abc", "train_len": L,
                     "left_out": {f"m{i}@{2 * L}": "retrieval below" for i in range(13)}, "missing": {},
                     "machine": {}, "config": {}},
            "reference": {"rule": "interval", "length": L, "interval": _iv(20, 24), "floor": 0.5,
                          "below_floor": False, "ppl_bound": 1.25, "kinds": ["niah_keys"]},
            "records": records, "verdicts": verdicts,
            "effective": {m: {"effective_length": v["effective_length"]} for m, v in verdicts.items()},
            "comparisons": [{"length": 2 * L, "method": "string", "versus": "none", "n": 24, "value": 19 / 24,
                             "lo": 0.55, "hi": 0.9, "wins": 19, "losses": 0},
                            {"length": 2 * L, "method": "yarn", "versus": "selfextend", "n": 24, "value": -5 / 24,
                             "lo": -0.4, "hi": 0.02, "wins": 1, "losses": 6}]}


def test_first_screen_lines_verdicts_and_left_out_in_one_line():
    res = results()
    lines = a.first_screen(res)
    assert lines[0].startswith("Model: smollm2, trained at L = 8192") and "20/24 = 0.83 [0.64, 0.93]" in lines[1]
    assert sum(line.startswith("Left out:") for line in lines) == 1
    rows = dict((m, v) for m, v, _ in a.verdict_rows(res))
    assert rows["selfextend"] == "extends to 16k" and rows["yarn"] == "undecided (undecided at 16k)"
    assert [r[-1] for r in a.separated_rows(res)] == ["separated", "not separated"]
    cols = a.colors(res)
    assert len(set(cols.values())) == len(METHODS) and cols["none"] == (0.0, 0.0, 0.0)


def test_a_reference_below_the_floor_judges_nothing():
    res = results()
    res["reference"]["below_floor"] = True
    res["verdicts"] = {}
    assert any("no method is judged" in line for line in a.first_screen(res)) and a.verdict_rows(res) == []


def test_times_measured_under_another_load_are_not_compared():
    res = results(load=lambda m, n: 9.5 if m == "yarn" else 2.0)
    rows = {(m, n): t for m, n, t, *_ in a.cost_rows(res)}
    assert rows[("none", "16k")] == "160 s" and rows[("yarn", "16k")] == "not compared (load 9.5 vs 2.0)"


def test_times_from_a_slower_machine_or_unprobed_cells_are_not_compared_where_the_length_was_probed():
    """At 16k every row probed its cells at 150-160 GFLOP/s but DCA (half its cells at 100: another machine) and
    ReRoPE (5 of its 11 cells probed); at 8k nothing was probed, so only the load decides there."""
    def speed(m, n):
        if n == L:
            return None
        lo, cells = {"dca": (100.0, 11), "rerope": (150.0, 5)}.get(m, (150.0, 11))
        return {"lo": lo, "hi": 160.0, "cells": cells}

    got = {(m, n): (t, g) for m, n, t, _, g, _ in a.cost_rows(results(speed=speed))}
    assert got[("none", "16k")] == ("160 s", "150-160") and got[("none", "8k")] == ("80 s", "not probed")
    assert got[("dca", "16k")] == ("not compared (matmul 100-160 vs typical 160 GFLOP/s)", "100-160")
    assert got[("rerope", "16k")] == ("not compared (machine speed not probed for every cell)", "150-160")
    assert got[("dca", "8k")] == ("80 s", "not probed")


def test_one_fast_cell_leaves_the_other_rows_compared_and_is_itself_not_compared():
    """The band is around the length's typical speed (the median row), not its fastest probe: YaRN's cells ran on a
    machine twice as fast, so its time is not compared, and the rows at 150-160 GFLOP/s still are."""
    def speed(m, n):
        return {"lo": 150.0, "hi": 320.0 if m == "yarn" else 160.0, "cells": 11}

    got = {(m, n): t for m, n, t, *_ in a.cost_rows(results(speed=speed))}
    assert got[("none", "16k")] == "160 s" and got[("selfextend", "16k")] == "160 s"
    assert got[("yarn", "16k")] == "not compared (matmul 150-320 vs typical 160 GFLOP/s)"


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


@pytest.mark.slow
def test_the_first_screen_shows_the_verdicts_and_the_figure(tmp_path):
    """report.html in Chromium at 1400 x 1000: the verdict list and the whole accuracy-by-length figure are on the
    first screen, above any table; the screenshot is kept (POSENC_SHOTS, else the test's folder)."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium): the screenshot needs a real browser")
    from playwright.sync_api import sync_playwright

    paths = write_report(results(), tmp_path)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                        headless=True, args=FLAGS,
                                                        viewport={"width": 1400, "height": 1000})
        try:
            tab = context.new_page()
            tab.goto(paths["html"].as_uri(), wait_until="load")
            shots = Path(os.environ.get("POSENC_SHOTS") or tmp_path)
            shots.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(shots / "suite-report-first-screen.png"))
            figure = tab.locator("img").first.bounding_box()
            verdicts = tab.locator("#verdicts").bounding_box()
            items = tab.locator("#verdicts li").all_inner_texts()
            first_table = tab.locator("table").first.bounding_box()
            complete = tab.evaluate("() => Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        finally:
            context.close()
    assert complete and figure["y"] + figure["height"] <= 1000 and verdicts["y"] + verdicts["height"] <= 1000
    assert len(items) == len(METHODS) and any("selfextend: extends to 16k" in t for t in items)
    assert first_table["y"] >= 1000 - 1 or first_table["y"] > figure["y"] + figure["height"]


def test_the_readme_summary_gives_verdicts_with_n_and_intervals_and_keys_by_distance_at_L_and_2L():
    """The README's summary of a run judged by the interval rule: each row's stored verdict with its keys as k/n and
    Wilson interval at every length and its perplexity ratio past L; then the keys per distance bin at L (the
    control) and 2L, one column per (length, bin), a row without that bin left '-'."""
    from posenc.evals.report.suite import summary_block

    res = results()
    res["records"] = [r for r in res["records"] if not (r["method"] == "rerope" and r["eval_len"] == 2 * L)]
    header, rows = a.summary_verdicts(res)
    assert header == ("method", "verdict", "effective length", "keys at 8k", "keys at 16k", "PPL ratio at 16k")
    by = {r[0]: r for r in rows}
    assert by["selfextend"] == ("selfextend", "extends to 16k", "16k", "21/24 [0.69, 0.96]", "20/24 [0.64, 0.93]",
                                "1.10 [0.95, 1.30]")
    assert by["yarn"][1] == "undecided (undecided at 16k)" and by["rerope"][-2:] == ("-", "-")
    header, rows = a.summary_distance(res)
    assert header == ("method", "8k: 256-2048 back", "8k: 2048-8192 back", "16k: 256-2048 back",
                      "16k: 2048-8192 back", "16k: 8192-32768 back")
    by = {r[0]: r for r in rows}
    assert by["dca"][1:] == ("6/8 [0.41, 0.93]",) * 5 and by["rerope"][3:] == ("-",) * 3
    block = summary_block(res, "run")
    assert block.startswith("<!-- suite-summary:run:begin -->") and block.endswith("<!-- suite-summary:run:end -->")
    assert "| selfextend | extends to 16k | 16k | 21/24 [0.69, 0.96] |" in block
    assert "at 8k (the control), twice and four times 8k" in block and "| 16k: 8192-32768 back |" in block


def test_the_distance_figure_names_every_row_even_one_left_out_at_the_longest_length():
    """The legend is the figure's, not the last panel's: with every row but the untouched model left out at 2L
    (the last panel draws one line), each row drawn at L is still named, once, in the rows' order."""
    res = results()
    res["records"] = [r for r in res["records"] if r["eval_len"] == L or r["method"] == "none"]
    fig = a.distance_figure(res)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(METHODS)
    assert len(fig.axes) == 2 and [len(ax.containers) for ax in fig.axes] == [len(METHODS), 1]
    assert a.distance_figure({**res, "records": [{**r, "by_bin": []} for r in res["records"]]}) is None
