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


# ===================================================================== a user's first hour, round 2
def _one_error(rc, err, *parts):
    """Status 2, one ``posenc: error:`` line holding every part, no traceback (transformers' loading bars aside)."""
    errors = [ln for ln in err.splitlines() if ln.startswith("posenc: error")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert all(p in errors[0] for p in parts), err


def _tiny(tmp_path, arch, tokenizer=True):
    from posenc.hf.export import byte_tokenizer

    d = tmp_path / f"tiny-{arch}"
    make_model(arch).save_pretrained(d)
    if tokenizer:
        byte_tokenizer().save_pretrained(d)
    return d


def test_phi3_yarn_saves_on_posenc_engine_and_reloads_equal(tmp_path, capsys):
    """49.2: ``posenc extend tiny-phi3 --method yarn --factor 4 --out D`` crashed at save time (Phi3Config accepts only
    longrope): with --native auto it now runs on posenc's engine, saves, and reloads to the same logits."""
    src = _tiny(tmp_path, "phi3")
    out = tmp_path / "D"
    rc, err = _cli(capsys, "extend", src, "--method", "yarn", "--factor", "4", "--out", out)
    assert rc == 0, err
    record = json.loads((out / "posenc.json").read_text())
    assert record["method"] == "yarn" and record["native"] is False and record["resolved"]["factor"] == 4
    model = hf.extend(make_model("phi3"), "yarn", factor=4)
    with torch.no_grad():
        assert torch.equal(hf.load(out)(ids(n=40)).logits, model(ids(n=40)).logits)


def test_phi3_yarn_native_yes_is_one_line_and_writes_nothing(tmp_path, capsys):
    src = _tiny(tmp_path, "phi3")
    rc, err = _cli(capsys, "extend", src, "--method", "yarn", "--factor", "4", "--native", "yes", "--out",
                   tmp_path / "D")
    _one_error(rc, err, "does not accept rope_type 'yarn'", "--native no")
    assert not (tmp_path / "D").exists()


@pytest.mark.parametrize("method, given, resolved", [
    ("selfextend", [], {"group": 8, "window": 8}),  # the registry's rule for 64 tokens on a model trained at 16
    ("yarn", ["--factor", "4"], {"factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0}),
    ("yarn", [], {"factor": 4.0}),  # from --length alone
])
def test_saved_model_records_method_resolved_params_and_target_length(tmp_path, capsys, method, given, resolved):
    """49.4: SelfExtend's saved record was ``"params": {}, "max_position_embeddings": null``. Now ``posenc.json`` holds
    the method, every parameter's value and the target length; eval labels its rows with the method; ``posenc
    schemes --model`` prints it."""
    src = _tiny(tmp_path, "llama")
    out = tmp_path / "D"
    rc, err = _cli(capsys, "extend", src, "--method", method, *given, "--length", 4 * L, "--out", out)
    assert rc == 0, err
    record = json.loads((out / "posenc.json").read_text())
    assert record["method"] == method and record["trained_length"] == L and record["target_length"] == 4 * L
    assert {k: record["resolved"][k] for k in resolved} == resolved
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    rc, err = _cli(capsys, "eval", out, "--text", text, "--lengths", 32, "--out", tmp_path / "ev")
    assert rc == 0, err
    rows = json.loads((tmp_path / "ev" / "results.json").read_text())["records"]
    assert [r["method"] for r in rows] == [method] and rows[0]["saved"] is True
    assert {k: rows[0]["params"][k] for k in resolved} == resolved
    from posenc.cli import main

    capsys.readouterr()
    assert main(["schemes", "--model", str(out)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["extended"]["method"] == method and shown["trained_length"] == L


def test_suite_and_tune_refuse_a_saved_extended_model_naming_its_method(tmp_path):
    from posenc.evals.suite.spec import load_facts

    out = hf.save(hf.extend(make_model("llama"), "selfextend", target_length=4 * L), tmp_path / "D")
    with pytest.raises(ValueError, match=r"saved extended by posenc with selfextend \(group=8, window=8; trained 16, "
                                         r"target 64\).*give the model it was extended from"):
        load_facts(out)


def test_a_model_without_tokenizer_is_saved_without_one(tmp_path, capsys):
    """49.5: extend wrote a one-entry tokenizer.json for a model with no tokenizer (Qwen2: ``tok('hello world') ==
    []``). Now no tokenizer file is written, and loading its tokenizer is refused in one line."""
    from posenc.hf.source import NoTokenizerError

    src = _tiny(tmp_path, "qwen2", tokenizer=False)
    out = tmp_path / "D"
    rc, err = _cli(capsys, "extend", src, "--method", "yarn", "--factor", "2", "--out", out)
    assert rc == 0, err
    assert not any((out / n).exists() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
    with pytest.raises(NoTokenizerError, match="has no tokenizer of its own"):
        load_tokenizer(src)


def test_tune_on_a_model_without_tokenizer_is_one_line(tmp_path, capsys):
    src = _tiny(tmp_path, "qwen2", tokenizer=False)
    rc, err = _cli(capsys, "tune", src, "--length", 4 * L, "--out", tmp_path / "t")
    _one_error(rc, err, "has no tokenizer of its own")


# ===================================================================== reliability, round 4: saving under faults
def test_a_truncated_tokenizer_json_is_refused_naming_it(tmp_path, capsys):
    """50.9: ``extend`` on a model whose tokenizer.json is truncated exited 0 and wrote no tokenizer."""
    src = _tiny(tmp_path, "llama")
    tj = src / "tokenizer.json"
    tj.write_bytes(tj.read_bytes()[: len(tj.read_bytes()) // 2])
    rc, err = _cli(capsys, "extend", src, "--method", "yarn", "--factor", "2", "--out", tmp_path / "D")
    _one_error(rc, err, f"{tj} is damaged")
    assert not (tmp_path / "D").exists()


def test_a_malicious_pickle_is_refused_in_one_line_and_runs_nothing(tmp_path, capsys):
    """50.12: a folder whose only weights are a ``pytorch_model.bin`` whose pickle runs a command: nothing runs
    (weights_only), and the refusal is one line naming the file (it was a 33-line UnpicklingError)."""
    import os
    import pickle

    src = tmp_path / "evil"
    make_model("llama").config.save_pretrained(src)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (src / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    rc, err = _cli(capsys, "extend", src, "--method", "yarn", "--factor", "2", "--out", tmp_path / "D")
    _one_error(rc, err, "pytorch_model.bin")
    assert not marker.exists() and not (tmp_path / "D").exists()


def test_posenc_reads_its_saved_form_without_executing_the_folder(tmp_path, capsys, monkeypatch):
    """50.5: eval/tune/bench on a folder written by ``extend`` (engine form) asked transformers' "run the custom
    code? [y/N]"; answering y executed the folder's posenc_extended.py. posenc now reads its own format through
    posenc: the folder's file is never executed and nothing is asked."""
    import builtins

    src = _tiny(tmp_path, "llama")
    out = tmp_path / "D"
    rc, err = _cli(capsys, "extend", src, "--method", "selfextend", "--length", 4 * L, "--out", out)
    assert rc == 0, err
    marker = tmp_path / "executed"
    (out / "posenc_extended.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")

    def no_prompt(*a, **k):
        raise AssertionError("posenc asked a question")

    monkeypatch.setattr(builtins, "input", no_prompt)
    tok = load_tokenizer(out)
    assert tok("hello")["input_ids"]
    model = hf.load(out)
    assert model._posenc_extended["method"] == "selfextend"
    text = tmp_path / "t.txt"
    text.write_text("a b c d e f g " * 40)
    rc, err = _cli(capsys, "eval", out, "--text", text, "--lengths", 32)
    assert rc == 0, err
    rc, err = _cli(capsys, "tune", out, "--length", 4 * L, "--out", tmp_path / "t")
    _one_error(rc, err, "saved extended by posenc with selfextend")
    assert not marker.exists()


def test_a_full_disk_while_saving_keeps_the_previous_model(tmp_path):
    """50.3 with a real full file system (a small tmpfs in a user+mount namespace): ``extend`` into a folder on a
    disk that fills up is one line naming the folder; the model already on that disk is intact, nothing else is
    left there. The injected-fault test above (test_a_save_that_fails_leaves_no_folder) covers machines without
    namespaces."""
    import os
    import shutil

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("user namespaces are not available here; test_a_save_that_fails_leaves_no_folder covers the path")
    src = _tiny(tmp_path, "llama")
    size = sum(p.stat().st_size for p in src.iterdir())
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size={int(size * 1.6)} tmpfs {disk} && cp -r {src} {disk}/old && "
              f"sha256sum {disk}/old/* > {tmp_path}/before && "
              f"{sys.executable} -m posenc extend {disk}/old --method rerope --window 8 --out {disk}/new; "
              f"echo rc=$?; sha256sum {disk}/old/* > {tmp_path}/after; ls -A {disk}")
    env = {**os.environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[2])}
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "rc=2" in proc.stdout, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("posenc: error")]
    assert len(errors) == 1 and f"{disk}/new" in errors[0] and "No space left" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "before").read_text() == (tmp_path / "after").read_text()
    assert proc.stdout.split("rc=2")[1].split() == ["old"]  # no new/, no staging folder left


def test_a_kill_between_the_weights_and_the_wrapper_leaves_no_loadable_folder(tmp_path):
    """50.4: a SIGKILL after ``save_pretrained`` and before the wrapper config is written left a plain ``llama``
    folder that ``from_pretrained`` loaded without the method. Now the target never appears (only a staging folder,
    which the next save of that target removes)."""
    src = _tiny(tmp_path, "llama")
    out = tmp_path / "D"
    code = ("import os, signal, sys\n"
            "from posenc.hf import saved\n"
            "def die(*a, **k):\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "saved.wrap_config = die\n"
            "from posenc.cli import main\n"
            f"main(['extend', {str(src)!r}, '--method', 'rerope', '--window', '8', '--out', {str(out)!r}])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    assert not out.exists()
    stale = [p.name for p in tmp_path.iterdir() if p.name.startswith(".D.staging-")]
    assert len(stale) == 1 and (tmp_path / stale[0] / "model.safetensors").is_file()
    hf.save(hf.extend(make_model("llama"), "rerope", window=8), out)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert json.loads((out / "config.json").read_text())["model_type"] == "posenc_extended"


def test_extend_says_the_size_it_wrote(tmp_path, capsys):
    """The printed record says how big the saved folder is and in which dtype (a .gguf source also says it was
    de-quantized: tests/repo/test_readme.py runs the README's command on the bundled model)."""
    from posenc.cli import main

    make_model("llama").save_pretrained(tmp_path / "base")
    capsys.readouterr()
    assert main(["extend", str(tmp_path / "base"), "--method", "yarn", "--factor", "2", "--out", str(tmp_path / "y"),
                 "--quiet"]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["size"]
    on_disk = sum(p.stat().st_size for p in (tmp_path / "y").rglob("*") if p.is_file())
    assert said == f"{on_disk / 1e6:.0f} MB on disk, weights in float32", said


# ===================================================================== --format gguf: llama.cpp's copy of the GGUF
@pytest.mark.parametrize("case", ["folder_model", "engine_method", "composition", "native_no", "out_exists"])
def test_format_gguf_refusals_are_one_line_naming_the_flag(case, tmp_path, llama_dir, capsys):
    (tmp_path / "taken.gguf").write_bytes(b"x")
    args, word = {
        "folder_model": ([llama_dir, "--method", "yarn", "--factor", "2"], "needs a .gguf MODEL"),
        "engine_method": (["smollm2", "--method", "selfextend"], "runs on posenc's engine"),
        "composition": (["smollm2", "--method", "yarn+logn"], "runs on posenc's engine"),
        "native_no": (["smollm2", "--method", "yarn", "--native", "no"], "--native no"),
        "out_exists": (["smollm2", "--method", "yarn"], "exists"),
    }[case]
    out = tmp_path / ("taken.gguf" if case == "out_exists" else "y.gguf")
    rc, err = _cli(capsys, "extend", *args, "--format", "gguf", "--out", out)
    assert rc == 2 and word in err and ("--format gguf" in err or "--out" in err), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "y.gguf").exists()


@pytest.mark.slow
def test_format_gguf_writes_the_bundled_models_copy_and_prints_how_to_serve_it(tmp_path, capsys):
    """`posenc extend smollm2 --method yarn --length 16384 --format gguf`: the source's quantised tensors, YaRN's
    keys, posenc's record, and the llama.cpp lines printed."""
    import gguf

    from posenc.cli import main

    out = tmp_path / "y.gguf"
    capsys.readouterr()
    assert main(["extend", "smollm2", "--method", "yarn", "--length", "16384", "--format", "gguf",
                 "--out", str(out)]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["llama-server"] == f"llama-server -m {out} -c 16384" and said["params"]["factor"] == 2.0
    assert said["flags_on_the_source"].endswith("-c 16384 --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 8192")
    r = gguf.GGUFReader(str(out))
    assert r.get_field("llama.rope.scaling.type").contents() == "yarn"
    assert r.get_field("llama.rope.scaling.factor").contents() == 2.0
    assert r.get_field("llama.rope.scaling.original_context_length").contents() == 8192
    assert r.get_field("posenc.method").contents() == "yarn"
    src = gguf.GGUFReader(str(bundled_gguf("smollm2")))
    assert [(t.name, t.tensor_type, t.data.tobytes()) for t in src.tensors] == \
        [(t.name, t.tensor_type, t.data.tobytes()) for t in r.tensors]
