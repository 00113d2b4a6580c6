"""A tiny user corpus on disk (deterministic words): the ``corpus`` fixture of tests/conftest.py and the tests that
write their own."""

from __future__ import annotations

import random
from pathlib import Path


def write_corpus(path: Path) -> Path:
    rng = random.Random(0)
    words = ("the quick brown fox jumps over a lazy dog while seven wise owls sing of rivers hills "
             "and old stone towers under a pale winter moon").split()
    lines = [" ".join(rng.choice(words) for _ in range(10)).capitalize() + "." for _ in range(300)]
    path.write_text("\n".join(lines) + "\n")
    return path
