"""posenc.evals.report.evaluation: the ``posenc eval`` template has no empty columns and no checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

from posenc.evals.report import lab as R
from posenc.evals.report.evaluation import eval_table, write_eval_report

L = 64


def rec(method, n, ppl, scheme="rope", seed=None, status="ok"):
    r = {"scheme": scheme, "method": method, "train_len": L, "eval_len": n, "ppl": ppl, "loss": math.log(ppl),
         "accuracy": 0.4, "tokens": 100, "passkey": None, "status": status, "note": ""}
    return r if seed is None else {**r, "seed": seed}


def test_eval_template_has_no_empty_columns_and_no_checks(tmp_path):
    records = [dict(rec(m, n, p, scheme="llama"), train_len=None) for m in ("none", "yarn")
               for n, p in ((16, 9.0), (32, 10.0))]
    records += [dict(rec(m, 64, 1.0, scheme="llama"), train_len=None, ppl=None, loss=None, accuracy=None,
                     status="error", note="") for m in ("none", "yarn")]
    results = {"meta": {"command": "posenc eval", "source": "llama-tiny", "lengths": [16, 32, 64],
                        "machine": {"cpu_count": 2}}, "records": records}
    table, dropped = eval_table(records)
    assert dropped == [64]
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert head == ["scheme / method", "16", "32"]  # no L, ratio, passkey, notes or 64 column: nothing in them
    body = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert [b[0] for b in body] == ["llama", "llama+yarn"]
    assert all(any(row[i] not in ("", "-") for row in body) for i in range(len(head)))
    paths = write_eval_report(results, tmp_path)
    md, html = paths["markdown"].read_text(), paths["html"].read_text().split("<body>")[1]
    assert md.startswith("# posenc eval: llama-tiny")
    for absent in ("Checks", "expected", "PASS", "FAIL", "SKIP", "Which methods", "headline"):
        assert absent not in md and absent not in html
    assert "No row succeeded at 64 tokens" in md and "<details>" in html and "ppl_plot" in paths
    assert R.main([str(_dump(tmp_path, results))]) == 2  # the bench renderer refuses an eval's results


def _dump(folder: Path, results: dict) -> Path:
    path = folder / "eval-results.json"
    path.write_text(json.dumps(results))
    return path
