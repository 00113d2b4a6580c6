"""The key-matching probes (posenc.tasks.kv_recall): answers exactly where stated, distractor values distinct and
from the answer's range, exact distances, determinism, training targets, and the content-copy control at
chance."""

from __future__ import annotations

import numpy as np
import pytest

from posenc.tasks.kv_recall import DEF_LEN, KV_TASKS, OFFSET, KVSpec, content_copy_accuracy, kv_batch, kv_probe
from posenc.tasks.recall import IGNORE

SPEC = KVSpec()


@pytest.fixture(scope="module")
def text():
    rng = np.random.default_rng(0)
    return rng.integers(32, 127, size=5000).astype(np.uint8)  # printable ASCII: no task ids


def _values(seq, spec=SPEC):
    return np.flatnonzero((seq >= spec.values[0]) & (seq < spec.values[1]))


def _keys(seq, spec=SPEC):
    return np.flatnonzero((seq >= spec.keys[0]) & (seq < spec.keys[1]))


@pytest.mark.parametrize("task", KV_TASKS)
@pytest.mark.parametrize("length,distance", [(64, 1), (64, 8), (64, 61), (256, 96), (256, 192), (512, 384)])
def test_probe_answer_is_exactly_where_stated(text, task, length, distance):
    probe = kv_probe(text, task, length, distance, n_trials=8, seed=3)
    assert probe.inputs.shape == (8, length) and probe.distance == distance
    twin = SPEC.n_keys
    for seq, answer in zip(probe.inputs, probe.answers.tolist()):
        query = int(seq[-1])
        key = query - (twin if task == "offset" else 0)
        assert SPEC.keys[0] <= key < SPEC.keys[1]
        a = length - 1 - distance
        assert seq[a] == key and np.flatnonzero(seq == key)[0] == a  # the key's definition, exactly d back
        assert answer == seq[SPEC.value_at(a, 1 if task == "kv_recall" else OFFSET)]
        assert SPEC.value_at(a, 1) == a - 1 and SPEC.value_at(a, OFFSET) == a - 2  # "v2 v1 k"
        # every value of the window is distinct and from the same range: the answer occurs once
        vals = seq[_values(seq)]
        assert len(vals) == 2 * SPEC.pairs and len(set(vals.tolist())) == len(vals)
        assert (vals == answer).sum() == 1
        n_ids = len(_keys(seq)) + ((seq >= SPEC.twins[0]) & (seq < SPEC.twins[1])).sum()
        assert n_ids == 3 * SPEC.pairs - 1  # the needle: defined, queried; each distractor: defined, queried twice


def test_offset_needs_the_distance_from_the_key(text):
    """v1 and v2 sit next to the same key: the nearest value after the key is offset's wrong answer, and only the
    distance from the key tells the two apart."""
    probe = kv_probe(text, "offset", 128, 40, 16, seed=5)
    for seq, answer in zip(probe.inputs, probe.answers.tolist()):
        a = np.flatnonzero(seq == int(seq[-1]) - SPEC.n_keys)[0]
        assert seq[a - 1] != answer and seq[a - OFFSET] == answer
        assert SPEC.values[0] <= seq[a - 1] < SPEC.values[1]
    assert not np.array_equal(probe.inputs, kv_probe(text, "kv_recall", 128, 40, 16, seed=5).inputs)


def test_probe_is_deterministic_and_seeded(text):
    p1 = kv_probe(text, "kv_recall", 256, 40, 4, seed=1)
    p2 = kv_probe(text, "kv_recall", 256, 40, 4, seed=1)
    p3 = kv_probe(text, "kv_recall", 256, 40, 4, seed=2)
    assert np.array_equal(p1.inputs, p2.inputs) and np.array_equal(p1.answers, p2.answers)
    assert not np.array_equal(p1.inputs, p3.inputs)
    x1, y1 = kv_batch(text, 3, 64, 0, 7)
    x2, y2 = kv_batch(text, 3, 64, 0, 7)
    x3, _ = kv_batch(text, 3, 64, 0, 8)
    assert x1.equal(x2) and y1.equal(y2) and not x1.equal(x3)


def test_training_batch_targets_only_the_queries(text):
    twin = SPEC.n_keys
    dists = {"kv": [], "offset": []}
    for step in range(20):
        x, y = kv_batch(text, 4, 64, 0, step)
        assert x.shape == y.shape == (4, 64)
        for seq, tgt in zip(x.numpy(), y.numpy()):
            targets = np.flatnonzero(tgt != IGNORE)
            assert len(targets) == 2 * SPEC.pairs  # both queries of every definition
            vals = seq[_values(seq)]
            assert len(vals) == 2 * SPEC.pairs and len(set(vals.tolist())) == len(vals)
            for q in targets.tolist():
                k = int(seq[q])
                kind = "offset" if k >= SPEC.twins[0] else "kv"
                key = k - (twin if kind == "offset" else 0)
                (a,) = np.flatnonzero(seq == key)[:1]
                assert a < q and tgt[q] == seq[SPEC.value_at(a, 1 if kind == "kv" else OFFSET)]
                dists[kind].append(q - a)
    for d in dists.values():
        assert min(d) <= 8 and max(d) >= 48  # short and long distances within the window


def test_content_copy_control_is_at_chance(text):
    """A scorer that only sees content (a value of the window) scores about 1 / (2 pairs) on both tasks."""
    for task in KV_TASKS:
        probe = kv_probe(text, task, 128, 60, 800, seed=0)
        acc = content_copy_accuracy(probe, SPEC, seed=0)
        assert abs(acc - SPEC.chance) < 0.04, (task, acc)
    assert SPEC.chance == 1 / 8


def test_spec_and_probe_errors(text):
    with pytest.raises(ValueError, match="overlap"):
        KVSpec(keys=(128, 144))
    with pytest.raises(ValueError, match="pairs"):
        KVSpec(pairs=17)
    with pytest.raises(ValueError, match="task"):
        kv_probe(text, "recall", 64, 8, 1)
    with pytest.raises(ValueError, match="distance"):
        kv_probe(text, "kv_recall", 64, 64 - DEF_LEN + 1, 1)
    far = kv_probe(text, "kv_recall", 64, 64 - DEF_LEN, 1)  # the farthest: the definition opens the window
    assert far.inputs[0, DEF_LEN - 1] == far.inputs[0, -1] and far.inputs[0, DEF_LEN - 2] == far.answers[0]
    after = KVSpec(layout="after")  # "k v1 v2": the key first, the distance at least DEF_LEN
    p = kv_probe(text, "offset", 64, DEF_LEN, 2, spec=after)
    assert (p.inputs[:, -1 - DEF_LEN] == p.inputs[:, -1] - after.n_keys).all()
    assert (p.inputs[:, -1 - DEF_LEN + OFFSET] == p.answers).all()
    with pytest.raises(ValueError, match="distance"):
        kv_probe(text, "kv_recall", 64, DEF_LEN - 1, 1, spec=after)
    with pytest.raises(ValueError, match="layout"):
        KVSpec(layout="middle")
    with pytest.raises(ValueError, match="fit"):
        kv_batch(text, 1, 16, 0, 0)
