"""Tests for posenc.training.train and posenc.models.checkpoint: tiny runs on a tiny user corpus."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posenc.models import checkpoint as C
from posenc.runtime.lock import LOCK_NAME
from posenc.training.train import TrainConfig, lr_at, param_groups, train

ROOT = Path(__file__).resolve().parents[1]


def write_corpus(path: Path) -> Path:
    rng = random.Random(0)
    words = ("the quick brown fox jumps over a lazy dog while seven wise owls sing of rivers hills "
             "and old stone towers under a pale winter moon").split()
    lines = [" ".join(rng.choice(words) for _ in range(10)).capitalize() + "." for _ in range(300)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return str(write_corpus(tmp_path / "tiny.txt"))


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


def test_checkpoint_files_and_config(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "run", steps=2)
    train(cfg, progress=False)
    run = Path(cfg.out_dir)
    assert sorted(p.name for p in run.iterdir()) == sorted(  # no temp files, no staging folder
        [LOCK_NAME, "config.json", "model.safetensors", "train_state.json", "train_state.safetensors"])
    meta = json.loads((run / "config.json").read_text())
    assert meta["dim"] == 32 and meta["scheme"]["name"] == "rope" and meta["posenc_version"]
    assert meta["extra"]["tokenizer"]["name"] == "byte" and meta["extra"]["train"]["steps"] == 2
    out = C.load_checkpoint(run, restore_rng=False)
    assert out["config"].train_len == 32 and out["train_state"]["finished"]
    x = torch.randint(0, 257, (1, 16))
    torch.testing.assert_close(C.load_model(run)(x), out["model"].eval()(x))


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir()}


def test_corrupt_checkpoints_raise_clear_errors_and_keep_files(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "run", steps=2)
    train(cfg, progress=False)
    run = Path(cfg.out_dir)
    good = _snapshot(run)
    # truncated weights
    (run / "model.safetensors").write_bytes(good["model.safetensors"][:1000])
    before = _snapshot(run)
    with pytest.raises(ValueError, match=r"model\.safetensors.*(truncated|bytes).*train again"):
        C.load_model(run)
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        train(cfg, progress=False)
    assert _snapshot(run) == before  # nothing deleted or rewritten
    # corrupt config.json
    (run / "model.safetensors").write_bytes(good["model.safetensors"])
    (run / "config.json").write_bytes(good["config.json"][:50])
    before = _snapshot(run)
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        C.load_model(run)
    with pytest.raises(ValueError, match=r"config\.json"):
        train(cfg, progress=False)
    assert _snapshot(run) == before
    with pytest.raises(ValueError, match="not a posenc checkpoint"):
        C.load_model(tmp_path / "nowhere")


def test_checkpoint_of_the_gelu_mlp_tinylm_says_the_mlp_changed(tmp_path):
    """A run saved before TinyLM's MLP became Llama's SwiGLU: a ValueError saying so, not a key list."""
    from types import SimpleNamespace

    from posenc.models.tinylm import LMConfig, TinyLM
    from posenc.scheme.core import PositionScheme

    cfg = LMConfig(257, 16, 1, 2, PositionScheme.preset("rope", train_len=16), 16)
    weights = {k: v for k, v in TinyLM(cfg).state_dict().items() if ".mlp." not in k}
    weights.update({"blocks.0.mlp.0.weight": torch.zeros(64, 16), "blocks.0.mlp.0.bias": torch.zeros(64),
                    "blocks.0.mlp.2.weight": torch.zeros(16, 64), "blocks.0.mlp.2.bias": torch.zeros(16)})
    C.save_checkpoint(tmp_path / "old", SimpleNamespace(state_dict=lambda: weights), cfg)
    for load in (C.load_model, C.load_checkpoint):
        with pytest.raises(ValueError, match=r"GELU MLP.*now Llama's SwiGLU.*train the run again"):
            load(tmp_path / "old")


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


def test_cli_train_on_sigterm_prints_one_line_and_exits_143(corpus, tmp_path):
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "posenc", "train", "--out", str(out), "--corpus", corpus,
                             "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--train-len", "32", "--batch-size",
                             "4", "--steps", "100000", "--save-every", "0"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "train rope" not in seen:  # tqdm's bar: the loop runs
            seen += proc.stderr.read(1)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out_text, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 143 and out_text == "", err[-2000:]
    last = err.strip().splitlines()[-1].split("\r")[-1]
    assert "Traceback" not in err and last.startswith("posenc: interrupted by SIGTERM at step ") and \
        last.endswith(f"saved a checkpoint in {out}; run the same command again to resume from it"), err[-2000:]
    step = int(last.split("at step ")[1].split(" ")[0])
    assert C.read_train_state(out)["step"] == step > 0


def test_finetune_schedule_warms_up_again_and_decays_from_the_lower_peak():
    """A bench fine-tune (FineTune.schedule): linear warmup to a tenth of the pretraining peak, then cosine decay
    to a tenth of that, never above the lower peak."""
    from posenc.evals.lab.bench import FineTune

    ft = FineTune("ft", "pi", {"factor": 2.0}, steps=150)
    sched = ft.schedule(3e-3)
    assert sched == pytest.approx({"lr": 3e-4, "min_lr": 3e-5, "warmup": 15})
    cfg = TrainConfig(out_dir="x", steps=150, **sched)
    lrs = [lr_at(s, cfg) for s in range(150)]
    assert lrs[0] == pytest.approx(3e-4 / 15) and max(lrs) == pytest.approx(3e-4) == lrs[14]
    assert all(a < b for a, b in zip(lrs[:14], lrs[1:15]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[14:], lrs[15:]))  # then decays
    assert lr_at(150, cfg) == pytest.approx(3e-5)
    with pytest.raises(ValueError, match="lr_factor"):
        FineTune("ft", "pi", lr_factor=2.0)
