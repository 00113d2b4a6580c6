"""posenc.evals.records: the one evaluation-row schema (EvalRecord) reads back every committed results file, and
the retrieval record's schema round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.evals.records import REQUIRED_KEYS, RETRIEVAL_KEYS, EvalRecord, RetrievalRecord


# ------------------------------------------------------------------------------------------ records
def test_retrieval_record_schema_round_trip():
    r = RetrievalRecord("recall", "rope", "yarn", 64, 256, 96, 0.75, 32, 1 / 32, params={"factor": 4.0},
                        extra={"note": "x"})
    d = r.to_dict()
    assert list(d)[:len(RETRIEVAL_KEYS)] == list(RETRIEVAL_KEYS)
    assert RetrievalRecord.from_dict(json.loads(json.dumps(d))).to_dict() == d
    for bad in ({"task": "qa"}, {"accuracy": 1.5}, {"distance": 256}, {"n": 0}):
        with pytest.raises(ValueError):
            RetrievalRecord(**{**{k: getattr(r, k) for k in RETRIEVAL_KEYS}, **bad})
    with pytest.raises(ValueError, match="lacks"):
        RetrievalRecord.from_dict({"task": "recall"})


# evaluation records (bench, suite, eval); a tune's results.json holds ranked candidate rows
# (tests/evals/tune/test_search.py)
RESULTS = sorted(p for p in (Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob("*/results.json")
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
    two probes, the passkey and the long-context suite's kinds, niah_keys: several labelled keys per noise prefill);
    a bench row's seed is an extra key."""
    from posenc.evals.records import RETRIEVAL_TASKS, RetrievalRecord

    assert RETRIEVAL_TASKS == ("recall", "kv_recall", "offset", "passkey", "niah_mk", "niah_keys", "niah_mq", "niah_mv",
                               "vt", "cwe")
    row = RetrievalRecord("kv_recall", "rope", "none", 64, 256, 48, 0.5, 32, 0.25, extra={"seed": 1}).to_dict()
    assert row["seed"] == 1 and RetrievalRecord.from_dict(row).extra == {"seed": 1}
