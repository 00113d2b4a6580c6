"""Scoring of the long-context tasks: exact match of the gold strings in a greedy answer, and RULER's effective
context length.

:func:`score`: the answer is the generated text up to its first line break; it is correct when every gold
string occurs in it as a whole word (not inside a longer number or name), RULER's ``string_match_all``
(arXiv 2404.06654) made strict about word borders, so that "1234567" does not count inside "12345678".

:func:`effective_length`: RULER defines a model's effective length as the longest tested length whose score stays
at or above a threshold (for RULER, Llama-2-7B's score at 4k, 85.6%). The suite takes the threshold from the
model under test itself: ``fraction`` (default 0.85) of the untouched model's score at the reference length
(a length inside its trained context), and the method's score must hold at every tested length up to the
effective one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = ["answer_text", "effective_length", "score"]


def answer_text(generated: str, lines: bool = False) -> str:
    """The answer in a generated continuation: up to the first line break or sentence end (a period followed by
    white space or the end) that follows a letter or digit; with ``lines`` (answers with several values, which a
    model may list one per line) up to the first blank line after one instead."""
    pattern = r"[A-Za-z0-9][^\n]*?\n\s*\n" if lines else r"[A-Za-z0-9].*?(\n|\.(\s|$))"
    m = re.search(pattern, generated, flags=re.S if not lines else 0)
    if not m:
        return generated.strip()
    end = m.start() + re.search(r"\n|\.(\s|$)" if not lines else r"\n", generated[m.start():]).start()
    return generated[:end].strip()


def score(generated: str, golds: Sequence[str]) -> tuple[bool, float]:
    """``(correct, fraction)``: whether every gold string is in :func:`answer_text` (several lines when there
    are several golds) as a whole word, and the fraction that is."""
    if not golds:
        raise ValueError("golds must hold at least one string")
    text = answer_text(generated, lines=len(golds) > 1)
    hits = [bool(re.search(rf"(?<![A-Za-z0-9]){re.escape(g)}(?![A-Za-z0-9])", text)) for g in golds]
    return all(hits), sum(hits) / len(hits)


def effective_length(scores: Mapping[int, float], threshold: float) -> int | None:
    """The longest length ``n`` such that ``scores[m] >= threshold`` for every tested ``m <= n``; None when the
    shortest tested length is already below it."""
    best = None
    for n in sorted(scores):
        if scores[n] is None or scores[n] < threshold:
            break
        best = n
    return best
