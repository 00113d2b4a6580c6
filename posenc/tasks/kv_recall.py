"""Retrieval that needs key matching and position: multi-key recall (``kv_recall``) and its offset twin.

The single-needle probe of :mod:`posenc.tasks.recall` (``pairs=1``) writes the only value byte of the window,
so a model can answer it by *content*: copy the one value it sees, wherever it is (NoPE does, at any length).
This probe cannot be answered that way.

A *definition* is three adjacent tokens ``v2 v1 k`` written over the text: two values and a key ``k`` (the
values come first, so the key's earlier occurrence carries them: layout ``"before"``; ``"after"``, ``k v1 v2``,
is the induction-head layout, measured slower to learn). Each window holds ``pairs`` definitions with distinct
keys, and every value of the window is distinct (``2 * pairs`` values, all from the same range). A query is one
token:

- ``kv_recall``: the key ``k`` again; the answer is ``v1``, the token right next to ``k``'s definition. A model
  that copies a value by content, without matching the key, picks one of the ``2 * pairs`` values of the
  window: chance ``1 / (2 * pairs)`` (:func:`content_copy_accuracy` measures it).
- ``offset``: the key's twin ``k' = k + n_keys`` (a second id range, "the token ``offset`` from ``k``");
  the answer is ``v2``, the token ``offset = 2`` positions from the key. Matching the key is not enough:
  ``v1`` and ``v2`` sit next to the same key, only their distance from it tells them apart, so a model that
  matches keys but not offsets scores at most 1/2 and one that copies the nearest value of the key scores 0.

Training (:func:`kv_batch`): each row is a text window with ``pairs`` definitions and both queries of every
key at random places after its definition, so key-to-query distances cover ``1 .. seq_len``; the
targets are the queries' answers only. Probe (:func:`kv_probe`): at length ``n`` and distance ``d`` the last
input is the query, its key sits exactly ``d`` tokens earlier (``x[n-1-d] == key``), and
``pairs - 1`` distractor definitions (and their queries) lie at random places. Draws depend only on
``(seed, step)`` and ``(seed, task, n, d)``.

Key ids ``160..175`` (twins ``176..191``) and values ``128..159`` are bytes the Gutenberg corpus does not use.
The sizes were chosen by short trainings until plain RoPE learns both tasks at ``L`` in the quick preset's
budget (the measurements are in ``benchmarks/results/kv_recall_design.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posenc._util import check_positive_int
from posenc.tasks.recall import IGNORE, IdRanges, RecallProbe

__all__ = ["KV_TASKS", "KVSpec", "content_copy_accuracy", "distance_range", "kv_batch", "kv_probe"]

KV_TASKS = ("kv_recall", "offset")
OFFSET = 2  # the offset task's answer is the token OFFSET positions from the key (v2)
DEF_LEN = OFFSET + 1
LAYOUTS = ("before", "after")  # a definition: "v2 v1 k" (values before the key) or "k v1 v2"


@dataclass(frozen=True)
class KVSpec(IdRanges):
    """Id ranges ``[lo, hi)``: ``keys`` (their twins, the offset queries, are the next ``n_keys`` ids) and
    ``values``; ``pairs`` definitions per window (``2 * pairs <= n_values``, ``pairs <= n_keys``)."""

    keys: tuple[int, int] = (160, 176)
    values: tuple[int, int] = (128, 160)
    pairs: int = 4
    layout: str = "before"

    def __post_init__(self):
        for name in ("keys", "values"):
            lo, hi = getattr(self, name)
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi):
                raise ValueError(f"KVSpec.{name} must be an id range (lo, hi) with 0 <= lo < hi, got {(lo, hi)}")
        tw = self.twins
        for a, b in ((self.keys, self.values), (tw, self.values)):
            if a[0] < b[1] and b[0] < a[1]:
                raise ValueError(f"KVSpec id ranges overlap: keys {self.keys}, twins {tw}, values {self.values}")
        check_positive_int("KVSpec.pairs", self.pairs)
        if self.layout not in LAYOUTS:
            raise ValueError(f"KVSpec.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.pairs > self.n_keys or 2 * self.pairs > self.n_values:
            raise ValueError(f"KVSpec.pairs ({self.pairs}) needs <= {self.n_keys} keys and 2 x pairs <= "
                             f"{self.n_values} values")

    @property
    def twins(self) -> tuple[int, int]:
        """The offset queries' ids: key ``k``'s twin is ``k + n_keys``."""
        return self.keys[1], self.keys[1] + self.n_keys

    def key_at(self, start: int) -> int:
        """Position of the key in a definition starting at ``start``; ``v1`` / ``v2`` are 1 / 2 from it,
        away from the query's side for ``"before"`` (``v2 v1 k``), towards it for ``"after"`` (``k v1 v2``)."""
        return start + (DEF_LEN - 1 if self.layout == "before" else 0)

    def value_at(self, key_pos: int, which: int) -> int:
        """Position of ``v1`` (``which = 1``) or ``v2`` (``which = 2``) of the key at ``key_pos``."""
        return key_pos - which if self.layout == "before" else key_pos + which

    @property
    def chance(self) -> float:
        """Accuracy of copying one of the window's ``2 * pairs`` values by content, without the key."""
        return 1.0 / (2 * self.pairs)

    def ids(self) -> np.ndarray:
        """Every id the task writes (keys, twins, values)."""
        return np.concatenate([np.arange(self.keys[0], self.twins[1]), np.arange(*self.values)])


