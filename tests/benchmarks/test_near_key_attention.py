"""benchmarks/near_key_attention.py: its summary (keys by distance bin, retrieval heads, masses found against lost)
is what its committed questions give, and the reductions are right on a hand-made case."""

from __future__ import annotations

import json

from benchmarks.common import RESULTS
from benchmarks.near_key_attention import retrieval_heads, summary


def _q(row, distance, correct, answer):
    zero = [[0.0, 0.0], [0.0, 0.0]]
    return {"row": row, "distance": distance, "correct": correct,
            "mass": {"answer": answer, "needle": zero, "start": zero, "haystack": zero, "remapped": zero}}


def test_the_summary_by_hand():
    qs = [_q("a", 300, True, [[0.0, 0.9], [0.1, 0.0]]), _q("a", 1000, False, [[0.0, 0.2], [0.5, 0.0]]),
          _q("b", 5000, True, [[0.0, 0.7], [0.3, 0.0]])]
    assert retrieval_heads(qs, 2) == [(0, 1), (1, 0)]  # mean over the right answers: 0.8 and 0.2
    s = summary(qs)
    a = s["rows"]["a"]
    assert (a["k"], a["n"]) == (1, 2) and [(b["lo"], b["k"], b["n"]) for b in a["bins"]] == [(256, 1, 1), (768, 0, 1)]
    assert a["heads"]["L0H1"]["right"]["answer"] == 0.9 and a["heads"]["L0H1"]["wrong"]["answer"] == 0.2


def test_the_committed_summary_is_its_questions():
    data = json.loads((RESULTS / "near_key_attention.json").read_text())
    assert data["summary"] == json.loads(json.dumps(summary(data["questions"])))
    rows = data["summary"]["rows"]
    assert rows["none@8192"]["n"] >= 24 and rows["none@4096"]["k"] == rows["none@4096"]["n"]
