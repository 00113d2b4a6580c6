"""posenc tune: LongRoPE's factor vectors and evolutionary search, the suite objective, the ranked result, the
saved winner (plain transformers without posenc, and llama.cpp GGUF keys read back), resuming, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from posenc.evals.tune.factors import INIT_RULES, evolve, initial_factors, is_monotone
from posenc.evals.tune.gguf_rope import read_rope_gguf, write_rope_gguf
from posenc.evals.tune.search import method_candidates, save_winner, tune

L = 256
N = 512
D = 16  # head_dim of the tiny model


# ------------------------------------------------------------------------------------------------ factors
def test_initial_factors_are_pi_ntk_and_yarn():
    d, s, base = 64, 4.0, 10000.0
    i = np.arange(d // 2)
    theta = base ** (-2 * i / d)
    assert np.all(initial_factors("pi", s, d, base, 2048) == s)
    ntk = initial_factors("ntk", s, d, base, 2048)
    # NTK-aware: the base becomes b * s^(d/(d-2)); lambda_i = theta_i / theta_i'
    ntk_theta = (base * s ** (d / (d - 2))) ** (-2 * i / d)
    np.testing.assert_allclose(ntk, theta / ntk_theta, atol=1e-4)
    assert ntk[0] == 1.0 and ntk[-1] == pytest.approx(s)
    yarn = initial_factors("yarn", s, d, base, 2048)
    turns = 2048 * theta / (2 * math.pi)
    assert np.all(yarn[turns > 64] == 1.0) and np.all(yarn[turns < 0.5] == s)  # NTK-by-parts' two ends
    for rule in INIT_RULES:
        assert is_monotone(initial_factors(rule, s, d, base, 2048), s)
    with pytest.raises(ValueError, match="rule must be one of"):
        initial_factors("linear", s, d, base, 2048)
    with pytest.raises(ValueError, match="factor must be a number >= 1"):
        initial_factors("pi", 0.5, d, base, 2048)


def test_the_search_breeds_children_for_a_real_head_dim():
    """head_dim 64 (SmolLM2's 32 pairs) from PI, NTK and YaRN at s = 2: every evaluation of the budget is a new
    monotone vector (drawing children until one happened to be monotone bred none here, and the 16k tune
    evaluated only the three rule vectors)."""
    d, s, base, train = 64, 2.0, 1e5, 8192
    init = {r: initial_factors(r, s, d, base, train) for r in INIT_RULES}
    found = evolve(lambda lam: float(np.sum((np.log(lam) - np.log(1.5)) ** 2)), init, 16, max_factor=2 * s, seed=0)
    assert len(found) == 16 and len({tuple(r["factors"]) for r in found}) == 16
    assert all(is_monotone(r["factors"], 2 * s) for r in found)
    assert sum(r["name"].startswith("gen") for r in found) >= 8


def test_yarn_initial_factors_follow_the_ramp_of_transformers():
    d, s, base, train = 32, 4.0, 10000.0, 256
    from posenc.parts.frequencies import yarn_correction_range

    low, high = yarn_correction_range(d, base, train, 32, 1)
    lam = initial_factors("yarn", s, d, base, train)
    i = np.arange(d // 2)
    gamma = 1 - np.clip((i - low) / (high - low), 0, 1)  # 1: pair left alone, 0: interpolated by s
    np.testing.assert_allclose(lam, 1 / ((1 - gamma) / s + gamma), atol=1e-4)
    assert lam[0] == 1.0 and lam[-1] == pytest.approx(s)


def test_evolution_improves_a_known_objective_and_keeps_the_constraint():
    """Score: squared log-distance to a monotone optimum none of the rules is; the search must get closer than
    every rule, evaluate only monotone vectors in [1, max_factor], respect the budget, and be reproducible."""
    d, s = 32, 4.0
    init = {r: initial_factors(r, s, d, 10000.0, 256) for r in INIT_RULES}
    best_vec = np.round(np.clip(np.linspace(1.0, 1.3 * s, d // 2) ** 1.1, 1.0, 2 * s), 4)
    best_vec = np.maximum.accumulate(best_vec)

    def score(lam):
        assert is_monotone(lam, 2 * s)
        return float(np.sum((np.log(lam) - np.log(best_vec)) ** 2))

    found = evolve(score, init, 80, max_factor=2 * s, seed=0)
    assert len(found) == 80 and len({tuple(r["factors"]) for r in found}) == 80
    start = min(score(v) for v in init.values())
    assert found[0]["score"] < 0.5 * start
    assert all(is_monotone(r["factors"], 2 * s) for r in found)
    assert [r["score"] for r in found] == sorted(r["score"] for r in found)
    again = evolve(score, init, 80, max_factor=2 * s, seed=0)
    assert [r["factors"] for r in again] == [r["factors"] for r in found]
    with pytest.raises(ValueError, match="break the constraint"):
        evolve(score, {"bad": np.array([2.0, 1.0] * 8)}, 4, max_factor=2 * s)


def test_method_candidates_vary_the_per_length_defaults():
    cands = method_candidates(("yarn", "selfextend"), L, N, D, 10000.0)
    yarn = [p for m, p in cands if m == "yarn"]
    assert yarn[0]["factor"] == 2.0 and {p["factor"] for p in yarn} == {2.0, 3.0}
    se = [p for m, p in cands if m == "selfextend"]
    assert se[0] == {"group": 4, "window": L // 2} or se[0]["window"] == L // 2
    assert {(p["group"], p["window"]) for p in se} >= {(se[0]["group"], L // 2), (2 * se[0]["group"], L // 4)}
    assert len(cands) == len({json.dumps(c, sort_keys=True) for c in cands})
    # every method's defaults first, then the variations in turn: a budget ending in the grid tried every method
    assert [m for m, _ in cands[:2]] == ["yarn", "selfextend"] and cands[2][0] == "yarn" and cands[3][0] == "selfextend"
    five = method_candidates(("pi", "ntk", "yarn", "selfextend", "dca"), L, N, D, 10000.0)
    assert [m for m, _ in five[:5]] == ["pi", "ntk", "yarn", "selfextend", "dca"]


def test_contexts_take_a_haystack_and_need_a_book_one():
    from posenc.cli.tune import _context
    from posenc.evals.tune.objective import DEFAULT_CONTEXTS, context_triples

    assert context_triples([("passkey", 0), ("noise", "passkey", 1)]) == (("book", "passkey", 0),
                                                                          ("noise", "passkey", 1))
    assert DEFAULT_CONTEXTS == (("book", "passkey", 0), ("noise", "passkey", 0))
    with pytest.raises(ValueError, match="need a book context"):
        context_triples([("noise", "passkey", 0)])
    with pytest.raises(ValueError, match="haystack one of"):
        context_triples([("web", "passkey", 0)])
    assert _context("noise:passkey:1") == ("noise", "passkey", 1)
    assert _context("niah:2") == ("book", "niah", 2) and _context("passkey") == ("book", "passkey", 0)
    assert _context("book:niah") == ("book", "niah", 0)
    import argparse

    for bad in ("noise:passkey:x", "a:b:c:d", ":1"):
        with pytest.raises(argparse.ArgumentTypeError, match="HAYSTACK"):
            _context(bad)


# ------------------------------------------------------------------------------------------------ tiny model
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from posenc.hf.export import byte_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=L)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def test_tune_ranks_saves_and_resumes(tiny, tmp_path):
    kw = dict(budget=8, methods=("yarn", "selfextend"), contexts=(("passkey", 0),), target=32, progress=False,
              log=lambda m: None, population=3)
    res = tune(tiny, N, tmp_path, **kw)
    rows = res["rows"]
    assert res["meta"]["forwards_run"] == 8 == len(rows)  # one context: one prefill per candidate
    assert [r["score"] for r in rows] == sorted(r["score"] for r in rows) and res["winner"] == rows[0]
    methods = [r["method"] for r in rows]
    assert "none" in methods and "longrope" in methods and "yarn" in methods
    for r in rows:
        assert r["score"] == pytest.approx(r["loss"] + 1.0 * (1 - r["retrieval"]))
        assert r["retrieval_lo"] <= r["retrieval"] <= r["retrieval_hi"]
    for r in rows:
        if r["method"] == "longrope":
            assert is_monotone(r["params"]["long_factor"], 2 * N / L)
    for r in rows:  # one book context: the loss interval is over its target's 64-token blocks
        assert r["loss_over"] == "blocks" and r["loss_lo"] is None  # 32 target tokens: one block, no interval
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["rows"] == json.loads(json.dumps(rows))
    assert "Recommendation" in (tmp_path / "report.md").read_text()
    again = tune(tiny, N, tmp_path, **kw)  # resumed: every cell is read back
    assert again["meta"]["forwards_run"] == 0 and again["rows"] == json.loads(json.dumps(rows))
    with pytest.raises(ValueError, match="length must be >"):
        tune(tiny, L, tmp_path / "short", **kw)


_PLAIN = """
import json, sys, torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
ids = torch.tensor([json.loads(sys.argv[2])])
print(json.dumps({"posenc": any(k.startswith("posenc") for k in sys.modules),
                  "logits": m(input_ids=ids).logits[0, -1, :8].tolist(), "rope": m.config.rope_parameters}))
"""


def _plain_load(folder, ids):
    """Load ``folder`` with plain transformers in a fresh interpreter (posenc never imported)."""
    out = subprocess.run([sys.executable, "-c", _PLAIN, str(folder), json.dumps(ids)], capture_output=True, text=True,
                         timeout=1800)  # a fresh interpreter imports torch + transformers: minutes on a loaded CPU
    return out


def _row(method, params, score):
    return {"method": method, "params": params, "score": score, "loss": score, "ppl": math.exp(score),
            "retrieval": 0.0, "queries": 1}


def test_native_winner_loads_in_plain_transformers_and_as_gguf(tiny, tmp_path):
    from posenc.evals.tune.objective import TuneObjective
    from posenc.hf.patch import extend, load

    obj = TuneObjective(str(tiny), N, tmp_path / "cells")
    lam = initial_factors("yarn", N / L, D, 10000.0, L)
    lam[-1] = lam[-1] * 1.5  # a searched vector, not a rule
    params = {"short_factor": [1.0] * (D // 2), "long_factor": lam.tolist(), "factor": N / L}
    saved = save_winner(obj, [_row("longrope", params, 1.0), _row("selfextend", {"group": 4, "window": 128}, 2.0)],
                        tmp_path)
    assert saved["form"] == "native"
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "longrope" and "posenc" not in cfg
    ids = [3 + i % 250 for i in range(N - 8)]  # token ids inside the tiny vocabulary (260)
    got = _plain_load(tmp_path / "model", ids)
    assert got.returncode == 0, got.stderr[-2000:]
    plain = json.loads(got.stdout.strip().splitlines()[-1])
    assert plain["posenc"] is False and plain["rope"]["long_factor"] == pytest.approx(lam.tolist())
    ref = extend(load(tiny, dtype=torch.float32), "longrope", **params).eval()
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([ids])).logits[0, -1, :8]
    torch.testing.assert_close(torch.tensor(plain["logits"]), want, rtol=1e-4, atol=1e-4)
    back = read_rope_gguf(saved["gguf"])
    assert back["arch"] == "llama" and back["original_context_length"] == L and back["head_dim"] == D
    assert back["factor"] == pytest.approx(N / L) and back["rope_theta"] == pytest.approx(10000.0)
    np.testing.assert_allclose(back["long_factor"], lam, rtol=1e-6)
    assert back["short_factor"] == [1.0] * (D // 2)
    assert back["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(N / L) / math.log(L)), rel=1e-6)


def test_engine_winner_is_saved_as_posencs_extension_with_the_reason(tiny, tmp_path):
    from posenc.evals.tune.objective import TuneObjective

    obj = TuneObjective(str(tiny), N, tmp_path / "cells")
    rows = [_row("selfextend", {"group": 4, "window": 128}, 1.0), _row("yarn", {"factor": 2.0}, 1.5)]
    saved = save_winner(obj, rows, tmp_path)
    assert saved["form"] == "engine" and saved["gguf"] is None
    assert "yarn" in saved["reason"] and "1.500" in saved["reason"] and "1.000" in saved["reason"]
    assert _plain_load(tmp_path / "model", [1, 2, 3]).returncode != 0  # plain transformers refuses the wrapper
    none = save_winner(obj, [_row("none", {}, 1.0)], tmp_path / "n")
    assert none["form"] == "none" and not (tmp_path / "n" / "model").exists()


def test_gguf_rope_keys_for_yarn_and_refusals(tmp_path):
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 1024,
           "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                               "original_max_position_embeddings": 256}}
    back = read_rope_gguf(write_rope_gguf(tmp_path / "y.gguf", cfg))
    assert (back["scaling_type"], back["factor"], back["original_context_length"], back["context_length"]) == \
        ("yarn", 4.0, 256, 1024)
    assert back["long_factor"] is None and back["rope_theta"] == pytest.approx(5e5)
    with pytest.raises(ValueError, match="rope_type must be one of"):
        write_rope_gguf(tmp_path / "d.gguf", {**cfg, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})


def test_cli_tune_runs_and_prints_the_winner(tiny, tmp_path):
    from posenc.cli import main

    code = main(["tune", str(tiny), "--length", str(N), "--out", str(tmp_path), "--budget", "3", "--search", "yarn",
                 "--no-longrope", "--context", "passkey:0", "--target", "32", "--quiet"])
    assert code == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["budget_forwards"] == 3 and len(res["rows"]) == 3
    assert {r["method"] for r in res["rows"]} == {"none", "yarn"}
    assert main(["tune", str(tiny), "--length", str(N), "--out", str(tmp_path / "b"), "--budget", "0"]) == 2


def _lab_run(path, scheme="rope", seed=0):
    """A tiny byte-level run folder, written the way `posenc train` writes one."""
    from posenc.models import checkpoint as ckpt
    from posenc.models.tinylm import LMConfig, TinyLM
    from posenc.scheme import PositionScheme

    torch.manual_seed(seed)
    cfg = LMConfig(vocab_size=257, dim=32, n_layers=1, n_heads=2, scheme=PositionScheme.preset(scheme, train_len=L),
                   train_len=L)
    model = TinyLM(cfg)
    ckpt.save_checkpoint(path, model, cfg, {"step": 1, "finished": True},
                         extra={"tokenizer": {"name": "byte", "bos": True}, "corpus": "stdlib"})
    return model


def test_tune_takes_a_lab_run_exported_once_with_its_own_tokenizer(tmp_path, monkeypatch):
    """A run folder of `posenc train` is a model to tune: exported once into the cache as a Llama folder with the
    run's byte tokenizer (same logits as the lab model), re-exported only when its weights change; a scheme Llama
    cannot hold is refused by name."""
    from posenc.hf.source import source_folder

    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    model = _lab_run(tmp_path / "run")
    folder = source_folder(tmp_path / "run")
    assert folder.name.startswith("run-run-") and source_folder(tmp_path / "run") == folder
    llama = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[256, 10, 20, 30, 40]])
    with torch.no_grad():
        torch.testing.assert_close(llama(input_ids=ids).logits, model(ids), atol=1e-5, rtol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.encode("ab", add_special_tokens=False) == [97, 98]
    res = tune(tmp_path / "run", 2 * L, tmp_path / "t", budget=2, methods=("yarn",), longrope=False,
               contexts=(("passkey", 0),), target=32, progress=False, log=lambda m: None)
    assert [r["method"] for r in sorted(res["rows"], key=lambda r: r["method"])] == ["none", "yarn"]
    assert res["meta"]["model_id"].startswith("run-run-") and res["meta"]["train_len"] == L
    _lab_run(tmp_path / "run", seed=1)  # trained further: other weights, another export
    again = source_folder(tmp_path / "run")
    assert again != folder and again.name.startswith("run-run-") and folder.is_dir()
    _lab_run(tmp_path / "alibi", scheme="alibi")
    with pytest.raises(ValueError, match="alibi|ALiBi|bias"):
        source_folder(tmp_path / "alibi")


def test_a_noise_context_adds_retrieval_and_no_loss(tiny, tmp_path):
    """The default contexts: a book pass key (its target passage is the loss, with a t interval over its 64-token
    blocks) and a noise pass key (retrieval only); two book contexts: the interval is over the contexts."""
    from posenc.evals.tune.objective import TuneObjective

    obj = TuneObjective(str(tiny), N, tmp_path / "cells", target=128)
    row = obj.evaluate("yarn", {"factor": 2.0})
    book, noise = (obj.store.get(obj.key("yarn", {"factor": 2.0}, *c)) for c in obj.contexts)
    assert noise["loss"] is None and noise["block_losses"] is None and len(noise["answers"]) == 1
    assert len(book["block_losses"]) == 2 and row["loss"] == pytest.approx(book["loss"])
    assert row["loss_over"] == "blocks" and row["loss_lo"] < row["loss"] < row["loss_hi"]
    assert row["queries"] == 2 and row["contexts"] == 2 and obj.forwards == 2
    two = TuneObjective(str(tiny), N, tmp_path / "cells", contexts=(("passkey", 0), ("passkey", 1)), target=128)
    r2 = two.evaluate("yarn", {"factor": 2.0})
    assert two.forwards == 1  # the book pass key 0 cell is shared with the first objective
    assert r2["loss_over"] == "contexts" and r2["loss_lo"] is not None


def test_the_committed_16k_tune_is_what_the_suite_rows_run():
    """benchmarks/results/tune-smollm2-16k: its winner is SelfExtend with exactly the parameters of the suite's
    ``selfextend`` row at 16k (so the committed suite cells measure the recommendation), and the
    ``smollm2_tune16k`` preset runs its best LongRoPE vector; the LongRoPE rows keep the paper's constraint."""
    from pathlib import Path

    from posenc.evals.suite.presets import SUITE_PRESETS
    from posenc.evals.suite.spec import method_params

    res = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "tune-smollm2-16k" /
                      "results.json").read_text())
    rows, meta = res["rows"], res["meta"]
    assert meta["length"] == 16384 and meta["train_len"] == 8192 and meta["budget_forwards"] == 32
    assert sum(r["contexts"] for r in rows) == 32 and [r["score"] for r in rows] == sorted(r["score"] for r in rows)
    win = res["winner"]
    assert win == rows[0] and win["method"] == "selfextend"
    assert win["params"] == method_params("selfextend", 8192, 16384, 64, 1e5, {})
    best_longrope = next(r for r in rows if r["method"] == "longrope")
    tuned = SUITE_PRESETS["smollm2_tune16k"].params
    assert tuned["longrope@tune16k"] == best_longrope["params"]
    assert tuned["longrope@engine16k"] == {**best_longrope["params"], "native": False, "step": 512}
    for r in rows:
        if r["method"] == "longrope":
            assert is_monotone(r["params"]["long_factor"], 4.0)
    assert res["saved"]["form"] == "engine" and "longrope" in res["saved"]["reason"]