def _draw(rng: np.random.Generator, spec: KVSpec) -> tuple[np.ndarray, np.ndarray]:
    """``pairs`` distinct keys and ``[pairs, 2]`` values, all distinct."""
    keys = spec.keys[0] + rng.permutation(spec.n_keys)[:spec.pairs]
    values = spec.values[0] + rng.permutation(spec.n_values)[:2 * spec.pairs].reshape(spec.pairs, 2)
    return keys, values


def _free(occupied: np.ndarray, lo: int, hi: int, width: int) -> np.ndarray:
    """Starts ``p`` in ``[lo, hi)`` with ``p .. p + width - 1`` free."""
    p = np.arange(lo, max(lo, hi))
    ok = np.ones(len(p), dtype=bool)
    for i in range(width):
        ok &= ~occupied[p + i]
    return p[ok]


def _write(seq, spec: KVSpec, start: int, key: int, v1: int, v2: int) -> int:
    """Write a definition at ``[start, start + DEF_LEN)``; returns the key's position."""
    k = spec.key_at(start)
    seq[k], seq[spec.value_at(k, 1)], seq[spec.value_at(k, 2)] = key, v1, v2
    return k


def _define(seq, occupied, rng, spec: KVSpec, key: int, vals, hi: int, n_queries: int,
            q_hi: int) -> list[int] | None:
    """Write a definition of ``key`` with ``vals = (v1, v2)`` at a random free slot starting below ``hi`` and
    pick ``n_queries`` free query slots after it, below ``q_hi``; returns ``[key position, query...]``, or None
    (nothing written) without room."""
    free = _free(occupied, 0, hi, DEF_LEN)
    after = np.concatenate([np.cumsum((~occupied[:q_hi])[::-1])[::-1], [0]])  # free single slots in [p, q_hi)
    free = free[(free + DEF_LEN <= q_hi) & (after[np.minimum(free + DEF_LEN, q_hi)] >= n_queries)]
    if len(free) == 0:
        return None
    a = int(rng.choice(free))
    qs = _free(occupied, a + DEF_LEN, q_hi, 1)
    qs = rng.choice(qs, size=n_queries, replace=False).tolist()
    k = _write(seq, spec, a, key, *vals)
    occupied[a:a + DEF_LEN] = True
    occupied[qs] = True
    return [k, *qs]


