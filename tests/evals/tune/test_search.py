"""posenc.evals.tune.search: ``posenc tune`` ranks, saves and resumes; the saved winner (plain transformers without
posenc and GGUF for a native method, posenc's extension with the reason for an engine one); a lab run as the
model."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from posenc.evals.tune.factors import initial_factors, is_monotone
from posenc.evals.tune.gguf_rope import read_rope_gguf
from posenc.evals.tune.search import method_candidates, save_winner, tune

L = 256

N = 512

D = 16  # head_dim of the tiny model


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
    with pytest.raises(ValueError, match="--length 256 must be more than the model's trained length 256"):
        tune(tiny, L, tmp_path / "short", **kw)
    assert not (tmp_path / "short").exists()  # refused before the lock: no folder, no .posenc.lock left


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
    # llama.cpp's longrope type with no .factor key: it would divide every frequency by the factor once more
    assert back["scaling_type"] == "longrope" and back["factor"] is None
    assert back["rope_theta"] == pytest.approx(10000.0)
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


def test_a_rerun_whose_winner_is_none_drops_the_earlier_winner(tiny, tmp_path):
    """A tune re-run into its folder whose winner is now the untouched model left the previous run's model in
    ``model/`` (and its ``rope.gguf``) while its results said ``saved: none``. A native winner replacing an engine
    one leaves no file of the wrapper behind (the model folder is replaced whole)."""
    from posenc.evals.tune.objective import TuneObjective

    obj = TuneObjective(str(tiny), N, tmp_path / "cells")
    first = save_winner(obj, [_row("selfextend", {"group": 4, "window": 128}, 1.0)], tmp_path)
    assert first["form"] == "engine" and (tmp_path / "model" / "posenc_extended.py").is_file()
    second = save_winner(obj, [_row("yarn", {"factor": 2.0}, 1.0)], tmp_path)
    assert second["form"] == "native" and (tmp_path / "rope.gguf").is_file()
    assert not (tmp_path / "model" / "posenc_extended.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    third = save_winner(obj, [_row("none", {}, 1.0), _row("yarn", {"factor": 2.0}, 1.5)], tmp_path)
    assert third["form"] == "none" and not (tmp_path / "model").exists() and not (tmp_path / "rope.gguf").exists()


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


# ------------------------------------------------------------------------------------------------ faults
_KW = dict(budget=3, methods=("yarn",), longrope=False, contexts=(("passkey", 0),), target=32, progress=False,
           log=lambda m: None)


def test_settings_that_cannot_run_are_refused_up_front_leaving_nothing(tiny, tmp_path, monkeypatch):
    """``--target 0`` ran 26 prefills then crashed in save_winner; ``--length 64`` left a ``.posenc.lock``; ``--length
    256`` with ``--target 256`` printed 13 refusals, then "-208 haystack tokens left". Each is one line naming the
    flags, before any prefill, with no folder or lock left behind (a new folder or an existing empty one)."""
    from posenc.evals.suite import prefill

    monkeypatch.setattr(prefill, "run_context", lambda *a, **kw: pytest.fail("ran a prefill"))
    (tmp_path / "empty").mkdir()
    cases = [({"target": 0}, "--target must be an integer >= 1, got 0"),
             ({"length": 64}, "--length 64 must be more than the model's trained length 256"),
             ({"target": 512}, "--length 512 and --target 512: no room for the book context passkey:0 (length 512 is "
                               "too short for 1 needles and a 512-token target (-"),
             ({"budget": 0}, "--budget must be an integer >= 1, got 0")]
    for change, match in cases:
        kw = {**_KW, **change}
        length = kw.pop("length", N)
        for out in (tmp_path / "new", tmp_path / "empty"):
            with pytest.raises(ValueError) as exc:
                tune(tiny, length, out, **kw)
            assert match in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "new").exists() and list((tmp_path / "empty").iterdir()) == []


def test_refused_candidates_count_against_the_budget_and_nothing_run_is_no_crash(tiny, tmp_path, monkeypatch):
    """A candidate refused after its prefills ran counted nothing (26 prefills on a budget of 2): now its stored cells
    count, so a tune never runs more than its budget; when every candidate is refused, one line, no IndexError in
    save_winner, no results written."""
    from posenc.evals.tune import objective

    real = objective.candidate_record

    def refuse_yarn(method, *a, **kw):
        if method == "yarn":
            raise ValueError("refused after its prefill")
        return real(method, *a, **kw)

    monkeypatch.setattr(objective, "candidate_record", refuse_yarn)
    res = tune(tiny, N, tmp_path / "a", **{**_KW, "budget": 2})
    assert res["meta"]["forwards_run"] == 2 and [r["method"] for r in res["rows"]] == ["none"]
    assert len(list((tmp_path / "a" / "cells").glob("*.json"))) == 2  # none and the first yarn: nothing more
    again = tune(tiny, N, tmp_path / "a", **{**_KW, "budget": 2})  # resumed: the same walk, read back
    assert again["meta"]["forwards_run"] == 0 and again["rows"] == res["rows"]

    def refuse_all(*a, **kw):
        raise ValueError("refused")

    monkeypatch.setattr(objective, "candidate_record", refuse_all)
    with pytest.raises(ValueError, match="^every candidate was refused .*nothing to rank or save$"):
        tune(tiny, N, tmp_path / "b", **_KW)
    assert not (tmp_path / "b" / "results.json").exists() and not (tmp_path / "b" / "model").exists()
    with pytest.raises(ValueError, match="no candidate was evaluated: nothing to save"):
        save_winner(None, [], tmp_path / "c")


def test_a_damaged_cell_is_computed_again(tiny, tmp_path):
    first = tune(tiny, N, tmp_path, **_KW)
    path = sorted((tmp_path / "cells").glob("*.json"))[1]
    row = json.loads(path.read_text())
    row["value"]["answers"] = "damaged"
    path.write_text(json.dumps(row))
    again = tune(tiny, N, tmp_path, **_KW)
    def strip(rows):
        return [{k: v for k, v in r.items() if k != "prefill_s"} for r in json.loads(json.dumps(rows))]

    assert again["meta"]["forwards_run"] == 1 and strip(again["rows"]) == strip(first["rows"])
    assert isinstance(json.loads(path.read_text())["value"]["answers"], list)


def test_out_holding_other_results_is_refused_and_its_own_is_resumed(tiny, tmp_path):
    """``tune --out`` over a suite's results, over another tune's (another length), or a file: refused in one line
    naming --out before the model is loaded, the folder as it was; its own folder is resumed."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "results.json").write_text(json.dumps({"meta": {"preset": "smollm2", "model_id": "x"}}))
    (suite / "report.md").write_text("# suite")
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for out, match in ((suite, "holds the results of posenc bench (real-model preset) (preset 'smollm2')"),
                       (afile, "exists and is not a folder")):
        before = {p.name: p.read_bytes() for p in suite.iterdir()}
        with pytest.raises(ValueError) as exc:
            tune(tiny, N, out, **_KW)
        assert str(exc.value).startswith(f"--out {str(out)!r} ") and match in str(exc.value)
        assert {p.name: p.read_bytes() for p in suite.iterdir()} == before and afile.read_text() == "keep"
    tune(tiny, N, tmp_path / "t", **_KW)
    before = (tmp_path / "t" / "results.json").read_bytes()
    with pytest.raises(ValueError, match="holds the results of another posenc tune run .*length 512; this one: "
                                         "length 1024.*re-run that one to resume it"):
        tune(tiny, 2 * N, tmp_path / "t", **_KW)
    assert (tmp_path / "t" / "results.json").read_bytes() == before
    assert tune(tiny, N, tmp_path / "t", **_KW)["meta"]["forwards_run"] == 0


