"""posenc.evals.lab.evaluate: per-length method defaults, records, not_applicable cases, bad settings, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from posenc.cli import main as cli_main
from posenc.data.tokenizer import ByteTokenizer
from posenc.evals.lab.evaluate import evaluate_checkpoint, evaluate_model, model_variant
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.scheme.core import PositionScheme
from posenc.training.train import TrainConfig, train


def write_corpus(path):
    rng = np.random.default_rng(1)
    words = "a pale moon over old stone towers and seven wise owls sing of rivers and hills".split()
    path.write_text("\n".join(" ".join(rng.choice(words, 10)) + "." for _ in range(300)) + "\n")
    return path


KEYS = {"scheme", "method", "params", "train_len", "eval_len", "ppl", "loss", "accuracy", "tokens", "passkey",
        "status", "note"}


def tiny_model(preset: str, train_len: int = 32) -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(LMConfig(257, 32, 1, 2, PositionScheme.preset(preset, train_len=train_len), train_len))


TOKENS = np.random.default_rng(0).integers(0, 256, size=600).astype(np.uint8)


def test_rope_model_records_and_methods():
    model = tiny_model("rope")
    recs = evaluate_model(model, TOKENS, [32, 64], ["pi", "yarn", "leaky_rerope", "selfextend", "hierarchical"],
                          max_windows=2, progress=False)
    assert len(recs) == 12 and all(set(r) >= KEYS for r in recs)
    by = {(r["eval_len"], r["method"]): r for r in recs}
    for (n, m), r in by.items():
        if m == "hierarchical":
            assert r["status"] == "not_applicable" and "learned" in r["note"] and r["ppl"] is None
        else:
            assert r["status"] == "ok" and math.isfinite(r["ppl"]) and r["tokens"] == 2 * n and r["passkey"] is None
            assert r["ppl"] == pytest.approx(math.exp(r["loss"])) and r["train_len"] == 32
    # inside the trained length pi / yarn with factor 1 are the plain model
    assert by[(32, "pi")]["loss"] == pytest.approx(by[(32, "none")]["loss"], abs=1e-6)
    assert by[(64, "pi")]["params"] == {"factor": 2.0}
    assert by[(64, "pi")]["loss"] != by[(64, "none")]["loss"]


def test_learned_table_beyond_its_length_is_not_applicable_or_hierarchical():
    model = tiny_model("learned")
    recs = evaluate_model(model, TOKENS, [32, 64], [], max_windows=1, progress=False)
    ok32, na64 = recs
    assert ok32["status"] == "ok" and ok32["eval_len"] == 32
    assert na64["status"] == "not_applicable" and "hierarchical" in na64["note"] and na64["ppl"] is None
    recs = evaluate_model(model, TOKENS, [64], ["hierarchical", "rerope"], max_windows=1, progress=False)
    by = {r["method"]: r for r in recs}
    assert by["none"]["status"] == "not_applicable"
    assert by["hierarchical"]["status"] == "ok" and math.isfinite(by["hierarchical"]["ppl"])
    assert by["rerope"]["status"] == "not_applicable" and by["rerope"]["note"]


def test_method_that_does_not_apply_reports_the_reason():
    recs = evaluate_model(tiny_model("alibi"), TOKENS, [64], ["pi", "sliding_window"], max_windows=1,
                          progress=False)
    by = {r["method"]: r for r in recs}
    assert by["none"]["status"] == "ok" and by["sliding_window"]["status"] == "ok"
    assert by["pi"]["status"] == "not_applicable" and "RoPE" in by["pi"]["note"]


def test_methods_on_a_layer_pattern_default_from_its_rope_layers():
    """rope_base's default scales the base of the layers it extends: 5e5 on a pattern whose RoPE layers all
    rotate at 5e5 (it used to read the pattern's absent rope and start from 1e4); on Gemma 3's two bases no one
    default fits and the method is refused; a base-free default (YaRN's factor) still applies to both."""
    torch.manual_seed(0)
    one = PositionScheme.preset("nope_every4", train_len=32, every=2, base=5e5)
    _, params = model_variant(TinyLM(LMConfig(257, 32, 2, 2, one, 32)), "rope_base", 64)
    assert params["base"] == pytest.approx(5e5 * 2 ** (16 / 14))
    two = TinyLM(LMConfig(257, 32, 2, 2, PositionScheme.preset("local_global", train_len=32, every=2), 32))
    with pytest.raises(ValueError, match=r"rope_base.*different parameters.*layers=\["):
        model_variant(two, "rope_base", 64)
    variant, params = model_variant(two, "yarn", 64)
    assert params == {"factor": 2.0} and all(s.rope.scaling["rope_type"] == "yarn" for s in variant.cfg.layer_schemes)


def test_passkey_rate_and_too_short_prompt():
    tok = ByteTokenizer()
    recs = evaluate_model(tiny_model("rope"), TOKENS, [64, 300], [], max_windows=1, passkey=True, tokenizer=tok,
                          progress=False, passkey_trials=1)
    short, long = recs
    assert short["passkey"] is None and "passkey skipped" in short["note"] and short["status"] == "ok"
    assert 0.0 <= long["passkey"] <= 1.0
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate_model(tiny_model("rope"), TOKENS, [32], passkey=True, progress=False)


def test_train_then_evaluate_checkpoint_and_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    corpus = str(write_corpus(tmp_path / "tiny.txt"))
    cfg = TrainConfig(out_dir=str(tmp_path / "run"), corpus=corpus, dim=32, n_layers=1, n_heads=2, train_len=32,
                      batch_size=4, steps=8, warmup=2, lr=3e-3, save_every=0, eval_batches=1)
    summary = train(cfg, progress=False)
    assert summary["final_train_loss"] < summary["history"][0]  # it learns something
    recs = evaluate_checkpoint(cfg.out_dir, None, [32, 64], ["ntk", "rerope"], max_windows=2, progress=False)
    assert len(recs) == 6 and all(r["status"] == "ok" and set(r) >= KEYS for r in recs)
    assert all(r["split"] == "test" and r["corpus"] == corpus for r in recs)
    assert recs[0]["ppl"] < 257  # better than uniform after a few steps
    out = tmp_path / "eval.json"
    rc = cli_main(["eval", cfg.out_dir, "--lengths", "32", "64", "--methods", "pi", "--max-windows", "1",
                   "--json", str(out), "--out", str(tmp_path / "eval.jsonl"), "--quiet"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "ppl" in table and "pi" in table
    saved = json.loads(out.read_text())
    assert [(r["eval_len"], r["method"]) for r in saved] == [(32, "none"), (32, "pi"), (64, "none"), (64, "pi")]
    lines = (tmp_path / "eval.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == saved  # --out: the same records, one per line

P = PositionScheme


def tiny_lm(scheme=None, vocab=32, dim=16, n_layers=1, seed=0):
    torch.manual_seed(seed)
    scheme = scheme or P.preset("rope", train_len=16)
    return TinyLM(LMConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=2, scheme=scheme,
                           train_len=16)).eval()


@pytest.mark.parametrize("kw, match", [
    ({"lengths": [0]}, r"eval length must be an integer >= 1, got 0"),
    ({"lengths": [8], "batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
    ({"lengths": [8], "max_windows": -1}, r"max_windows must be an integer >= 1, got -1"),
    ({"lengths": [8], "methods": ["superrope"]}, r"unknown method 'superrope'"),
    ({"lengths": [8], "methods": ["yarn+superrope"]}, r"unknown method 'yarn\+superrope'"),
    ({"lengths": [8], "mode": "overlap"}, r"mode must be one of \('nonoverlap', 'sliding', 'tail'\)"),
])
def test_evaluate_model_refuses_bad_settings_up_front(kw, match):
    from posenc.evals.lab.evaluate import evaluate_model

    with pytest.raises(ValueError, match=match):
        evaluate_model(tiny_lm(), torch.ones(64, dtype=torch.long), progress=False, **kw)