def kv_batch(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int,
             spec: KVSpec = KVSpec()) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batch ``step``: ``x [batch_size, seq_len]`` text windows with ``spec.pairs`` definitions and
    both queries of each key written in; ``y`` is :data:`~posenc.tasks.recall.IGNORE` except at the queries
    (``v1`` after the key, ``v2`` after its twin). Depends only on ``(seed, step)``."""
    batch_size = check_positive_int("batch_size", batch_size)
    seq_len = check_positive_int("seq_len", seq_len, minimum=8)
    if (DEF_LEN + 2) * spec.pairs > seq_len // 2:
        raise ValueError(f"{spec.pairs} definitions with their queries do not fit seq_len {seq_len}")
    if len(tokens) < seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds the {len(tokens)} tokens available")
    rng = np.random.default_rng([int(seed), int(step), 0x4B5])
    twin = spec.twins[0] - spec.keys[0]
    xs, ys = [], []
    for start in rng.integers(0, len(tokens) - seq_len + 1, size=batch_size).tolist():
        seq = np.asarray(tokens[start:start + seq_len], dtype=np.int64).copy()
        occupied = np.zeros(seq_len + DEF_LEN, dtype=bool)
        occupied[seq_len:] = True
        y = np.full(seq_len, IGNORE, dtype=np.int64)
        keys, values = _draw(rng, spec)
        for k, (v1, v2) in zip(keys.tolist(), values.tolist()):
            placed = _define(seq, occupied, rng, spec, k, [v1, v2], seq_len - 2, 2, seq_len)
            if placed is None:
                continue
            _, q1, q2 = placed
            seq[q1], y[q1] = k, v1
            seq[q2], y[q2] = k + twin, v2
        xs.append(seq)
        ys.append(y)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def kv_probe(tokens: np.ndarray, task: str, length: int, distance: int, n_trials: int, seed: int = 0,
             spec: KVSpec = KVSpec()) -> RecallProbe:
    """``n_trials`` probe sequences of ``length`` tokens for ``task`` (:data:`KV_TASKS`) whose final query's
    key is exactly ``distance`` tokens back (``x[length - 1 - distance]``; ``1 <= distance <= length - DEF_LEN``
    for ``"before"``, ``DEF_LEN <= distance <= length - 1`` for ``"after"``); the answers are ``v1``
    (``kv_recall``) or ``v2`` (``offset``). Text windows come from ``tokens`` (the test split)."""
    if task not in KV_TASKS:
        raise ValueError(f"task must be one of {KV_TASKS}, got {task!r}")
    length = check_positive_int("length", length, minimum=8)
    distance = check_positive_int("distance", distance)
    n_trials = check_positive_int("n_trials", n_trials)
    lo, hi = distance_range(length, spec)
    if not lo <= distance <= hi:
        raise ValueError(f"distance must be in [{lo}, {hi}] at length {length}, got {distance}")
    if len(tokens) < length:
        raise ValueError(f"length {length} exceeds the {len(tokens)} tokens available")
    rng = np.random.default_rng([int(seed), KV_TASKS.index(task), length, distance, 0x0FF])
    twin = spec.twins[0] - spec.keys[0]
    inputs, answers = [], []
    for start in rng.integers(0, len(tokens) - length + 1, size=n_trials).tolist():
        seq = np.asarray(tokens[start:start + length], dtype=np.int64).copy()
        occupied = np.zeros(length + DEF_LEN, dtype=bool)
        occupied[length - 1:] = True  # the query
        keys, values = _draw(rng, spec)
        a = length - 1 - distance - (spec.key_at(0))  # the definition's start
        _write(seq, spec, a, int(keys[0]), *values[0].tolist())
        occupied[a:a + DEF_LEN] = True
        seq[length - 1] = keys[0] + (twin if task == "offset" else 0)
        for k, (v1, v2) in zip(keys[1:].tolist(), values[1:].tolist()):  # distractors, as in training
            placed = _define(seq, occupied, rng, spec, k, [v1, v2], length - 1, 2, length - 1)
            if placed is not None:
                seq[placed[1]], seq[placed[2]] = k, k + twin
        inputs.append(seq)
        answers.append(int(values[0][0 if task == "kv_recall" else 1]))
    return RecallProbe(length, distance, np.stack(inputs), np.asarray(answers, dtype=np.int64))


def distance_range(length: int, spec: KVSpec = KVSpec()) -> tuple[int, int]:
    """The key-to-query distances a probe of ``length`` tokens can have: the definition must fit before the query."""
    return (1, length - DEF_LEN) if spec.layout == "before" else (DEF_LEN, length - 1)


def content_copy_accuracy(probe: RecallProbe, spec: KVSpec = KVSpec(), seed: int = 0) -> float:
    """The control: accuracy of a scorer that sees only content, not keys or positions. It answers with a
    value id drawn uniformly from the value tokens present in the window (what a model that has learned "the
    answer is some value in the context" but cannot match the key does at best): about ``spec.chance``."""
    rng = np.random.default_rng([int(seed), probe.length, probe.distance, 0xC0])
    hits = 0
    for x, ans in zip(probe.inputs, probe.answers.tolist()):
        vals = np.unique(x[(x >= spec.values[0]) & (x < spec.values[1])])
        hits += int(rng.choice(vals)) == ans
    return hits / len(probe.inputs)