_SIGNALLED = """
import sys, time
from pathlib import Path
from posenc import cli
from posenc.evals.suite import prefill
real = prefill.run_context
calls = []
def slow(*a, **kw):
    calls.append(1)
    if len(calls) == 3:
        Path(sys.argv[3]).write_text("ready")  # two cells stored, the third in flight: the signal comes now
        time.sleep(600)
    return real(*a, **kw)
prefill.run_context = slow
sys.exit(cli.main(["tune", sys.argv[1], "--length", "512", "--out", sys.argv[2], "--budget", "3", "--search", "yarn",
                   "--no-longrope", "--context", "passkey:0", "--target", "32", "--quiet"]))
"""


def test_sigterm_stops_a_tune_with_one_line_and_the_resume_runs_only_the_rest(tiny, tmp_path):
    """A real SIGTERM to ``posenc tune`` in the middle of a prefill exited 143 with no line: now one line on stderr
    naming the cells folder, exit 143, the stored cells whole, no temp file, and the resume runs only the rest."""
    import signal
    import time
    from pathlib import Path

    out, ready = tmp_path / "out", tmp_path / "ready"
    root = Path(__file__).resolve().parents[3]
    p = subprocess.Popen([sys.executable, "-c", _SIGNALLED, str(tiny), str(out), str(ready)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=str(root))
    deadline = time.monotonic() + 600
    while not ready.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready.exists(), p.communicate()[1][-3000:]
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 143, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("posenc")]
    assert lines == [f"posenc: interrupted by SIGTERM: the finished cells are kept in {out / 'cells'}; run the same "
                     "command to continue from them"], stderr[-3000:]
    assert "Traceback" not in stderr and stdout == ""
    assert len(list((out / "cells").glob("*.json"))) == 2 and list((out / "cells").glob(".*.tmp")) == []
    assert not (out / "results.json").exists()
    res = tune(tiny, N, out, **_KW)
    assert res["meta"]["forwards_run"] == 1 and len(res["rows"]) == 3
