"""posenc.training.train: tiny runs on a tiny user corpus: the learning-rate schedule, kill and resume bit for bit,
data parallel equal to one process, constraints projected after each step; the defaults are the quick recipe
docs/results/quick.md measures, a short run is not all warmup, odd settings warn; the training-time options and
old runs without them; bad configs refused before touching the disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.evals.lab.bench import PRESETS
from posenc.models import checkpoint as C
from posenc.runtime.lock import LOCK_NAME
from posenc.scheme.core import PositionScheme
from posenc.training.train import TrainConfig, TrainConfigWarning, _compatible, lr_at, param_groups, train


def test_train_defaults_are_the_quick_recipe():
    cfg, quick = TrainConfig(out_dir="x"), PRESETS["quick"]
    for name in ("corpus", "tokenizer", "dim", "n_layers", "n_heads", "train_len", "steps", "batch_size", "lr",
                 "recall_batch", "recall_weight", "recall_pairs", "seed"):
        assert getattr(cfg, name) == getattr(quick, name), name
    assert cfg.warmup is None and cfg.warmup_steps == min(100, quick.steps // 5) == quick.warmup


@pytest.mark.parametrize("steps, warmup, expected", [(30, None, 6), (1200, None, 100), (4, None, 0), (30, 50, 50)])
def test_warmup_is_capped_at_a_fifth_of_the_steps_unless_given(steps, warmup, expected):
    cfg = TrainConfig(out_dir="x", steps=steps, warmup=warmup)
    assert cfg.warmup_steps == expected
    assert lr_at(steps - 1, cfg) < cfg.lr or expected >= steps  # the cosine decay is reached


def test_warmup_zero_starts_at_the_peak():
    cfg = TrainConfig(out_dir="x", steps=10, warmup=0)
    assert lr_at(0, cfg) == pytest.approx(cfg.lr)


@pytest.mark.parametrize("kw, says", [
    ({"steps": 30, "warmup": 100}, "warmup (100) is more than half of TrainConfig.steps (30)"),
    ({"lr": 0.0, "min_lr": 0.0}, "TrainConfig.lr is 0"),
    ({"recall_batch": 0, "recall_weight": 0.5}, "no effect with TrainConfig.recall_batch 0"),
    ({"steps": 10, "eval_every": 10}, "no validation loss before the final one"),
])
def test_settings_that_make_little_sense_warn(kw, says):
    found = TrainConfig(out_dir="x", **kw).warnings()
    assert len(found) == 1 and says in found[0], found


def test_quick_recipe_has_no_warning():
    assert TrainConfig(out_dir="x").warnings() == []


def test_train_issues_the_warnings(tmp_path):
    with pytest.warns(TrainConfigWarning, match="more than half"):
        with pytest.raises(ValueError, match="unknown corpus"):  # refused right after the warning, nothing trained
            train(TrainConfig(out_dir=str(tmp_path / "r"), steps=4, warmup=3, corpus=str(tmp_path / "none.txt")))


def test_the_lab_builds_patterns_by_name():
    from posenc.training.train import TrainConfig, resolve_scheme

    s = resolve_scheme(TrainConfig(out_dir="unused", scheme="local_global", scheme_params={"every": 2}, train_len=32))
    assert s == PositionScheme.preset("local_global", train_len=32, every=2) and s.layers[0].mask.window == 8
    from posenc.cli.schemes import _listing

    listing = "\n".join(_listing())
    assert all(n in listing for n in ("irope", "local_global", "nope_every4", "chunked_attention",
                                      "temperature_tuning"))

ROOT = Path(__file__).resolve().parents[2]


def tiny(corpus, out_dir, **kw) -> TrainConfig:
    base = dict(out_dir=str(out_dir), corpus=corpus, dim=32, n_layers=1, n_heads=2, train_len=32, batch_size=4,
                steps=6, warmup=2, lr=3e-3, min_lr=3e-4, save_every=3, eval_batches=1, recall_batch=4)
    return TrainConfig(**{**base, **kw})


def params_of(run_dir) -> dict[str, torch.Tensor]:
    return dict(C.load_model(run_dir).state_dict())


def test_lr_schedule_and_param_groups():
    cfg = TrainConfig(out_dir="x", steps=100, warmup=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(10, cfg) == pytest.approx(1e-3) and lr_at(100, cfg) == pytest.approx(1e-4)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))  # cosine decays monotonically
    from posenc.models.tinylm import LMConfig, TinyLM
    from posenc.scheme.core import PositionScheme

    model = TinyLM(LMConfig(257, 16, 1, 2, PositionScheme.preset("learned", train_len=16), 16))
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} >= {"pos.table", "norm.weight", "blocks.0.norm2.weight"}
    assert {names[id(p)] for p in decay["params"]} >= {"tok.weight", "blocks.0.mlp.gate_proj.weight"}
    assert all(p.ndim >= 2 for p in decay["params"])
    with pytest.raises(ValueError, match="min_lr"):
        TrainConfig(out_dir="x", lr=1e-4, min_lr=1e-3)


class Killed(Exception):
    pass


def test_kill_and_resume_is_bit_identical(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "full", dropout=0.1)  # dropout: the RNG state must be restored too
    full = train(cfg, progress=False)
    assert full["steps"] == 6 and full["resumed_from"] is None and len(full["history"]) == 6

    def kill_at_4(step, loss):
        if step == 4:  # checkpoint of step 3 exists; step 4's progress is lost, like a SIGKILL
            raise Killed

    killed = replace(cfg, out_dir=str(tmp_path / "killed"))
    with pytest.raises(Killed):
        train(killed, progress=False, on_step=kill_at_4)
    state = C.load_checkpoint(killed.out_dir, restore_rng=False)["train_state"]
    assert state["step"] == 3 and not state["finished"]
    resumed = train(killed, progress=False)
    assert resumed["resumed_from"] == 3
    assert resumed["history"] == full["history"]
    a, b = params_of(cfg.out_dir), params_of(killed.out_dir)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_finished_checkpoint_is_reused(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "run", steps=3)
    first = train(cfg, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in Path(cfg.out_dir).iterdir() if p.name != LOCK_NAME}
    again = train(replace(cfg, save_every=1, device="cpu"), progress=False)  # runtime-only fields may differ
    assert again["reused"] and again["history"] == first["history"] and again["val_loss"] == first["val_loss"]
    assert {p.name: p.stat().st_mtime_ns for p in Path(cfg.out_dir).iterdir() if p.name != LOCK_NAME} == stamps
    with pytest.raises(ValueError, match="different configuration.*lr"):
        train(replace(cfg, lr=1e-2), progress=False)


def test_init_finetunes_under_a_new_scheme(corpus, tmp_path):
    base = tiny(corpus, tmp_path / "base", steps=2)
    train(base, progress=False)
    ft = tiny(corpus, tmp_path / "pi", steps=2, train_len=64, init=base.out_dir, scheme="pi",
              scheme_params={"factor": 2.0})
    train(ft, progress=False)
    model = C.load_model(ft.out_dir)
    assert model.cfg.train_len == 64 and model.scheme.rope.scaling["rope_type"] == "linear"
    assert model.scheme.rope.scaling["original_max_position_embeddings"] == 32
    start = C.load_model(base.out_dir)
    assert not torch.equal(model.tok.weight, start.tok.weight)  # it trained from there...
    assert (model.tok.weight - start.tok.weight).abs().max() < 0.1  # ...and started from those weights


def _torchrun(args, env, nproc):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "posenc", "train", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_two_process_data_parallel_matches_one_process(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "single", steps=4, save_every=0)
    single = train(cfg, progress=False)
    env = {**os.environ, "POSENC_CACHE": os.environ["POSENC_CACHE"], "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    out = tmp_path / "ddp"
    args = ["--out-dir", str(out), "--corpus", corpus, "--dim", "32", "--n-layers", "1", "--n-heads", "2",
            "--train-len", "32", "--batch-size", "4", "--steps", "4", "--warmup", "2", "--lr", "3e-3",
            "--min-lr", "3e-4", "--save-every", "0", "--eval-batches", "1", "--recall-batch", "4", "--quiet"]
    proc = _torchrun(args, env, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])  # only rank 0 prints
    assert summary["steps"] == 4
    ddp_hist = C.load_checkpoint(out, restore_rng=False)["train_state"]["history"]
    assert len(ddp_hist) == 4
    for a, b in zip(ddp_hist, single["history"]):
        assert abs(a - b) < 1e-5, (ddp_hist, single["history"])
    a, b = params_of(out), params_of(cfg.out_dir)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_constrained_parameters_are_projected_after_each_step(corpus, tmp_path):
    """KERPLE's r1 > 0 and 0 < r2 <= 2 (the paper's in-place clamp): after training with a learning rate
    large enough to push them out, every raw parameter is back inside its range."""
    from posenc.parts.biases import KerplePowerBias

    summary = train(tiny(corpus, tmp_path / "k", scheme="kerple_power", lr=5.0, min_lr=5.0, warmup=1,
                         grad_clip=0.0, steps=3, save_every=0), progress=False)
    model = C.load_model(summary["run_dir"])
    biases = [m for m in model.modules() if isinstance(m, KerplePowerBias)]
    assert biases
    for b in biases:
        raw = {n: p.detach().clone() for n, p in b.named_parameters()}
        b.project_()  # projecting an already projected parameter changes nothing
        for n, p in b.named_parameters():
            assert torch.equal(p.detach(), raw[n]), n


def test_sigint_saves_the_current_step_and_the_resume_is_bit_identical(corpus, tmp_path, monkeypatch):
    import signal

    import posenc.training.train as T
    from posenc.runtime.interrupt import Interrupted

    cfg = tiny(corpus, tmp_path / "full", steps=8, save_every=0, dropout=0.1)
    full = train(cfg, progress=False)
    real, calls = T._batch_loss, []

    def loss(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, in the middle of step 5
        return real(*a, **kw)

    monkeypatch.setattr(T, "_batch_loss", loss)
    stopped = replace(cfg, out_dir=str(tmp_path / "stopped"))
    with pytest.raises(Interrupted, match=r"^interrupted by SIGINT at step 5 of 8: saved a checkpoint in .*stopped; "
                                          r"run the same command again to resume from it$") as exc:
        train(stopped, progress=False)
    assert exc.value.exit_status == 130
    assert C.read_train_state(stopped.out_dir)["step"] == 5  # save_every=0: this checkpoint is the signal's
    resumed = train(stopped, progress=False)
    assert resumed["resumed_from"] == 5 and len(calls) == 8 and resumed["history"] == full["history"]
    a, b = params_of(cfg.out_dir), params_of(stopped.out_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------ train options
def test_training_position_options_train_and_change_the_run(corpus, tmp_path):
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


@pytest.mark.parametrize("device, match", [
    ("bogus", r"TrainConfig.device must be a torch device .* got 'bogus'"),
    ("cuda:99", r"TrainConfig.device 'cuda:99'"),
])
def test_train_config_refuses_unknown_devices(device, match, tmp_path):
    from posenc.training.train import TrainConfig

    with pytest.raises(ValueError, match=match):
        TrainConfig(out_dir=str(tmp_path), device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_config_refuses_cuda_without_cuda(tmp_path):
    from posenc.training.train import TrainConfig

    with pytest.raises(ValueError, match=r"TrainConfig.device 'cuda' is not available on this machine"):
        TrainConfig(out_dir=str(tmp_path), device="cuda")


def test_train_refuses_a_bad_scheme_parameter_before_touching_the_disk(tmp_path):
    from posenc.training.train import TrainConfig, train

    cfg = TrainConfig(out_dir=str(tmp_path / "run"), scheme="alibi", scheme_params={"bogus": 1}, steps=1)
    with pytest.raises(ValueError, match=r"bias 'alibi' does not take parameter\(s\) \['bogus'\]"):
        train(cfg, progress=False)
    assert not (tmp_path / "run").exists()
