"""Retrieval by distance: key-value recall inside real text, sized for the lab's small models.

With the presets' single needle (``pairs = 1``) this is a *content-copy control*, not a test of position: the
needle's value is the only byte of its range in the window, so a model answers by copying it by content, from any
distance (NoPE does). The probes that need key matching and position are :mod:`posenc.tasks.kv_recall`
(``kv_recall``, ``offset``); this one keeps the task name ``"recall"``.

Perplexity cannot tell a method that *uses* a long context from one that only looks locally (a sliding
window scores as well as ReRoPE on byte-level text). This probe can: the answer is a byte that only a
needle ``d`` tokens back determines, and ``d`` is the axis.

The task is multi-query associative recall (MQAR; Arora et al., "Zoology", arXiv 2312.04927) written
into a window of the corpus. Key and value symbols are byte ids that UTF-8 English text does not use
(by default the 43 keys ``196..238`` and the 32 values ``128..159``; :class:`RecallSpec`; the Gutenberg
corpus holds none of them). A *pair* is two adjacent tokens
``k v`` that overwrite two text tokens. Each key occurs exactly twice: its first occurrence (the
definition) binds a random value, its second (the query) must reproduce it. A model that can see the
definition answers; one that cannot is at chance, ``1 / n_values``.

Training (:func:`recall_batch`): ``RecallSpec.pairs`` keys per sequence, each defined and queried at random
non-overlapping 2-token slots, so definition-to-query distances cover ``1..seq_len``.
The only targets are the queried values (every other target is ``IGNORE``); the text and the
unpredictable definitions carry no loss.

Probe (:func:`recall_probe`): at evaluation length ``n`` and distance ``d``, the last input token is
the probe key, its definition starts exactly ``d`` tokens earlier (``x[n-1-d] == x[n-1] == key``,
``x[n-d] == value``), and ``pairs - 1`` distractor pairs with other keys (defined and queried) lie at
random places, as many as in training at every length, so only the needle's distance and position
change along the probe's axes. With the default ``pairs = 1`` the needle is the only value in the
window, as in a passkey test (the model need not match keys, only find and copy it); ``pairs > 1`` is
multi-query recall proper, which the lab's 2-layer models learn too slowly for the quick preset (see
``docs/results/quick.md``). Only the final query is scored (greedy argmax of the logits at position ``n - 1``).

Positions are exact and the draws depend only on ``(seed, n, d, trial)``, so a cell's sequences do not
change when other lengths or distances are added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from posenc._util import check_positive_int

__all__ = ["IGNORE", "RecallProbe", "RecallSpec", "probe_distances", "recall_batch", "recall_probe",
           "score_recall"]

IGNORE = -100  # F.cross_entropy's default ignore_index


class IdRanges:
    """What a probe spec with ``keys`` and ``values`` id ranges (``[lo, hi)``) knows of their sizes."""

    keys: tuple[int, int]
    values: tuple[int, int]

    @property
    def n_keys(self) -> int:
        return self.keys[1] - self.keys[0]

    @property
    def n_values(self) -> int:
        return self.values[1] - self.values[0]


@dataclass(frozen=True)
class RecallSpec(IdRanges):
    """The symbols and density of the recall task. ``keys`` and ``values`` are ``[lo, hi)`` id ranges
    that must not overlap and should be ids the corpus does not use; ``pairs`` key-value pairs per
    sequence (the probe's needle and ``pairs - 1`` distractors)."""

    keys: tuple[int, int] = (196, 239)
    values: tuple[int, int] = (128, 160)
    pairs: int = 1

    def __post_init__(self):
        for name in ("keys", "values"):
            lo, hi = getattr(self, name)
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi):
                raise ValueError(f"RecallSpec.{name} must be an id range (lo, hi) with 0 <= lo < hi, got {(lo, hi)}")
        if self.keys[0] < self.values[1] and self.values[0] < self.keys[1]:
            raise ValueError(f"RecallSpec.keys {self.keys} and values {self.values} must not overlap")
        check_positive_int("RecallSpec.pairs", self.pairs)
        if self.pairs > self.n_keys:
            raise ValueError(f"RecallSpec.pairs ({self.pairs}) must be <= the number of keys ({self.n_keys})")

    @property
    def chance(self) -> float:
        """Accuracy of a guess among the values."""
        return 1.0 / self.n_values

    def ids(self) -> np.ndarray:
        """Every id the task writes (keys and values)."""
        return np.concatenate([np.arange(*self.keys), np.arange(*self.values)])


@dataclass(frozen=True)
class RecallProbe:
    """``n_trials`` probe sequences of one cell: ``inputs [n_trials, length]`` (int64), the expected
    ``answers [n_trials]`` and the exact needle-to-query ``distance``."""

    length: int
    distance: int
    inputs: np.ndarray
    answers: np.ndarray


