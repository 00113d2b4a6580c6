"""The synthetic long-context tasks, in the spirit of RULER (Hsieh et al. 2024, arXiv 2404.06654).

A *task generator* (:data:`GENERATORS`) draws, from a seeded ``random.Random``, the needles it hides in a
haystack (:class:`Needle`: a sentence and the depth it wants) and the questions asked after the context
(:class:`Query`). Every query is scored by exact match on greedy decoding (:func:`posenc.tasks.score.score`):
the answer counts when every gold string appears as a whole word in the generated answer. ``chance`` is the
accuracy of a model that finds the needles of the right *kind* by their content but picks among them at
random (the content-copy baseline; a blind guess of a 7-digit number is ~0).

The query kinds (RULER's names in brackets):

- ``passkey``: one pass key in the haystack, Landmark's format (arXiv 2305.16300) [niah_single];
- ``niah_mk``: four needles "One of the special magic numbers for <key> is: <value>." with distinct keys, each
  asked for in turn; the other three are its distractors [niah_multikey_1];
- ``niah_mq``: two of those keys asked for at once, both values required [niah_multiquery];
- ``niah_mv``: two keys with four values each (eight needles), all four values of a key required
  [niah_multivalue, with a distractor key];
- ``vt``: two chains "VAR A = 12345." -> "VAR B = VAR A." -> ... (five variables each), asked for every variable
  holding a chain's value [vt];
- ``niah_keys``: ``K`` needles of the multi-key sentence with distinct keys, each asked for in turn (the others
  are its distractors), placed by their *distance back from the end* in distance bins (near, middle, far, in
  tokens, :func:`keys`), the same bins at every length: several trials per prefill, spread over the distances
  where extension methods differ [niah_multikey_1, in Landmark's noise];
- ``cwe``: "The word of the day is <w>." lines, three words four times each and six words once; the three
  frequent ones are asked for (RULER's common-word extraction, spread through the haystack so that it is
  answered from the whole context) [cwe].

Within one context every key, value, variable name and word is distinct (the generators draw without
replacement from one :class:`KeyPool`), and no haystack sentence contains them (checked by the context builder).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from posenc.tasks.landmark import key_sentence
from posenc.tasks.words import ADJECTIVES, NOUNS

__all__ = ["GENERATORS", "KeyPool", "NEEDS_LENGTH", "Needle", "QUERY_KINDS", "Query", "RETRIEVAL_KINDS", "TASK_HEADERS",
           "bin_of", "key_bins", "keys"]

QUERY_KINDS = ("passkey", "niah_mk", "niah_keys", "niah_mq", "niah_mv", "vt", "cwe")
RETRIEVAL_KINDS = ("passkey", "niah_mk", "niah_keys", "niah_mq", "niah_mv")
"""The kinds that find a needle (the suite's retrieval score and effective length); vt traces, cwe aggregates."""


@dataclass(frozen=True)
class Needle:
    """One sentence to hide: ``text`` (starts with a space), at ``depth`` in [0, 1) of the needle region;
    ``after`` is the index (in the same generator's list) of a needle it must follow (a chain's previous link);
    ``back``: where it wants to start instead, in tokens before the end of the context (``depth`` is then unused)."""

    text: str
    depth: float
    kind: str
    after: int | None = None
    back: int | None = None


@dataclass(frozen=True)
class Query:
    """One question: ``question`` then the answer ``prefix`` the model continues; correct when every string
    of ``golds`` is in the answer. ``needles``: indices (in the generator's list) of the needles that hold it."""

    kind: str
    question: str
    prefix: str
    golds: tuple[str, ...]
    chance: float
    max_new_tokens: int
    needles: tuple[int, ...]


class KeyPool:
    """Distinct keys (``adjective-noun``), numbers of a given digit count, variable names and words for one
    context: nothing is drawn twice."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _fresh(self, draw: Callable[[], str]) -> str:
        for _ in range(10_000):
            x = draw()
            if x not in self.used:
                self.used.add(x)
                return x
        raise ValueError("the key pool ran out of distinct values")

    def key(self) -> str:
        return self._fresh(lambda: f"{self.rng.choice(ADJECTIVES)}-{self.rng.choice(NOUNS)}")

    def number(self, digits: int) -> str:
        return self._fresh(lambda: str(self.rng.randrange(10 ** (digits - 1), 10 ** digits)))

    def name(self) -> str:
        return self._fresh(lambda: "".join(self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)))

    def word(self) -> str:
        return self._fresh(lambda: self.rng.choice(NOUNS))


def _spread(rng: random.Random, n: int) -> list[float]:
    """``n`` depths, one in each of ``n`` equal bins (jittered inside the middle 70% of the bin)."""
    return [(j + rng.uniform(0.15, 0.85)) / n for j in range(n)]


_MAGIC = " One of the special magic numbers for {key} is: {value}."


def niah(rng: random.Random, pool: KeyPool, n_keys: int = 4):
    """Multi-key and multi-query needles: ``n_keys`` keys with one 7-digit value each (RULER's niah_multikey_1
    holds four: the target and three distractors). Each key is asked for alone, then pairs of keys at once.
    Chance: a random pick among the ``n_keys`` magic numbers (one, or a pair)."""
    keys = [pool.key() for _ in range(n_keys)]
    values = [pool.number(7) for _ in keys]
    depths = _spread(rng, n_keys)
    needles = [Needle(_MAGIC.format(key=k, value=v), d, "niah_mk") for k, v, d in zip(keys, values, depths)]
    queries = [Query("niah_mk", f"What is the special magic number for {k} mentioned in the provided text?",
                     f"The special magic number for {k} mentioned in the provided text is", (v,), 1 / n_keys, 10,
                     (i,)) for i, (k, v) in enumerate(zip(keys, values))]
    for i in range(0, n_keys - 1, 2):
        (a, b), (va, vb) = keys[i:i + 2], values[i:i + 2]
        queries.append(Query("niah_mq", f"What are the special magic numbers for {a} and {b} mentioned in the provided "
                             "text?", f"The special magic numbers for {a} and {b} mentioned in the provided text are",
                             (va, vb), 1 / math.comb(n_keys, 2), 24, (i, i + 1)))
    return needles, queries


def key_bins(train_len: int) -> tuple[tuple[int, int], ...]:
    """The distance bins (tokens back from the end, ``[lo, hi)``) of a model trained at ``train_len`` = ``L``:
    near ``[L/32, L/4)`` (256-2k for an 8k model: inside any window a method keeps), middle ``[L/4, L)`` (still
    within the trained length) and far ``[L, 4L)`` (past it: only a context longer than ``L`` holds one)."""
    return ((train_len // 32, train_len // 4), (train_len // 4, train_len), (train_len, 4 * train_len))


def keys(rng: random.Random, pool: KeyPool, n_keys: int = 8, bins=((256, 2048), (2048, 8192), (8192, 32768)),
         length: int = 0):
    """``n_keys`` multi-key needles with distinct keys and 7-digit values, each asked for alone, placed by distance
    back (:attr:`Needle.back`): key ``j`` goes to the ``(j + r) % b``-th of the ``b`` bins that fit a ``length``-token
    context (a bin fits when its lower edge is below 80% of ``length``; its upper edge is cut to 95% of it), at a
    fraction drawn uniformly in [0.1, 0.9] of the bin (``r``: a rotation drawn once per context, so that contexts
    of fewer keys than bins still cover every bin). The keys, values and fractions are the same at every length
    (one draw each, whatever fits); only which bins exist depends on the length. Chance: a random pick among the
    ``n_keys`` magic numbers."""
    if n_keys < 1:
        raise ValueError(f"n_keys must be >= 1, got {n_keys}")
    bins = [(int(lo), int(hi)) for lo, hi in bins]
    if not bins or any(not 0 < lo < hi for lo, hi in bins):
        raise ValueError(f"bins must be non-empty [lo, hi) token ranges with 0 < lo < hi, got {bins}")
    names = [pool.key() for _ in range(n_keys)]
    values = [pool.number(7) for _ in names]
    fractions = [rng.uniform(0.1, 0.9) for _ in names]
    rotation = rng.randrange(len(bins) * 2 * 3)  # a multiple of 1, 2 and 3 bins: every rotation as likely
    fit = [(lo, min(hi, int(0.95 * length))) for lo, hi in bins if lo < 0.8 * length]
    if not fit:
        raise ValueError(f"length {length} is too short for every distance bin {bins}")
    needles = []
    for j, (k, v, u) in enumerate(zip(names, values, fractions)):
        lo, hi = fit[(j + rotation) % len(fit)]
        needles.append(Needle(_MAGIC.format(key=k, value=v), 0.0, "niah_keys", back=round(lo + u * (hi - lo))))
    queries = [Query("niah_keys", f"What is the special magic number for {k} mentioned in the provided text?",
                     f"The special magic number for {k} mentioned in the provided text is", (v,), 1 / n_keys, 10,
                     (i,)) for i, (k, v) in enumerate(zip(names, values))]
    return needles, queries


def bin_of(distance: int, bins) -> int | None:
    """The index of the bin ``[lo, hi)`` of ``bins`` holding ``distance`` (None: none does)."""
    return next((i for i, (lo, hi) in enumerate(bins) if lo <= distance < hi), None)


def mv(rng: random.Random, pool: KeyPool, n_keys: int = 2, n_values: int = 4):
    """Multi-value needles: ``n_keys`` keys with ``n_values`` values each, every needle in its own depth bin; each
    key is asked for all its values. Chance: the right ``n_values`` among all ``n_keys * n_values`` numbers."""
    needles: list[Needle] = []
    queries = []
    keys = [pool.key() for _ in range(n_keys)]
    values = [[pool.number(7) for _ in range(n_values)] for _ in keys]
    depths = _spread(rng, n_keys * n_values)
    rng.shuffle(depths)
    for j, (k, vs) in enumerate(zip(keys, values)):
        first = len(needles)
        needles += [Needle(_MAGIC.format(key=k, value=v), depths[j * n_values + i], "niah_mv")
                    for i, v in enumerate(vs)]
        queries.append(Query("niah_mv", f"What are all the special magic numbers for {k} mentioned in the provided "
                             "text?", f"The special magic numbers for {k} mentioned in the provided text are",
                             tuple(vs), 1 / math.comb(n_keys * n_values, n_values), 48,
                             tuple(range(first, len(needles)))))
    return needles, queries


def passkey(rng: random.Random, pool: KeyPool, depth: float | None = None):
    """One 5-digit pass key (Landmark's sentence) at ``depth`` (default: uniform random in [0.02, 0.98])."""
    key = pool.number(5)
    where = rng.uniform(0.02, 0.98)
    if depth is not None:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"passkey depth must be in [0, 1], got {depth!r}")
        where = float(depth)
    needle = Needle(" " + key_sentence(key), where, "passkey")
    return [needle], [Query("passkey", "What is the pass key?", "The pass key is", (key,), 0.0, 8, (0,))]


def vt(rng: random.Random, pool: KeyPool, chains: int = 2, hops: int = 4):
    """``chains`` variable chains of ``hops + 1`` variables, their links at increasing random depths. Chance:
    the right ``hops + 1`` names among all ``chains * (hops + 1)``."""
    needles: list[Needle] = []
    queries = []
    n_names = chains * (hops + 1)
    for _ in range(chains):
        value = pool.number(5)
        names = [pool.name() for _ in range(hops + 1)]
        depths = sorted(rng.uniform(0.02, 0.98) for _ in names)
        first = len(needles)
        needles.append(Needle(f" VAR {names[0]} = {value}.", depths[0], "vt"))
        for j in range(1, hops + 1):
            needles.append(Needle(f" VAR {names[j]} = VAR {names[j - 1]}.", depths[j], "vt", after=len(needles) - 1))
        queries.append(Query("vt", f"Find all variables that are assigned the value {value} in the text above.",
                             f"Answer: According to the chain of variable assignment in the text above, {hops + 1} "
                             f"variables are assigned the value {value}, they are:", tuple(names),
                             1 / math.comb(n_names, hops + 1), 40, tuple(range(first, len(needles)))))
    return needles, queries


def cwe(rng: random.Random, pool: KeyPool, n_common: int = 3, repeats: int = 4, n_rare: int = 6):
    """Words of the day: ``n_common`` words ``repeats`` times each and ``n_rare`` words once, at random depths;
    the ``n_common`` frequent ones are asked for. Chance: the right ``n_common`` among all the words."""
    common = [pool.word() for _ in range(n_common)]
    rare = [pool.word() for _ in range(n_rare)]
    words = [w for w in common for _ in range(repeats)] + rare
    needles = [Needle(f" The word of the day is {w}.", rng.uniform(0.02, 0.98), "cwe") for w in words]
    query = Query("cwe", f"Which {n_common} words were most often the word of the day in the text above?",
                  f"Answer: The {n_common} most frequent words of the day are:", tuple(common),
                  1 / math.comb(n_common + n_rare, n_common), 24, tuple(range(n_common * repeats)))
    return needles, [query]


GENERATORS: dict[str, Callable] = {"niah": niah, "keys": keys, "mv": mv, "passkey": passkey, "vt": vt, "cwe": cwe}
"""Task generators: ``fn(rng, pool, **options) -> (needles, queries)`` (options: the keyword parameters above)."""

NEEDS_LENGTH = frozenset({"keys"})
"""Generators the context builder also passes the context's ``length`` (they place needles by distance back)."""

TASK_HEADERS = {
    "niah": "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
            "I will quiz you about the numbers afterwards.",
    "keys": "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
            "I will quiz you about the numbers afterwards.",
    "mv": "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
          "I will quiz you about the numbers afterwards.",
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there.",  # Landmark's instruction, as it is
    "vt": "Memorize and track the chains of variable assignment hidden in the following text.",
    "cwe": "Some words of the day are hidden in the following text. Memorize the ones that appear most often.",
}
"""The instruction sentence each generator adds to the context's first line."""
