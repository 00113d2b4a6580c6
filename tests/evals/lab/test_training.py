"""posenc.evals.lab.training: the training-time preset rows build valid train configs, YaRN's second stage
rescales the first stage's weights, and seeded fine-tunes continue their own seed's checkpoint."""

from __future__ import annotations

import json

from posenc.evals.lab.bench import PRESETS, FineTune, yarn_schedule
from tests.training.test_train import tiny  # noqa: F401  (the fixture)


def test_yarn_schedule_second_stage_rescales_the_rope_scheme_on_the_first_stages_weights(corpus, tmp_path):
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


def test_seeded_fine_tunes_continue_their_own_seeds_checkpoint(corpus, tmp_path):
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
