"""Landmark Attention's pass-key text (Mohtashami and Jaggi 2023, arXiv 2305.16300), the one copy every task reads:
the filler sentences repeated around the key (:data:`FILLER`) and the sentence that hides the key
(:func:`key_sentence`)."""

from __future__ import annotations

__all__ = ["FILLER", "key_sentence"]

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def key_sentence(key) -> str:
    """``"The pass key is K. Remember it. K is the pass key."``"""
    return f"The pass key is {key}. Remember it. {key} is the pass key."
