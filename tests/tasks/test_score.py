"""posenc.tasks.score: exact match on hand-made examples, and the effective length."""

from posenc.tasks.score import answer_text, effective_length, score


# --------------------------------------------------------------- hand-made examples of the scoring and chance
def test_scoring_hand_made_examples():
    assert score(" 7135842. Remember it.", ["7135842"]) == (True, 1.0)
    assert score(" 71358420.", ["7135842"]) == (False, 0.0)  # inside a longer number: no
    assert score(" 1234567.\nThe special magic number for x is 7135842.", ["7135842"]) == (False, 0.0)  # 1st line
    assert score(":\n 1111111,\n 2222222\n\n 3333333", ["1111111", "2222222", "3333333"]) == (False, 2 / 3)
    assert score(" QWERT, ASDFG and ZXCVB.", ["ZXCVB", "QWERT", "ASDFG"]) == (True, 1.0)
    assert answer_text(" 12 and 34\nmore") == "12 and 34" and answer_text(":\n 56\nmore") == ":\n 56"
    assert effective_length({4096: 0.9, 8192: 0.8, 16384: 0.95}, 0.85) == 4096  # must hold at every length
    assert effective_length({4096: 0.5}, 0.85) is None