def test_the_committed_32k_tune_is_what_the_suite_rows_run():
    """benchmarks/results/tune-smollm2-32k: the same budget as at 16k; its winner, NTK with factor 6, and its best
    LongRoPE vector (kept monotone) are exactly the ``smollm2_tune32k`` preset's tuned rows, the LongRoPE one on
    transformers' form and on posenc's engine; the winner is saved as posenc's extension and says why."""
    from pathlib import Path

    from posenc.evals.suite.presets import SUITE_PRESETS

    res = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "tune-smollm2-32k" /
                      "results.json").read_text())
    rows, meta = res["rows"], res["meta"]
    assert meta["length"] == 32768 and meta["train_len"] == 8192 and meta["budget_forwards"] == 32
    assert sum(r["contexts"] for r in rows) == 32 and [r["score"] for r in rows] == sorted(r["score"] for r in rows)
    win, best_longrope = res["winner"], next(r for r in rows if r["method"] == "longrope")
    assert win == rows[0] and win["method"] == "ntk"
    preset = SUITE_PRESETS["smollm2_tune32k"]
    assert preset.lengths == (8192, 16384, 32768) and preset.prune_from is None  # every row runs at 32k
    assert preset.params["ntk@tune32k"] == win["params"]
    assert preset.params["longrope@tune32k"] == best_longrope["params"]
    assert preset.params["longrope@engine32k"] == {**best_longrope["params"], "native": False, "step": 512}
    assert best_longrope["params"]["factor"] == 32768 / 8192
    for r in rows:
        if r["method"] == "longrope":  # the search's bound is twice the factor
            assert is_monotone(r["params"]["long_factor"], 8.0)
    assert res["saved"]["form"] == "engine" and "longrope" in res["saved"]["reason"]
