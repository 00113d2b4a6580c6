"""posenc.evals.suite.verdict: the interval rule on hand-made records, "undecided" included."""

import pytest

from posenc.evals.stats.intervals import wilson
from posenc.evals.suite import verdict as v

L = 8192


def iv(k, n):
    i = wilson(k, n)
    return {"k": k, "n": n, "value": i.value, "lo": i.lo, "hi": i.hi}


def ratio(value, lo, hi, n=4):
    return {"value": value, "lo": lo, "hi": hi, "n": n}


REF = iv(20, 24)  # lower end 0.64


def test_retrieval_kept_lost_and_undecided_against_the_reference_interval():
    assert REF["lo"] == pytest.approx(0.6406, abs=1e-3)
    assert v.retrieval_status(iv(22, 24), REF) == v.KEPT  # [0.74, 0.98]: wholly at or above 0.64
    assert v.retrieval_status(iv(20, 24), REF) == v.KEPT  # the reference's own interval
    assert v.retrieval_status(iv(18, 24), REF) == v.UNDECIDED  # [0.55, 0.88] spans 0.64
    assert v.retrieval_status(iv(12, 24), REF) == v.UNDECIDED  # [0.31, 0.69] still reaches it
    assert v.retrieval_status(iv(10, 24), REF) == v.LOST  # [0.24, 0.61]: wholly below
    assert v.retrieval_status(iv(1, 1), REF) == v.UNDECIDED  # one key: [0.21, 1]
    assert v.retrieval_status({"n": 0}, REF) == v.UNDECIDED


def test_perplexity_ratio_against_the_bound():
    assert v.ppl_status(ratio(1.05, 0.98, 1.12), 1.25) == v.KEPT
    assert v.ppl_status(ratio(1.6, 1.3, 1.9), 1.25) == v.LOST
    assert v.ppl_status(ratio(1.2, 1.1, 1.4), 1.25) == v.UNDECIDED
    assert v.ppl_status(ratio(1.0, None, None, n=1), 1.25) == v.UNDECIDED  # one passage: no interval
    assert v.ppl_status(None, 1.25) is None


def test_at_one_length():
    assert v.at_length(v.KEPT, v.KEPT) == v.EXTENDS and v.at_length(v.KEPT, None) == v.EXTENDS
    assert v.at_length(v.LOST, v.KEPT) == v.KEEPS_PPL and v.at_length(v.LOST, v.LOST) == v.NEITHER
    assert v.at_length(v.KEPT, v.LOST) == v.NEITHER
    assert v.at_length(v.UNDECIDED, v.KEPT) == v.UNDECIDED and v.at_length(v.KEPT, v.UNDECIDED) == v.UNDECIDED
    assert v.at_length(v.LOST, v.UNDECIDED) == v.UNDECIDED


def _rows(*cells):
    return {n: {"retrieval": iv(k, 24), "ppl_ratio": r} for n, k, r in cells}


OK = ratio(1.02, 0.99, 1.05)


def test_judge_hand_made_rows():
    ext = v.judge(_rows((L, 21, OK), (2 * L, 22, OK), (4 * L, 21, OK)), REF, L, 1.25)
    assert ext["verdict"] == "extends to 32768" and ext["effective_length"] == 4 * L and ext["undecided_at"] is None
    # extends at 2L, spans the threshold at 4L: extends to 2L, undecided at 4L
    cut = v.judge(_rows((L, 21, OK), (2 * L, 22, OK), (4 * L, 16, OK)), REF, L, 1.25)
    assert cut["verdict"] == "extends to 16384" and cut["undecided_at"] == 4 * L
    # spanning at the first length past L: undecided, not "extends"
    und = v.judge(_rows((L, 21, OK), (2 * L, 17, OK)), REF, L, 1.25)
    assert und["verdict"] == v.UNDECIDED and und["extends_to"] is None and und["effective_length"] == L
    window = v.judge(_rows((L, 21, OK), (2 * L, 3, OK)), REF, L, 1.25)
    assert window["verdict"] == v.KEEPS_PPL
    broken = v.judge(_rows((L, 21, OK), (2 * L, 3, ratio(3.0, 2.5, 3.6))), REF, L, 1.25)
    assert broken["verdict"] == v.NEITHER and broken["effective_length"] == L
    short = v.judge(_rows((L // 2, 24, OK), (L, 21, OK)), REF, L, 1.25)
    assert short["verdict"] == "not run past L" and short["effective_length"] == L


def test_the_rule_is_stated_with_its_bound_and_how_ruler_differs():
    text = v.rule_text(1.25)
    assert "1.25" in text and "85.6%" in text and "undecided" in text
