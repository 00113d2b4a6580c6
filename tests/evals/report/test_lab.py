"""posenc.evals.report.lab: tables, shape checks and plots from hand-made records (no training)."""

from __future__ import annotations

import math

import pytest

from posenc.evals.report import lab as R

L = 16


def rec(scheme, method, n, ppl, acc=0.5, passkey=None, status="ok"):
    return {"scheme": scheme, "method": method, "train_len": L, "eval_len": n, "ppl": ppl,
            "loss": math.log(ppl) if ppl else None, "accuracy": acc, "tokens": 100, "passkey": passkey,
            "status": status, "note": None}


def records(sin8=50.0, rope8=40.0, alibi8=11.0, best_ext8=14.0):
    out = []
    for scheme, p8 in (("sinusoidal", sin8), ("rope", rope8), ("alibi", alibi8)):
        out += [rec(scheme, None, L, 10.0, 0.6), rec(scheme, None, 2 * L, (10 + p8) / 2, 0.4),
                rec(scheme, None, 8 * L, p8, 0.2)]
    out += [rec("rope", "yarn", L, 10.0), rec("rope", "yarn", 8 * L, best_ext8),
            rec("rope", "pi", L, 10.0), rec("rope", "pi", 8 * L, 30.0)]
    return out


def test_tables_render():
    md = R.markdown_tables(records())
    lines = md.splitlines()
    assert lines[0] == "| scheme / method | 16 (1L) | 32 (2L) | 128 (8L) |"
    assert "| sinusoidal | 10 / 60.0% | 30 / 40.0% | 50 / 20.0% |" in lines
    assert any(line.startswith("| rope+yarn | 10 / 50.0% |  | 14 / 50.0% |") for line in lines)
    assert "| alibi | 1.10 |  |" in md  # ratio table: 11 / 10 (no passkey column without passkey cells)
    assert "passkey" not in md
    assert "| rope+pi | 3.00 |" in md


def test_failed_cell_and_passkey():
    recs = [rec("rope", None, L, 10.0, passkey={"cells": [{"length": 32, "depth": 0.5, "accuracy": 1.0},
                                                            {"length": 64, "depth": 0.5, "accuracy": 0.0}]}),
            rec("rope", None, 8 * L, float("nan"), status="error: boom")]
    md = R.markdown_tables(recs)
    assert "error: boom" in md
    assert "50% (2 cells)" in md


@pytest.mark.parametrize("kw, expect", [
    ({}, ["PASS", "PASS", "PASS", "PASS"]),
    ({"sin8": 15.0, "alibi8": 13.0, "best_ext8": 16.0}, ["FAIL", "PASS", "FAIL", "FAIL"]),
    ({"rope8": 19.9}, ["PASS", "FAIL", "PASS", "PASS"]),
])
def test_shape_checks(kw, expect):
    lines = R.shape_checks(records(**kw))
    assert [line.split(":")[0] for line in lines] == expect
    assert "sinusoidal" in lines[0] and "RoPE" in lines[1] and "ALiBi" in lines[2]


def test_shape_checks_thresholds_and_skip():
    lines = R.shape_checks(records(sin8=20.0, alibi8=12.0, best_ext8=15.0))  # exactly on the thresholds
    assert [line.split(":")[0] for line in lines] == ["PASS", "PASS", "PASS", "PASS"]
    assert "yarn 1.50" in lines[3]
    lines = R.shape_checks([rec("alibi", None, L, 10.0)])
    assert [line.split(":")[0] for line in lines] == ["SKIP"] * 4
    failed = [r if r["eval_len"] != 8 * L else {**r, "status": "error"} for r in records()]
    assert R.shape_checks(failed)[0].startswith("SKIP")


def test_write_report(tmp_path):
    recs = records()
    recs[0]["passkey"] = [{"length": 32, "depth": 0.1, "accuracy": 1.0}, {"length": 32, "depth": 0.9,
                                                                         "accuracy": 0.0}]
    paths = R.write_report({"meta": {"preset": "hand"}, "records": recs}, tmp_path)
    for key in ("ppl_plot", "accuracy_plot", "passkey_plot", "markdown", "html"):
        assert paths[key].exists() and paths[key].stat().st_size > 0
    html = paths["html"].read_text()
    assert "data:image/png;base64," in html and "<table>" in html and "as expected: " in html
    md = paths["markdown"].read_text()
    assert "![ppl_vs_length](ppl_vs_length.png)" in md
    assert R.plot_passkey(records(), tmp_path / "none.png") is None
