"""posenc.evals.lab.bench: one tiny end-to-end round trip (train -> eval -> results.json -> report), then reuse;
stops that save and resume, one bench per folder, the key-matching probes' cells."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import posenc.training.train
from posenc.evals.lab import bench
from posenc.evals.records import RETRIEVAL_KEYS, RetrievalRecord
from posenc.evals.report.lab import REQUIRED_KEYS
from posenc.models.checkpoint import load_model, read_train_state
from posenc.runtime.interrupt import Interrupted
from posenc.runtime.lock import FolderInUseError, FolderLock
from posenc.tasks.kv_recall import DEF_LEN
from posenc.tasks.recall import probe_distances

ROOT = Path(__file__).resolve().parents[3]

TEXT = ("Shall I compare thee to a summer's day? Thou art more lovely and more temperate. "
        "Rough winds do shake the darling buds of May, and summer's lease hath all too short a date.\n")


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 60)  # ~11 kB: chunked into 20 units, test split ~0.5 kB
    preset = bench.BenchPreset("tiny", "test preset", corpus=str(corpus), dim=16, n_layers=1, n_heads=2,
                               train_len=16, steps=3, batch_size=2, warmup=1, val_batches=1,
                               eval_factors=(1, 2), schemes=("sinusoidal", "rope"), rope_methods=("pi", "rerope"),
                               learned_methods=(), passkey_factors=(), max_windows=2, eval_batch_size=2,
                               recall_batch=2, recall_trials=3)
    monkeypatch.setitem(bench.PRESETS, "tiny", preset)
    calls = []
    real = posenc.training.train.train

    def counting(cfg, progress=True, **kw):
        calls.append(cfg)
        return real(cfg, progress=False, **kw)

    monkeypatch.setattr(posenc.training.train, "train", counting)
    return tmp_path, calls


def test_round_trip_and_reuse(tiny, capsys):
    tmp_path, calls = tiny
    out = tmp_path / "out"
    from posenc.cli import main

    assert main(["bench", "--preset", "tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| scheme / method |" in printed and "[bench" in printed
    assert sorted(c.scheme for c in calls) == ["rope", "sinusoidal"]

    results = json.loads((out / "results.json").read_text())
    meta = results["meta"]
    assert meta["preset"] == "tiny" and meta["corpus"].endswith("corpus.txt")
    assert meta["machine"]["cpu_count"] >= 1 and meta["machine"]["torch"]
    assert meta["timings"]["total"] > 0 and meta["config"]["train_len"] == 16
    recs = results["records"]
    assert len(recs) == 2 * 2 + 2 * 2  # sinusoidal: none; rope: none, pi, rerope ... at 16 and 32
    for r in recs:
        assert set(REQUIRED_KEYS) <= set(r)
    assert {(r["scheme"], r["method"]) for r in recs} == {("sinusoidal", "none"), ("rope", "none"),
                                                          ("rope", "pi"), ("rope", "rerope")}
    assert all(r["status"] == "ok" and r["ppl"] > 1 for r in recs)
    # the recall probe: every model and method at every length and probed distance, in the documented schema
    ret = results["retrieval"]
    assert {(r["scheme"], r["method"], r["eval_len"], r["distance"]) for r in ret} == {
        (s, m, n, d) for s, m in {(r["scheme"], r["method"]) for r in recs} for n in (16, 32)
        for d in probe_distances(16, n)}
    for r in ret:
        assert list(r)[:len(RETRIEVAL_KEYS)] == list(RETRIEVAL_KEYS) and r["task"] == "recall"
        assert 0 <= r["accuracy"] <= 1 and r["n"] == bench.PRESETS["tiny"].recall_trials and r["chance"] == 1 / 32
    assert "## Which methods extend past the trained length?" in (out / "report.md").read_text()
    assert (out / "retrieval_recall.png").stat().st_size > 0
    for name in ("report.md", "report.html", "ppl_vs_length.png", "accuracy_vs_length.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "runs" / "rope" / "config.json").exists()

    # second run: finished checkpoints are reused, train() is not called again
    calls.clear()
    again = bench.run_bench("tiny", out, progress=False)
    assert calls == []
    assert [r["ppl"] for r in again["records"]] == [r["ppl"] for r in recs]
    assert again["retrieval"] == ret


def expected_rows(config: dict) -> set[tuple[str, str, int]]:
    """(scheme, method, eval_len) of every record a preset (as ``BenchPreset.to_dict()``) produces: each
    trained scheme bare, the RoPE model under each inference-time method, the learned table under its
    extensions, each fine-tune whose start exists bare (from scratch, a trained scheme, or an earlier fine-tune:
    a schedule's second stage), all at every eval length."""
    models = [(s, ["none"] + list(config["rope_methods"] if s == "rope" else ())
               + list(config["learned_methods"] if s == "learned" else ())) for s in config["schemes"]]
    have = set(config["schemes"])  # a fine-tune runs from scratch (base None), a trained scheme or an earlier fine-tune
    for ft in config["finetunes"]:
        if ft["base"] is None or ft["base"] in have:
            have.add(ft["name"])
            models.append((ft["name"], ["none"]))
    lengths = [f * config["train_len"] for f in config["eval_factors"]]
    return {(s, m, n) for s, methods in models for m in methods for n in lengths}


def test_finetunes_learned_extensions_and_passkey_run_as_the_preset_says(tmp_path, tiny):
    _, calls = tiny
    preset = bench.BenchPreset("tiny2", "", corpus=bench.PRESETS["tiny"].corpus, dim=16, n_layers=1, n_heads=2,
                               train_len=16, steps=2, batch_size=2, warmup=1, val_batches=1, eval_factors=(1, 8),
                               schemes=("learned", "rope"), rope_methods=("yarn",), learned_methods=("hierarchical",),
                               passkey_factors=(8,), passkey_depths=(0.5,), max_windows=2, eval_batch_size=2,
                               recall_batch=0,
                               finetunes=(bench.FineTune("ft_pi", "pi", {"factor": 2.0}, steps=2),
                                          bench.FineTune("ft_skipped", "pi", base="alibi")))
    out = tmp_path / "out2"
    results = bench.run_bench(preset, out, progress=False)
    # trained: each scheme at L, then the fine-tune continued from the RoPE checkpoint at 2L for its own steps
    assert [(c.scheme, c.train_len, c.steps, c.init) for c in calls] == [
        ("learned", 16, 2, None), ("rope", 16, 2, None), ("pi", 32, 2, str(out / "runs" / "rope"))]
    assert calls[-1].scheme_params == {"factor": 2.0}
    # the fine-tune warms up again and decays from a tenth of the preset's peak (FineTune.schedule)
    assert (calls[-1].lr, calls[-1].min_lr, calls[-1].warmup) == pytest.approx((preset.lr / 10, preset.lr / 100, 1))
    assert (calls[0].lr, calls[0].warmup) == (preset.lr, 0)  # a trained scheme keeps the preset's recipe
    recs = results["records"]
    assert {(r["scheme"], r["method"], r["eval_len"]) for r in recs} == expected_rows(preset.to_dict())
    # the bare learned table refuses 8L (not applicable), its hierarchical extension runs there
    bad = {(r["scheme"], r["method"], r["eval_len"]) for r in recs if r["status"] != "ok"}
    assert bad == {("learned", "none", 128)}
    assert all("fine-tuned from the rope checkpoint" in r["note"] for r in recs if r["scheme"] == "ft_pi")
    # passkey cells (a prompt needs ~90 bytes) only at the passkey length, for every record that ran there,
    # and as retrieval records (task "passkey") with the key line's distance from the question's end
    for r in recs:
        assert (r["passkey"] is not None) == (r["eval_len"] == 128 and r["status"] == "ok"), r
    pk = [r for r in results["retrieval"] if r["task"] == "passkey"]
    assert {(r["scheme"], r["method"]) for r in pk} == {(r["scheme"], r["method"]) for r in recs
                                                         if r["eval_len"] == 128 and r["status"] == "ok"}
    assert all(r["eval_len"] == 128 and 0 < r["distance"] < 128 and r["depth"] == 0.5 for r in pk)
    assert not [r for r in results["retrieval"] if r["task"] == "recall"]  # recall_batch=0: no probe
    written = json.loads((out / "results.json").read_text())
    assert written["meta"]["config"] == json.loads(json.dumps(preset.to_dict()))


# ------------------------------------------------------------------ interrupted benches resume, one bench per folder
class SignalAt:
    """Counts calls; delivers ``sig`` to this process once, at call ``at`` (a real signal, handled by the
    bench's handler like a Ctrl-C from the terminal)."""

    def __init__(self, at: int, sig=signal.SIGINT):
        self.at, self.sig, self.calls, self.fired = at, sig, 0, False

    def __call__(self):
        self.calls += 1
        if self.calls == self.at and not self.fired:
            self.fired = True
            os.kill(os.getpid(), self.sig)


def test_sigint_during_training_saves_and_the_resume_does_not_retrain_finished_steps(tiny, monkeypatch):
    tmp_path, calls = tiny
    preset = replace(bench.PRESETS["tiny"], steps=20, schemes=("rope",), rope_methods=())
    steps = SignalAt(7)
    real_loss = posenc.training.train._batch_loss

    def loss(fwd, tokens, cfg, step, *a, **kw):
        steps()
        return real_loss(fwd, tokens, cfg, step, *a, **kw)

    monkeypatch.setattr(posenc.training.train, "_batch_loss", loss)
    out = tmp_path / "stopped"
    with pytest.raises(Interrupted, match=r"interrupted by SIGINT at step 7 of 20: saved a checkpoint in .*rope"):
        bench.run_bench(preset, out, progress=False)
    assert read_train_state(out / "runs" / "rope")["step"] == 7 and not (out / "results.json").exists()
    steps.calls = 0
    resumed = bench.run_bench(preset, out, progress=False)
    assert steps.calls == 20 - 7  # steps 1-7 are not trained again
    steps.calls = 0
    full = bench.run_bench(preset, tmp_path / "whole", progress=False)
    assert steps.calls == 20
    a, b = load_model(out / "runs" / "rope").state_dict(), load_model(tmp_path / "whole" / "runs" / "rope").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the resumed model is the uninterrupted one, bit for bit
    assert resumed["records"] == full["records"] and resumed["retrieval"] == full["retrieval"]
    assert resumed["meta"]["cells"] == {"reused": 0, "computed": 2 + 2}  # 2 lengths x (ppl, recall)


def test_sigterm_during_evaluation_keeps_finished_cells_and_the_resume_computes_only_the_rest(tiny, monkeypatch):
    tmp_path, _ = tiny
    done = SignalAt(3, signal.SIGTERM)
    real = bench._evaluate

    def evaluate(*a, **kw):
        done()
        return real(*a, **kw)

    monkeypatch.setattr(bench, "_evaluate", evaluate)
    out = tmp_path / "out"
    with pytest.raises(Interrupted, match=r"interrupted by SIGTERM during the evaluation of rope: 5 finished "
                                          r"evaluation cell\(s\) are kept") as exc:
        bench.run_bench("tiny", out, progress=False)
    assert exc.value.exit_status == 143
    # sinusoidal: ppl x2, recall x2; rope: the signal arrives while its first ppl cell runs, which is kept
    assert done.calls == 3
    done.calls = 0
    resumed = bench.run_bench("tiny", out, progress=False)
    assert done.calls == 1 and resumed["meta"]["cells"] == {"reused": 5, "computed": 3}
    whole = bench.run_bench("tiny", tmp_path / "whole", progress=False)
    assert resumed["records"] == whole["records"] and resumed["retrieval"] == whole["retrieval"]


def test_one_bench_per_output_folder(tiny):
    tmp_path, calls = tiny
    out = tmp_path / "busy"
    with FolderLock(out, what="bench"):  # another process would hold it the same way
        with pytest.raises(FolderInUseError, match=r"bench folder .*busy.* is in use by another posenc process"):
            bench.run_bench("tiny", out, progress=False)
    assert calls == [] and not (out / "results.json").exists()


BENCH_CHILD = """
import sys
from dataclasses import replace
from posenc.cli import main
from posenc.evals.lab import bench
bench.PRESETS["slow"] = bench.BenchPreset("slow", "test", corpus=sys.argv[1], dim=16, n_layers=1, n_heads=2,
                                          train_len=16, steps=100000, batch_size=2, warmup=1, val_batches=1,
                                          eval_factors=(1,), schemes=("rope",), rope_methods=(), recall_batch=0)
sys.exit(main(["bench", "--preset", "slow", "--out", sys.argv[2]]))
"""


def test_cli_bench_on_sigint_prints_one_line_and_exits_130(tiny):
    tmp_path, _ = tiny
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "cli"
    proc = subprocess.Popen([sys.executable, "-c", BENCH_CHILD, bench.PRESETS["tiny"].corpus, str(out)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the bench's progress lines
            if "train rope: 100000 steps" in line:
                break
        time.sleep(2)  # inside the training loop
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and re.fullmatch(
        r"posenc: interrupted by SIGINT at step \d+ of 100000: saved a checkpoint in .*rope; run the same command "
        r"again to resume from it", last), err[-2000:]
    assert 0 < read_train_state(out / "runs" / "rope")["step"] < 100000


def test_a_rerun_removes_the_temp_files_of_a_killed_one(tiny):
    tmp_path, _ = tiny
    out = tmp_path / "out"
    (out / "cells").mkdir(parents=True)
    stale = [out / ".results.json.k1.tmp", out / ".ppl_vs_length.png.k2.tmp", out / "cells" / ".0123abcd.json.k3.tmp"]
    for p in stale:
        p.write_text("partial")
    bench.run_bench("tiny", out, progress=False)
    assert not any(p.exists() for p in stale) and not list(out.rglob("*.tmp"))


def test_kv_probes_seeds_and_like_for_like_windows(tmp_path, tiny):
    """recall_task "kv": kv_recall and offset cells for every model and method, the content-copy control rows,
    the headline scheme trained at each seed (records carry the seed), perplexity on the same targets at every
    length with its interval over the windows."""
    _, calls = tiny
    preset = bench.BenchPreset("tiny3", "", corpus=bench.PRESETS["tiny"].corpus, dim=16, n_layers=1, n_heads=2,
                               train_len=16, steps=2, batch_size=2, warmup=1, val_batches=1, eval_factors=(1, 2),
                               schemes=("sinusoidal", "rope"), rope_methods=("pi",), learned_methods=(),
                               max_windows=3, eval_batch_size=2, recall_batch=2, recall_pairs=1, recall_trials=4,
                               recall_task="kv", seeds=2, seed_schemes=("rope",), eval_mode="tail", seed=5)
    results = bench.run_bench(preset, tmp_path / "out3", progress=False)
    assert sorted((c.scheme, c.seed, c.recall_task) for c in calls) == [
        ("rope", 5, "kv"), ("rope", 6, "kv"), ("sinusoidal", 5, "kv")]
    recs = results["records"]
    assert {(r["scheme"], r["method"], r["seed"]) for r in recs} == {
        ("sinusoidal", "none", 5), ("rope", "none", 5), ("rope", "pi", 5), ("rope", "none", 6), ("rope", "pi", 6)}
    for r in recs:  # the last 16 targets of 3 windows at both lengths, with the interval over the windows
        assert r["tokens"] == 3 * 16 and r["windows"] == 3 and r["ppl_lo"] < r["ppl"] < r["ppl_hi"], r
    ret = results["retrieval"]
    assert {r["task"] for r in ret} == {"kv_recall", "offset"}
    models = {(r["scheme"], r["method"], r["seed"]) for r in recs}
    for task in ("kv_recall", "offset"):
        cells = {(r["scheme"], r["method"], r["seed"], r["eval_len"], r["distance"]) for r in ret
                 if r["task"] == task and r["scheme"] != "content_copy"}
        assert cells == {(*m, n, d) for m in models for n in (16, 32) for d in probe_distances(16, n)
                         if d <= n - DEF_LEN}
        control = [r for r in ret if r["task"] == task and r["scheme"] == "content_copy"]
        assert {(r["eval_len"], r["distance"]) for r in control} == {(n, d) for *_, n, d in cells}
    for r in ret:
        assert RetrievalRecord.from_dict(r).to_dict() == r and r["n"] == 4 and r["chance"] == 1 / 2
    assert (tmp_path / "out3" / "runs" / "rope-seed6" / "config.json").exists()