def _free_slots(occupied: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Starts ``p`` in ``[lo, hi)`` where ``p`` and ``p + 1`` are both free."""
    p = np.arange(lo, hi)
    return p[~occupied[p] & ~occupied[p + 1]]


def _place_pairs(seq: np.ndarray, occupied: np.ndarray, keys: np.ndarray, values: np.ndarray, hi: int,
                 rng: np.random.Generator) -> list[tuple[int, int]]:
    """Write each key twice (definition, then query) with its value at random free 2-token slots
    starting below ``hi``; returns the ``(definition, query)`` starts (a pair without room is dropped)."""
    placed = []
    for k, v in zip(keys.tolist(), values.tolist()):
        starts = []
        for _ in range(2):
            free = _free_slots(occupied, 0, hi)
            if len(free) == 0:
                break
            p = int(rng.choice(free))
            occupied[p:p + 2] = True
            starts.append(p)
        if len(starts) < 2:
            occupied[starts] = False
            occupied[[s + 1 for s in starts]] = False
            continue
        a, b = sorted(starts)
        seq[a], seq[a + 1], seq[b], seq[b + 1] = k, v, k, v
        placed.append((a, b))
    return placed


def _draw(rng: np.random.Generator, spec: RecallSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    keys = spec.keys[0] + rng.permutation(spec.n_keys)[:n]
    values = spec.values[0] + rng.integers(0, spec.n_values, size=n)
    return keys, values


def recall_batch(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int,
                 spec: RecallSpec = RecallSpec()) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batch ``step``: ``x [batch_size, seq_len]`` text windows with ``spec.pairs``
    pairs written in, and ``y`` the next-token targets with every target but the queried values set to
    :data:`IGNORE`. Depends only on ``(seed, step)``."""
    batch_size = check_positive_int("batch_size", batch_size)
    seq_len = check_positive_int("seq_len", seq_len, minimum=8)
    if len(tokens) < seq_len + 1:
        raise ValueError(f"seq_len + 1 = {seq_len + 1} exceeds the {len(tokens)} tokens available")
    rng = np.random.default_rng([int(seed), int(step), 0x5EC])
    n_pairs = spec.pairs
    if 4 * n_pairs > seq_len:
        raise ValueError(f"{n_pairs} pairs (4 tokens each) do not fit seq_len {seq_len}")
    xs, ys = [], []
    for start in rng.integers(0, len(tokens) - seq_len, size=batch_size).tolist():
        seq = np.asarray(tokens[start:start + seq_len + 1], dtype=np.int64).copy()
        occupied = np.zeros(seq_len + 2, dtype=bool)
        keys, values = _draw(rng, spec, n_pairs)
        placed = _place_pairs(seq, occupied, keys, values, seq_len, rng)  # value slot <= seq_len: a target
        y = np.full(seq_len, IGNORE, dtype=np.int64)
        for _, q in placed:
            y[q] = seq[q + 1]  # target at the query key's position is its value
        xs.append(seq[:-1])
        ys.append(y)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def probe_distances(train_len: int, eval_len: int,
                    fractions: Sequence[float] = (1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.5, 3, 6, 12)) -> list[int]:
    """The needle distances probed at ``eval_len``: ``fractions`` of ``train_len`` that fit
    (``d <= eval_len - 2``), so within-``L`` distances (< 1) and beyond-``L`` ones (> 1) both appear."""
    train_len = check_positive_int("train_len", train_len)
    eval_len = check_positive_int("eval_len", eval_len)
    ds = sorted({max(1, int(round(train_len * f))) for f in fractions})
    return [d for d in ds if d <= eval_len - 2]


def recall_probe(tokens: np.ndarray, length: int, distance: int, n_trials: int, seed: int = 0,
                 spec: RecallSpec = RecallSpec()) -> RecallProbe:
    """``n_trials`` probe sequences of ``length`` tokens whose final query's definition is exactly
    ``distance`` tokens back (module docstring). Text windows come from ``tokens`` (the test split)."""
    length = check_positive_int("length", length, minimum=4)
    distance = check_positive_int("distance", distance)
    n_trials = check_positive_int("n_trials", n_trials)
    if distance > length - 2:
        raise ValueError(f"distance must be in [1, length - 2 = {length - 2}], got {distance}")
    if len(tokens) < length:
        raise ValueError(f"length {length} exceeds the {len(tokens)} tokens available")
    rng = np.random.default_rng([int(seed), length, distance, 0x9E0])
    n_distract = spec.pairs - 1
    if 4 * spec.pairs > length:
        raise ValueError(f"{spec.pairs} pairs (4 tokens each) do not fit length {length}")
    inputs, answers = [], []
    for start in rng.integers(0, len(tokens) - length + 1, size=n_trials).tolist():
        seq = np.asarray(tokens[start:start + length], dtype=np.int64).copy()
        occupied = np.zeros(length + 1, dtype=bool)
        keys, values = _draw(rng, spec, n_distract + 1)
        q, a = length - 1, length - 1 - distance  # query key (last input) and the needle's key
        seq[a], seq[a + 1], seq[q] = keys[0], values[0], keys[0]
        occupied[[a, a + 1, q, q + 1]] = True
        _place_pairs(seq, occupied, keys[1:], values[1:], length - 1, rng)
        inputs.append(seq)
        answers.append(int(values[0]))
    return RecallProbe(length, distance, np.stack(inputs), np.asarray(answers, dtype=np.int64))


@torch.no_grad()
def score_recall(logits_fn: Callable[[torch.Tensor], torch.Tensor], probe: RecallProbe, *,
                 batch_size: int = 16, device=None) -> float:
    """Exact-match accuracy of the greedy prediction at the final position over the probe's trials."""
    batch_size = check_positive_int("batch_size", batch_size)
    hits = 0
    for i in range(0, len(probe.inputs), batch_size):
        x = torch.from_numpy(probe.inputs[i:i + batch_size]).to(device)
        logits = logits_fn(x)  # [b, n, V]
        if logits.dim() != 3 or logits.shape[:2] != x.shape:
            raise ValueError(f"logits_fn must return [{x.shape[0]}, {x.shape[1]}, V], got {tuple(logits.shape)}")
        pred = logits[:, -1].argmax(-1).cpu().numpy()
        hits += int((pred == probe.answers[i:i + batch_size]).sum())
    return hits / len(probe.inputs)
