"""One long context: a haystack with the needles of some task generators hidden in it, and the questions asked
after it, as token ids of the model's own tokenizer.

Layout (``length`` tokens in all)::

    [instruction line] [haystack text with needles at their depths ...] [target passage: `target` tokens]

then, for each query, ``"\\n" + question + " " + answer prefix`` (Landmark's layout; SmolLM2-135M answered the pass
key less often with a blank line before the question), not part of the context: the suite answers every query
from the one cached prefill of the context. For one ``seed`` the needles (keys, values, depths as
fractions) and the target passage are the same at every length; a longer context only holds more haystack.
A needle goes to the piece border of the haystack nearest to its depth (fraction of the text before the target).
:meth:`Context.check` verifies what the tasks promise: each gold string occurs in the context exactly as often as
in its own needles (so the haystack never answers for them), at the stated token spans.
"""

from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass

from posenc.tasks.haystack import Haystack
from posenc.tasks.ruler import GENERATORS, NEEDS_LENGTH, TASK_HEADERS, KeyPool

__all__ = ["Context", "ContextQuery", "PlacedNeedle", "build_context"]


@dataclass(frozen=True)
class PlacedNeedle:
    """A needle in the context: its text, kind and token span ``[start, end)``."""

    kind: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class ContextQuery:
    """A question about the context: its token ids (question + answer prefix), the gold strings, the chance
    level, the decode budget, and the needles (indices into :attr:`Context.needles`) that hold the answer."""

    kind: str
    ids: tuple[int, ...]
    golds: tuple[str, ...]
    chance: float
    max_new_tokens: int
    needles: tuple[int, ...]


@dataclass(frozen=True)
class Context:
    """Token ids of one context, its needles and its queries (see the module docstring); ``header``: tokens of
    the instruction line, ``haystack_tokens``: tokens of haystack text between it and the target passage."""

    haystack: str
    length: int
    seed: int
    ids: tuple[int, ...]
    target: int
    needles: tuple[PlacedNeedle, ...]
    queries: tuple[ContextQuery, ...]
    header: int = 0
    haystack_tokens: int = 0

    def depth(self, q: ContextQuery) -> float:
        """Mean relative position of the query's needles (0 = start of the context)."""
        return sum(self.needles[i].start for i in q.needles) / len(q.needles) / self.length

    def distance(self, q: ContextQuery) -> int:
        """Tokens from the query's farthest needle to the end of the context."""
        return self.length - min(self.needles[i].start for i in q.needles)

    def check(self, tokenizer) -> None:
        """``ValueError`` unless every needle span decodes to its text and every gold string occurs in the
        decoded context exactly as often as in the needles that hold its answer (the haystack holds none)."""
        for n in self.needles:
            got = tokenizer.decode(list(self.ids[n.start:n.end]))
            if got.strip() != n.text.strip():
                raise ValueError(f"needle span [{n.start}, {n.end}) decodes to {got!r}, not {n.text!r}")
        text = tokenizer.decode(list(self.ids))
        for q in self.queries:
            own = "".join(self.needles[i].text for i in q.needles)
            for g in q.golds:
                pat = re.compile(rf"(?<![A-Za-z0-9]){re.escape(g)}(?![A-Za-z0-9])")
                want, found = len(pat.findall(own)), len(pat.findall(text))
                if found != want:
                    raise ValueError(f"{q.kind}: {g!r} occurs {found} times in the context but {want} times in its "
                                     f"needles (the haystack must not hold an answer)")


