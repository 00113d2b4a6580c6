"""posenc.tasks.recall: the retrieval probe's exact distances, correct answers, the training batches' targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.tasks.recall import IGNORE, RecallSpec, probe_distances, recall_batch, recall_probe, score_recall

SPEC = RecallSpec(pairs=4)


@pytest.fixture(scope="module")
def text():
    rng = np.random.default_rng(0)
    return rng.integers(32, 127, size=5000).astype(np.uint8)  # printable ASCII: no task ids


def _task_positions(seq, spec=SPEC):
    keys = np.flatnonzero((seq >= spec.keys[0]) & (seq < spec.keys[1]))
    values = np.flatnonzero((seq >= spec.values[0]) & (seq < spec.values[1]))
    return keys, values


@pytest.mark.parametrize("length,distance", [(64, 1), (64, 8), (64, 62), (256, 96), (512, 384), (512, 2)])
def test_probe_distance_is_exact_and_the_answer_is_the_needles_value(text, length, distance):
    probe = recall_probe(text, length, distance, n_trials=6, seed=3, spec=SPEC)
    assert probe.inputs.shape == (6, length) and probe.distance == distance
    for seq, answer in zip(probe.inputs, probe.answers):
        key = seq[-1]
        assert SPEC.keys[0] <= key < SPEC.keys[1]
        assert seq[length - 1 - distance] == key  # the needle's key, exactly d back
        assert (seq == key).sum() == 2  # defined once, queried once: the answer is unambiguous
        if distance > 1:
            assert seq[length - distance] == answer  # the value right after the needle's key
        assert SPEC.values[0] <= answer < SPEC.values[1]
        keys, values = _task_positions(seq)
        assert np.array_equal(values, keys[:len(values)] + 1) or distance == 1  # every key but the last is a pair
        for k in set(seq[keys].tolist()) - {int(key)}:  # distractors: other keys, each defined and queried
            (a, b) = np.flatnonzero(seq == k)
            assert seq[a + 1] == seq[b + 1]


def test_probe_distractor_density_and_determinism(text):
    p1 = recall_probe(text, 256, 40, 4, seed=1, spec=SPEC)
    p2 = recall_probe(text, 256, 40, 4, seed=1, spec=SPEC)
    p3 = recall_probe(text, 256, 40, 4, seed=2, spec=SPEC)
    assert np.array_equal(p1.inputs, p2.inputs) and not np.array_equal(p1.inputs, p3.inputs)
    keys, _ = _task_positions(p1.inputs[0])
    assert len(keys) == 2 * SPEC.pairs  # 1 probe + 3 distractors, each key twice
    one = recall_probe(text, 256, 40, 2, seed=1)  # the default: a single needle, no distractor
    assert len(_task_positions(one.inputs[0])[0]) == 2


def test_training_batch_targets_only_the_queried_values(text):
    x, y = recall_batch(text, 5, 64, seed=0, step=7, spec=SPEC)
    assert x.shape == y.shape == (5, 64)
    x2, _ = recall_batch(text, 5, 64, seed=0, step=7, spec=SPEC)
    assert torch.equal(x, x2)
    for row_x, row_y in zip(x.numpy(), y.numpy()):
        scored = np.flatnonzero(row_y != IGNORE)
        assert len(scored) == SPEC.pairs
        for q in scored:
            k = row_x[q]
            occ = np.flatnonzero(row_x == k)
            assert len(occ) == 2 and occ[1] == q  # the target sits at the key's second occurrence
            assert row_x[occ[0] + 1] == row_y[q]  # and is the value its first occurrence bound
            assert SPEC.values[0] <= row_y[q] < SPEC.values[1]


def test_training_distances_cover_the_window(text):
    seen = set()
    for step in range(12):
        x, y = recall_batch(text, 8, 64, seed=0, step=step, spec=SPEC)
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            for q in np.flatnonzero(row_y != IGNORE):
                seen.add(int(q - np.flatnonzero(row_x == row_x[q])[0]))
    assert min(seen) <= 4 and max(seen) >= 56


def test_probe_distances_and_errors(text):
    assert probe_distances(64, 64) == [8, 16, 32, 48]
    assert probe_distances(64, 512) == [8, 16, 32, 48, 96, 192, 384]
    with pytest.raises(ValueError, match="distance"):
        recall_probe(text, 64, 63, 1)
    with pytest.raises(ValueError, match="overlap"):
        RecallSpec(keys=(100, 140), values=(130, 150))
    with pytest.raises(ValueError, match="fit"):
        recall_probe(text, 12, 4, 1, spec=SPEC)


def test_score_recall_counts_exact_matches(text):
    probe = recall_probe(text, 32, 8, 10, seed=0, spec=SPEC)

    def oracle(x):  # predicts the answer for the first 7 trials, a wrong value for the rest
        logits = torch.zeros(x.shape[0], x.shape[1], 257)
        for i in range(x.shape[0]):
            row = int(np.flatnonzero((probe.inputs == x[i].numpy()).all(1))[0])
            logits[i, -1, probe.answers[row] if row < 7 else (probe.answers[row] + 1 - 128) % 32 + 128] = 1
        return logits

    assert score_recall(oracle, probe, batch_size=3) == pytest.approx(0.7)
