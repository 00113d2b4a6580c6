"""posenc.evals.records.EvalRecord: the one evaluation-row schema reads back every committed results file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.evals.records import REQUIRED_KEYS, EvalRecord

# evaluation records (bench, suite, eval); a tune's results.json holds ranked candidate rows (tests/test_tune.py)
RESULTS = sorted(p for p in (Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("*/results.json")
                 if not p.parent.name.startswith("tune-"))


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


def test_retrieval_tasks_are_the_contract():
    """The report renders these task names (posenc.tasks.recall's content-copy control, posenc.tasks.kv_recall's
    two probes, the passkey and the long-context suite's kinds); a bench row's seed is an extra key."""
    from posenc.evals.records import RETRIEVAL_TASKS, RetrievalRecord

    assert RETRIEVAL_TASKS == ("recall", "kv_recall", "offset", "passkey", "niah_mk", "niah_mq", "niah_mv", "vt", "cwe")
    row = RetrievalRecord("kv_recall", "rope", "none", 64, 256, 48, 0.5, 32, 0.25, extra={"seed": 1}).to_dict()
    assert row["seed"] == 1 and RetrievalRecord.from_dict(row).extra == {"seed": 1}