def chat_frame(tokenizer) -> tuple[str, str]:
    """``(before, after)``: the text the tokenizer's chat template puts before and after one user message, the
    assistant's turn opened (``"", ""`` for a tokenizer without a chat template)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat=True needs a tokenizer with a chat template")
    mark = "\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                         add_generation_prompt=True)
    before, found, after = text.partition(mark)
    if not found:
        raise ValueError("the chat template does not keep the user message verbatim")
    return before, after


def _header(tokenizer, generators, chat: bool) -> list[int]:
    line = " ".join(TASK_HEADERS[g] for g in generators) + "\n"
    if chat:
        return _encode(tokenizer, chat_frame(tokenizer)[0] + line)
    return list(tokenizer(line)["input_ids"])  # the tokenizer's own document start (BOS where it adds one)


def _nearest(borders: list[int], x: float) -> int:
    """The border closest to ``x`` (``borders`` sorted)."""
    j = bisect.bisect_left(borders, x)
    return min(borders[max(0, j - 1):j + 1], key=lambda b: abs(b - x))


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _offsets(needles, needle_ids, n_before: int, room: int) -> list[float]:
    """Where each needle wants to go in the haystack text (an offset among its ``n_before`` tokens): ``depth`` x
    ``n_before``, or for a needle placed by distance back (:attr:`posenc.tasks.ruler.Needle.back`) the offset that
    makes it start ``back`` tokens before the end (``room``: the tokens after the header), counting the tokens of
    the needles that go before it."""
    where = [n.depth * n_before if n.back is None else 0.0 for n in needles]
    for i in sorted((i for i, n in enumerate(needles) if n.back is not None), key=lambda i: -needles[i].back):
        start = room - needles[i].back  # its first token, counted from the end of the header
        before = sum(len(needle_ids[j]) for j in range(len(needles))
                     if j != i and (where[j] < start if needles[j].back is None else needles[j].back > needles[i].back))
        where[i] = min(max(start - before, 0.0), float(n_before))
    return where


def build_context(tokenizer, haystack: Haystack, length: int, generators, seed: int = 0,
                  target: int = 0, chat: bool = False, options: dict | None = None, reach: int | None = None
                  ) -> Context:
    """The context of ``length`` tokens holding the needles of ``generators`` (names in
    :data:`posenc.tasks.ruler.GENERATORS`) in ``haystack``, ending with ``target`` scored tokens (book only).
    ``chat``: the context is the user message of the tokenizer's chat template, and each query closes it and
    opens the assistant's turn before the answer prefix (:func:`chat_frame`). ``options``: keyword parameters per
    generator name (``{"passkey": {"depth": 0.5}}``). ``reach``: a book haystack's longest context
    (:meth:`Haystack.window`)."""
    generators = tuple(generators)
    unknown = [g for g in generators if g not in GENERATORS]
    if unknown or not generators:
        raise ValueError(f"generators must be a non-empty subset of {sorted(GENERATORS)}, got {list(generators)}")
    rng = random.Random(f"{haystack.name}/{seed}")  # the same needles at every length
    pool = KeyPool(rng)
    needles, queries = [], []
    options = dict(options or {})
    stray = sorted(set(options) - set(generators))
    if stray:
        raise ValueError(f"options for generators that are not used: {stray}")
    for g in generators:
        try:
            ns, qs = GENERATORS[g](rng, pool, **options.get(g, {}), **({"length": length} if g in NEEDS_LENGTH
                                                                        else {}))
        except TypeError as exc:
            raise ValueError(f"generator {g!r} does not take options {sorted(options.get(g, {}))}: {exc}") from exc
        base = len(needles)
        needles += ns
        queries += [(q, tuple(base + i for i in q.needles)) for q in qs]
    header = _header(tokenizer, generators, chat)
    needle_ids = [_encode(tokenizer, n.text) for n in needles]
    n_before = length - len(header) - sum(map(len, needle_ids)) - target
    if n_before < 16 * len(needles):
        raise ValueError(f"length {length} is too short for {len(needles)} needles and a {target}-token target "
                         f"({n_before} haystack tokens left)")
    before, borders, passage = haystack.window(n_before, target, seed, reach)
    where = _offsets(needles, needle_ids, n_before, length - len(header))
    # needles in order of depth (a chain's links keep their order: their depths increase, borders are monotone)
    order = sorted(range(len(needles)), key=lambda i: (where[i], i))
    cuts = [_nearest(borders, where[i]) for i in order]
    ids = list(header)
    spans: dict[int, tuple[int, int]] = {}
    pos = 0
    for i, cut in zip(order, cuts):
        ids += before[pos:cut]
        pos = cut
        spans[i] = (len(ids), len(ids) + len(needle_ids[i]))
        ids += needle_ids[i]
    ids += before[pos:] + passage
    placed = tuple(PlacedNeedle(n.kind, n.text, *spans[i]) for i, n in enumerate(needles))
    close = chat_frame(tokenizer)[1] if chat else " "
    cq = tuple(ContextQuery(q.kind, tuple(_encode(tokenizer, f"\n{q.question}{close}{q.prefix}")), q.golds,
                            q.chance, q.max_new_tokens, idx) for q, idx in queries)
    return Context(haystack.name, length, seed, tuple(ids), target, placed, cq, len(header), n_before)
