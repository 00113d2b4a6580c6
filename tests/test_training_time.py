"""Training-time extension methods of the lab: PoSE and randomized ids (posenc.training.positions), LongLoRA's
S^2-attention (posenc.training.s2), YaRN's fine-tune schedule (posenc.evals.lab.bench.yarn_schedule), as options of
``posenc train`` and of the bench presets."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn as nn

from posenc._util import assert_close
from posenc.engine.module import PositionalAttention
from posenc.evals.lab.bench import PRESETS, FineTune, yarn_schedule
from posenc.scheme.core import PositionScheme
from posenc.training.positions import pose_positions, randomized_positions, train_positions
from posenc.training.s2 import s2_attention, s2_forward, s2_groups
from posenc.training.train import TrainConfig, _compatible, train
from tests.test_train import corpus, tiny  # noqa: F401  (the fixture)


# ------------------------------------------------------------------------------------------------ PoSE
def _chunks(ids: np.ndarray) -> list[np.ndarray]:
    """Split ids at every skip (a step other than +1)."""
    cuts = np.flatnonzero(np.diff(ids) != 1) + 1
    return np.split(ids, cuts)


def test_pose_ids_are_consecutive_chunks_with_the_papers_skip_biases():
    rng = np.random.default_rng(0)
    L, Lt = 16, 64
    for chunks in (1, 2, 3, 5):
        for _ in range(200):
            ids = pose_positions(rng, L, Lt, chunks)
            assert ids.shape == (L,) and ids[0] == 0  # chunk 0 has u_0 = 0
            assert np.all(np.diff(ids) >= 1) and ids[-1] <= Lt - 1
            assert len(_chunks(ids)) <= chunks  # two chunks merge when u_i = u_{i-1}
            # skip bias of each token = id - index: non-decreasing (u_i >= u_{i-1}) and within [0, Lt - L]
            u = ids - np.arange(L)
            assert np.all(np.diff(u) >= 0) and 0 <= u.min() and u.max() <= Lt - L


def test_pose_two_chunks_sample_the_cut_and_the_skip_uniformly():
    """N = 2 (the paper's default): the cut l_0 is uniform on {1..L-1}, u_1 uniform on {0..L_t - L}."""
    rng = np.random.default_rng(1)
    L, Lt, n = 8, 20, 8000
    cut, skip = Counter(), Counter()
    for _ in range(n):
        ids = pose_positions(rng, L, Lt, 2)
        u = ids - np.arange(L)
        first = int(np.argmax(u != u[0])) if np.any(u != u[0]) else None
        skip[int(u[-1])] += 1
        if first is not None:
            cut[first] += 1
    assert sorted(skip) == list(range(Lt - L + 1))
    expected = n / (Lt - L + 1)
    assert all(abs(c - expected) < 0.15 * expected for c in skip.values()), skip
    # where u_1 > 0 the cut is visible; it is uniform on 1..L-1
    assert sorted(cut) == list(range(1, L))
    mean = sum(cut.values()) / (L - 1)
    assert all(abs(c - mean) < 0.15 * mean for c in cut.values()), cut


def test_randomized_ids_are_sorted_distinct_and_cover_the_range():
    rng = np.random.default_rng(2)
    L, Lt = 8, 40
    seen = Counter()
    for _ in range(3000):
        ids = randomized_positions(rng, L, Lt)
        assert np.all(np.diff(ids) > 0) and 0 <= ids[0] and ids[-1] < Lt
        seen.update(ids.tolist())
    expected = 3000 * L / Lt  # each id is in a uniform L-subset with probability L / Lt
    assert sorted(seen) == list(range(Lt))
    assert all(abs(c - expected) < 0.15 * expected for c in seen.values())


def test_train_positions_depend_only_on_seed_step_and_rank():
    a = train_positions("pose", 4, 16, 64, seed=3, step=7)
    assert a.shape == (4, 16) and a.dtype == torch.int64
    assert torch.equal(a, train_positions("pose", 4, 16, 64, seed=3, step=7))
    assert not torch.equal(a, train_positions("pose", 4, 16, 64, seed=3, step=8))
    assert not torch.equal(a, train_positions("pose", 4, 16, 64, seed=3, step=7, rank=1))
    assert train_positions("contiguous", 4, 16, 64, seed=3, step=7) is None
    with pytest.raises(ValueError, match="positions must be one of"):
        train_positions("skipwise", 4, 16, 64, seed=0, step=0)
    with pytest.raises(ValueError, match="position_range must be >= train_len"):
        pose_positions(np.random.default_rng(0), 16, 8)
    with pytest.raises(ValueError, match="chunks must be in"):
        pose_positions(np.random.default_rng(0), 4, 8, chunks=5)


# ------------------------------------------------------------------------------------------------ S^2
@pytest.mark.parametrize("n,groups", [(16, 4), (32, 2), (12, 3), (8, 1)])
def test_s2_shifted_groups_cover_every_token_once(n, groups):
    g = n // groups
    for shifted in (False, True):
        ranges = s2_groups(n, groups, shifted)
        tokens = [t for s, e in ranges for t in range(s, e)]
        assert tokens == list(range(n))  # a partition of 0..n-1, in order
    plain, shift = s2_groups(n, groups, False), s2_groups(n, groups, True)
    assert all(e - s == g for s, e in plain)
    assert [s for s, _ in shift[1:]] == [s + g // 2 for s, _ in plain]  # boundaries moved by G/2
    with pytest.raises(ValueError, match="n_groups"):
        s2_groups(16, 3, False)
    with pytest.raises(ValueError, match="even"):
        s2_groups(12, 4, True)


def test_s2_forward_is_plain_attention_inside_each_group():
    """Heads [0, H/2) of S^2 equal plain attention run on each plain group's tokens alone (same true positions),
    heads [H/2, H) on each shifted group's: checked against the layer's own forward on sliced inputs."""
    torch.manual_seed(0)
    H, D, N, G = 4, 8, 16, 4
    attn = PositionalAttention(H * D, H, PositionScheme.preset("rope", train_len=N)).double()
    attn.o_proj = nn.Identity()  # compare per-head outputs
    x = torch.randn(2, N, H * D, dtype=torch.float64)
    pos = torch.arange(N)[None].expand(2, N) + 5
    out = s2_forward(attn, G, x, pos)  # [B,N,H*D]
    half = H // 2 * D
    for cols, shifted in ((slice(0, half), False), (slice(half, H * D), True)):
        for s, e in s2_groups(N, G, shifted):
            ref = attn(x[:, s:e], pos[:, s:e])
            assert_close(out[:, s:e, cols], ref[:, :, cols], rtol=1e-10, atol=1e-10)
    full = attn(x, pos)
    assert not torch.allclose(out[:, N // 2:], full[:, N // 2:])  # later tokens do lose the far keys


def test_s2_attention_context_restores_full_attention_and_trains(corpus, tmp_path):  # noqa: F811
    from posenc.models.tinylm import LMConfig, TinyLM

    torch.manual_seed(0)
    model = TinyLM(LMConfig(50, 16, 1, 2, PositionScheme.preset("rope", train_len=16), 16))
    x = torch.randint(0, 50, (2, 16))
    before = model(x)
    with s2_attention(model, 4):
        inside = model(x)
    assert torch.equal(model(x), before) and not torch.allclose(inside, before)
    with pytest.raises(ValueError, match="n_heads must be even"):
        odd = TinyLM(LMConfig(50, 18, 1, 3, PositionScheme.preset("rope", train_len=16), 16))
        with s2_attention(odd, 4):
            odd(x)
    summary = train(tiny(corpus, tmp_path / "s2", s2_groups=4), progress=False)
    assert summary["finished"] and np.isfinite(summary["val_loss"])


# ------------------------------------------------------------------------------------------------ train options
def test_training_position_options_train_and_change_the_run(corpus, tmp_path):  # noqa: F811
    plain = train(tiny(corpus, tmp_path / "plain"), progress=False)
    pose = train(tiny(corpus, tmp_path / "pose", positions="pose", position_range=128), progress=False)
    rnd = train(tiny(corpus, tmp_path / "rnd", positions="randomized", position_range=256), progress=False)
    for s in (pose, rnd):
        assert s["finished"] and np.isfinite(s["val_loss"])
    assert pose["history"] != plain["history"] and rnd["history"] != pose["history"]
    saved = json.loads((tmp_path / "pose" / "config.json").read_text())
    assert "pose" in json.dumps(saved)


def test_training_options_are_checked():
    for kw, match in (({"positions": "skip"}, "positions must be one of"),
                      ({"positions": "pose"}, "position_range must be > train_len"),
                      ({"positions": "randomized", "position_range": 128}, "position_range must be > train_len"),
                      ({"pose_chunks": 0}, "pose_chunks must be a positive"),
                      ({"pose_chunks": 300}, "pose_chunks must be in"),
                      ({"s2_groups": 3}, "s2_groups must split"),
                      ({"s2_groups": -1}, "s2_groups must be a non-negative")):
        with pytest.raises(ValueError, match=match):
            TrainConfig(out_dir="x", train_len=128, **kw)


def test_runs_saved_before_the_options_existed_stay_compatible():
    cfg = TrainConfig(out_dir="x")
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("positions", "position_range", "pose_chunks",
                                                                "s2_groups")}
    _compatible(old, cfg)  # no error: the defaults are what such a run used
    with pytest.raises(ValueError, match="positions"):
        _compatible(old, TrainConfig(out_dir="x", positions="pose", position_range=512))


def test_cli_train_has_the_training_options():
    from posenc.cli import build_parser

    args = build_parser({"train"}).parse_args(["train", "--out", "o", "--positions", "pose", "--position-range",
                                               "512", "--pose-chunks", "3", "--s2-groups", "4"])
    assert (args.positions, args.position_range, args.pose_chunks, args.s2_groups) == ("pose", 512, 3, 4)


# ------------------------------------------------------------------------------------------------ YaRN + bench
def test_yarn_schedule_is_two_stages_the_second_from_the_first():
    first, second = yarn_schedule(2.0, 150)
    assert (first.method, first.params, first.steps, first.len_factor, first.base) == \
        ("yarn", {"factor": 2.0}, 150, 2, "rope")
    assert (second.params, second.steps, second.len_factor, second.base) == ({"factor": 4.0}, 75, 2, first.name)
    assert second.scheme_from == "rope"  # re-scaled from the plain RoPE scheme: frequency schedules do not stack


def test_yarn_schedule_second_stage_rescales_the_rope_scheme_on_the_first_stages_weights(corpus, tmp_path):  # noqa: F811
    from posenc.evals.lab import bench
    from posenc.models.checkpoint import load_model

    preset = bench.BenchPreset("t", "test", corpus=corpus, dim=32, n_layers=1, n_heads=2, train_len=16, steps=4,
                               batch_size=4, warmup=1, recall_batch=0, schemes=("rope",), finetunes=yarn_schedule(2, 4))
    run_dirs = bench._train_all(preset, tmp_path, "cpu", False, lambda m: None, {})
    ft, extra = bench._finetune_all(preset, tmp_path, run_dirs, "cpu", False, lambda m: None, {})
    assert list(ft) == ["rope_ft_yarn2", "rope_ft_yarn4"] and extra == []  # seed_finetunes off: one seed
    stage2 = load_model(ft["rope_ft_yarn4"])
    want = load_model(run_dirs["rope"]).scheme.extend("yarn", factor=4.0)
    assert stage2.scheme.rope.scaling == want.rope.scaling and stage2.cfg.train_len == 32
    cfg = json.loads((ft["rope_ft_yarn4"] / "config.json").read_text())
    assert str(ft["rope_ft_yarn2"]) in json.dumps(cfg)  # continued from the first stage's weights

def test_yarn_schedule_refuses_a_fractional_factor():
    with pytest.raises(ValueError, match="factor must be an integer > 1"):
        yarn_schedule(1.5)


def test_training_time_preset_rows_build_valid_train_configs(tmp_path):
    from posenc.evals.lab.bench import _train_config

    preset = PRESETS["training_time"]
    names = [ft.name for ft in preset.finetunes]
    assert len(set(names)) == len(names)
    for ft in preset.finetunes:
        assert isinstance(ft, FineTune)
        assert ft.base is None or ft.base in preset.schemes or ft.base in names[:names.index(ft.name)]
        cfg = _train_config(preset, ft.method, tmp_path / ft.name, "cpu", steps=ft.steps,
                            train_len=ft.len_factor * preset.train_len, init=None if ft.base is None else "x",
                            scheme_params=ft.params, options=ft.options)
        assert cfg.train_len * max(1, ft.options.get("position_range", 0) // cfg.train_len) <= 8 * preset.train_len
    kinds = {ft.options.get("positions", "contiguous") for ft in preset.finetunes}
    assert kinds == {"contiguous", "pose", "randomized"} and any(ft.options.get("s2_groups") for ft in preset.finetunes)


def test_seeded_fine_tunes_continue_their_own_seeds_checkpoint(corpus, tmp_path):  # noqa: F811
    """seed_finetunes: every row at the seeds of the scheme it starts from, each from that seed's checkpoint (a
    schedule's second stage from the same seed's first), trained on that seed's data order; side by side in
    workers (jobs=2) the rows are the same files as one after another."""
    from dataclasses import replace

    from posenc.evals.lab import bench
    from posenc.runtime.interrupt import StopSignals

    preset = bench.BenchPreset("t", "test", corpus=corpus, dim=32, n_layers=1, n_heads=2, train_len=16, steps=4,
                               batch_size=4, warmup=1, recall_batch=0, schemes=("rope",), seeds=2,
                               seed_schemes=("rope",), seed_finetunes=True,
                               finetunes=(FineTune("rope_ft_pi", "pi", {"factor": 2.0}, steps=3),
                                          FineTune("rope_scratch", "rope", steps=3, base=None),
                                          *yarn_schedule(2, 4)))
    assert [bench.finetune_seeds(preset, ft) for ft in preset.finetunes] == [[0, 1]] * 4
    assert bench.finetune_seeds(replace(preset, seed_finetunes=False), preset.finetunes[0]) == [0]
    out = {}
    for jobs in (1, 2):
        runs = tmp_path / f"jobs{jobs}"
        with StopSignals() as stop:
            p = replace(preset, jobs=jobs)
            run_dirs = bench._train_all(p, runs, "cpu", False, lambda m: None, {}, stop)
            out[jobs] = bench._finetune_all(p, runs, run_dirs, "cpu", False, lambda m: None, {}, stop)
    ft, extra = out[1]
    assert sorted(ft) == ["rope_ft_pi", "rope_ft_yarn2", "rope_ft_yarn4", "rope_scratch"]
    assert sorted((name, seed) for name, seed, _ in extra) == [
        ("rope_ft_pi", 1), ("rope_ft_yarn2", 1), ("rope_ft_yarn4", 1), ("rope_scratch", 1)]
    runs = tmp_path / "jobs1"
    for name, _seed, run_dir in extra:
        train = json.loads((run_dir / "config.json").read_text())["extra"]["train"]
        want = {"rope_ft_pi": runs / "rope-seed1", "rope_ft_yarn2": runs / "rope-seed1",
                "rope_ft_yarn4": runs / "rope_ft_yarn2-seed1", "rope_scratch": None}[name]
        assert run_dir.name == f"{name}-seed1" and train["seed"] == 1, train
        assert train["init"] == (None if want is None else str(want)), (name, train["init"])
    b = next(d for n, _, d in extra if n == "rope_ft_pi")
    assert (ft["rope_ft_pi"] / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()
    for d in sorted(runs.iterdir()):  # the workers' files are the same bytes
        assert (d / "model.safetensors").read_bytes() == \
            (tmp_path / "jobs2" / d.name / "model.safetensors").read_bytes(), d.name
