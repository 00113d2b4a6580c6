"""``posenc extend`` (and ``posenc eval --hf-model`` on what it saved): tiny random models and the bundled GGUF model,
bad input, and the printed way to load the result."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from posenc.hf.source import bundled_gguf, load_tokenizer

transformers = pytest.importorskip("transformers")

from posenc._util import assert_close  # noqa: E402
from posenc.hf import patch as hf  # noqa: E402
from tests.support.tiny_hf import L, ids, make_model  # noqa: E402


def test_cli_extend_and_hf_eval(tmp_path, capsys):
    from posenc.cli import main
    from posenc.evals.pretrained import evaluate_hf
    from posenc.hf.export import byte_tokenizer

    model = make_model("llama")
    model.save_pretrained(tmp_path / "base")
    byte_tokenizer().save_pretrained(tmp_path / "base")  # the model's own tokenizer (ids < 257 <= vocab 300)
    x = ids(n=20)
    # transformers-native method: the saved dir is plain transformers with rope_parameters
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "yarn", "--factor", "4",
                 "--save", str(tmp_path / "yarn")]) == 0
    cfg = json.loads((tmp_path / "yarn" / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "yarn" and "posenc" not in cfg
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "yarn").eval()
    # engine method: a posenc section that posenc.hf.load re-applies
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "rerope", "--window", "8",
                 "--save", str(tmp_path / "rerope")]) == 0
    cfg = json.loads((tmp_path / "rerope" / "config.json").read_text())
    assert cfg["posenc"]["method"] == "rerope" and cfg["posenc"]["params"] == {"window": 8}
    loaded = hf.load(tmp_path / "rerope")
    expect = hf.extend(make_model("llama"), "rerope", window=8)
    with torch.no_grad():
        # (plain from_pretrained picks sdpa attention, the tiny models eager: float rounding only)
        yarn = hf.extend(make_model("llama"), "yarn", factor=4.0)
        assert_close(plain(x).logits, yarn(x).logits, rtol=1e-5, atol=1e-5)
        assert_close(loaded(x).logits, expect(x).logits, rtol=1e-5, atol=1e-5)

    text = "The grass is green. The sky is blue. " * 12
    (tmp_path / "t.txt").write_text(text)
    capsys.readouterr()  # drop the extend commands' output
    out_json = tmp_path / "hf.json"
    assert main(["eval", "--hf-model", str(tmp_path / "base"), "--text", str(tmp_path / "t.txt"),
                 "--lengths", "16", "32", "--methods", "none", "dynamic_ntk", "rerope", "--factor", "2",
                 "--max-windows", "1", "--json", str(out_json), "--report", str(tmp_path / "rep")]) == 0
    assert "dynamic_ntk" in capsys.readouterr().out  # the lab's table
    for name in ("results.json", "report.md", "report.html", "ppl_vs_length.png"):  # and the lab's report
        assert (tmp_path / "rep" / name).stat().st_size > 0
    rows = json.loads(out_json.read_text())
    assert [(r["method"], r["eval_len"]) for r in rows] == [(m, n) for m in ("none", "dynamic_ntk", "rerope")
                                                           for n in (16, 32)]
    assert all(r["status"] == "ok" and r["ppl"] > 1 and r["scheme"] == "llama" and r["train_len"] == L
               for r in rows)
    # passkey scoring and error records
    recs = evaluate_hf(tmp_path / "base", text=text, lengths=[400], methods=["yarn", "bogus"],
                       params={"factor": 2.0}, max_windows=1, passkey_trials=1)
    assert recs[0]["status"] == "ok" and recs[0]["passkey"] in (0.0, 1.0)
    assert recs[1]["status"] == "error" and "unknown method" in recs[1]["note"]

LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0)


def _llama(cfg=None):
    torch.manual_seed(0)
    cfg = cfg or transformers.LlamaConfig(**LLAMA)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


# ===================================================================== the CLI: non-zero exit and the message
@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    _llama().save_pretrained(d)
    return d


def test_cli_missing_model_in_a_process(tmp_path):
    r = subprocess.run([sys.executable, "-m", "posenc", "extend", "--model", "/nope", "--method", "yarn",
                        "--factor", "4", "--save", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "/nope" in r.stderr and "Traceback" not in r.stderr


def _cli(capsys, *args):
    from posenc.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing_model", "missing_hf_model", "nan_factor", "gpt2", "string_factor"])
def test_cli_bad_input(case, tmp_path, gpt2_dir, llama_dir, capsys):
    out = tmp_path / "out"
    args, word = {
        "missing_model": (["extend", "--model", "/nope", "--method", "yarn", "--factor", "4", "--save", out], "/nope"),
        "missing_hf_model": (["eval", "--hf-model", "/nope", "--text", __file__, "--lengths", "16"], "/nope"),
        "nan_factor": (["extend", "--model", llama_dir, "--method", "yarn", "--factor", "nan", "--save", out],
                       "factor"),
        "gpt2": (["extend", "--model", gpt2_dir, "--method", "yarn", "--factor", "4", "--save", out], "rotary"),
        "string_factor": (["extend", "--model", llama_dir, "--method", "yarn", "--param", 'factor="4"', "--save", out],
                          "factor"),
    }[case]
    rc, err = _cli(capsys, *args)
    assert rc != 0 and word in err
    assert not out.exists()


def test_cli_extend_prints_how_to_load_the_result(tmp_path, capsys):
    from posenc.cli import main

    _llama().save_pretrained(tmp_path / "base")
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "rerope", "--window", "16",
                 "--save", str(tmp_path / "e")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "posenc.hf.load(" in out["load"] and "trust_remote_code=True" in out["load"]
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "yarn", "--factor", "4",
                 "--save", str(tmp_path / "n")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["max_position_embeddings"] == 256 and "trust_remote_code" not in out["load"]


def test_cli_extend_and_eval_take_the_gguf_model(tmp_path, capsys):
    """`posenc extend --model smollm2` saves the extended model with its tokenizer and chat template;
    `posenc eval --hf-model <file.gguf>` scores text with the model's own tokenizer."""
    import json

    from posenc.cli import main

    assert main(["extend", "--model", "smollm2", "--method", "yarn", "--factor", "2", "--save",
                 str(tmp_path / "yarn")]) == 0
    saved = tmp_path / "yarn"
    assert (saved / "chat_template.jinja").is_file() and (saved / "tokenizer.json").is_file()
    assert json.loads((saved / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"
    assert load_tokenizer(saved).chat_template == load_tokenizer("smollm2").chat_template
    (tmp_path / "t.txt").write_text("The grass is green. The sky is blue. The sun is yellow. " * 40)
    capsys.readouterr()
    assert main(["eval", "--hf-model", str(bundled_gguf("smollm2")), "--text", str(tmp_path / "t.txt"),
                 "--lengths", "64", "128", "--methods", "none", "--max-windows", "1", "--target", "16",
                 "--json", str(tmp_path / "r.json")]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["tokens"] for r in rows] == [16, 16] and all(1 < r["ppl"] < 20 for r in rows)  # repeated text


# ===================================================================== --out: nothing overwritten, nothing half-saved
def test_cli_extend_refuses_an_out_folder_holding_a_model(tmp_path, llama_dir, capsys):
    """``extend --out DIR`` where DIR holds a model: one line naming DIR, status 2, the old model byte for byte."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "llama"}')
    (out / "model.safetensors").write_bytes(b"old weights")
    rc, err = _cli(capsys, "extend", llama_dir, "--method", "yarn", "--factor", "4", "--out", out)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and str(out) in err and "already holds files" in err, err
    assert (out / "config.json").read_text() == '{"model_type": "llama"}'
    assert (out / "model.safetensors").read_bytes() == b"old weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_cli_extend_refuses_out_equal_to_the_model(llama_dir, capsys):
    before = {p.name: p.read_bytes() for p in llama_dir.iterdir()}
    rc, err = _cli(capsys, "extend", llama_dir, "--method", "rerope", "--window", "8", "--out", llama_dir)
    assert rc == 2 and "already holds files" in err, err
    assert {p.name: p.read_bytes() for p in llama_dir.iterdir()} == before  # the source is not turned into a wrapper


def test_a_save_that_fails_leaves_no_folder(tmp_path, llama_dir, capsys, monkeypatch):
    """A full disk in the middle of saving (the weights written, the wrapper config not): nothing at --out, no
    staging folder left, one line naming the problem."""
    from posenc.hf import saved

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(saved, "wrap_config", full_disk)
    out = tmp_path / "out"
    rc, err = _cli(capsys, "extend", llama_dir, "--method", "rerope", "--window", "8", "--out", out)
    assert rc != 0 and "No space left" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []
