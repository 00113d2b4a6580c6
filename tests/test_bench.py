"""posenc.bench: one tiny end-to-end round trip (train -> eval -> results.json -> report), then reuse."""

from __future__ import annotations

import json

import pytest

import posenc.train
from posenc import bench
from posenc.report import REQUIRED_KEYS

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
                               learned_methods=(), passkey_factors=(), max_windows=2, eval_batch_size=2)
    monkeypatch.setitem(bench.PRESETS, "tiny", preset)
    calls = []
    real = posenc.train.train

    def counting(cfg, progress=True, **kw):
        calls.append(cfg.scheme)
        return real(cfg, progress=False, **kw)

    monkeypatch.setattr(posenc.train, "train", counting)
    return tmp_path, calls


def test_round_trip_and_reuse(tiny, capsys):
    tmp_path, calls = tiny
    out = tmp_path / "out"
    from posenc.cli import main

    assert main(["bench", "--preset", "tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| scheme / method |" in printed and "[bench" in printed
    assert sorted(calls) == ["rope", "sinusoidal"]

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
    for name in ("report.md", "report.html", "ppl_vs_length.png", "accuracy_vs_length.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "runs" / "rope" / "config.json").exists()

    # second run: finished checkpoints are reused, train() is not called again
    calls.clear()
    again = bench.run_bench("tiny", out, progress=False)
    assert calls == []
    assert [r["ppl"] for r in again["records"]] == [r["ppl"] for r in recs]


def test_presets_are_data():
    q = bench.PRESETS["quick"]
    assert set(q.schemes) == {"sinusoidal", "learned", "rope", "alibi"}
    assert q.eval_lengths == [q.train_len * f for f in (1, 2, 4, 8)]
    assert len(q.rope_methods) == 17 and "hierarchical" in q.learned_methods
    s = bench.PRESETS["standard"]
    assert len(s.schemes) == 16 and max(s.eval_factors) == 16 and len(s.finetunes) == 2
    with pytest.raises(ValueError, match="passkey_factors"):
        bench.BenchPreset("bad", "", eval_factors=(1, 2), passkey_factors=(4,))
    with pytest.raises(ValueError, match="preset must be one of"):
        bench.run_bench("nope", "/nonexistent", progress=False)
