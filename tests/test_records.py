"""posenc.lab.records.EvalRecord: the one evaluation-row schema reads back every committed results file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.lab.records import REQUIRED_KEYS, EvalRecord

RESULTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("*/results.json"))


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_committed_results_round_trip(path):
    rows = json.loads(path.read_text())["records"]
    assert rows
    for row in rows:
        assert EvalRecord.from_dict(row).to_dict() == row


def test_to_dict_keys_params_and_extra():
    rec = EvalRecord(scheme="rope", method="none", train_len=16, eval_len=32)
    assert tuple(rec.to_dict()) == REQUIRED_KEYS  # no params: left out (Hugging Face rows)
    row = rec.replace(params={"factor": 2.0}, extra={"split": "test"}).to_dict()
    assert list(row)[:3] == ["scheme", "method", "params"] and row["split"] == "test"
    assert EvalRecord.from_dict(row).extra == {"split": "test"}
    assert EvalRecord.from_dict({"scheme": "rope"}).to_dict() == dict.fromkeys(REQUIRED_KEYS) | {"scheme": "rope"}
