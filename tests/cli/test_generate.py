"""``posenc generate``: bad values on a real checkpoint, a checkpoint that still works, streaming."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import cli
from tests.support.cli import assert_one_line_error, run_cli


@pytest.mark.parametrize("extra, match", [
    (["--method", "superrope"], "unknown method 'superrope'"),
    (["--method", "yarn", "--param", "factor=0"], "--param factor=0 is out of range for yarn: its factor must be >= 1"),
    (["--method", "pi"], "--method pi needs --factor F (pi's factor has no default)"),
    (["--temperature", "-1"], "--temperature must be"),
    (["--top-p", "0"], "--top-p must be"),
    (["--param", "factor=2"], "--param, --factor and --window need --method"),
    (["--window", "2"], "--param, --factor and --window need --method"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1"),
    (["--stream", "--chunk", "0"], "--chunk must be an integer >= 1"),
])
def test_generate_on_a_real_checkpoint_refuses_bad_values(run_dir, extra, match, capsys):
    rc, err = run_cli(["generate", run_dir, "--prompt", "hi", *extra], capsys)
    assert_one_line_error(rc, err, match)


def test_generate_on_a_real_checkpoint_still_works(run_dir, capsys):
    assert cli.main(["generate", str(run_dir), "--prompt", "hi", "--max-new-tokens", "2"]) == 0


def test_cli_generate_and_stream(tmp_path, capsys):
    from posenc.cli import main
    from posenc.models.checkpoint import save_checkpoint

    scheme = posenc.PositionScheme.preset("rope", train_len=16)
    cfg = posenc.LMConfig(vocab_size=257, dim=16, n_layers=1, n_heads=2, scheme=scheme, train_len=16)
    torch.manual_seed(0)
    save_checkpoint(tmp_path, posenc.TinyLM(cfg), cfg, extra={"tokenizer": {"name": "byte", "bos": True}})
    assert main(["generate", str(tmp_path), "--prompt", "hello", "--max-new-tokens", "5",
                 "--method", "yarn", "--param", "factor=2"]) == 0
    assert capsys.readouterr().out.startswith("hello")
    assert main(["generate", str(tmp_path), "--prompt", "abc", "--stream", "--stream-tokens", "300",
                 "--param", "window=16", "--param", "n_sinks=2"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "RSS" in out


# -------------------------------------------------------------------- every model form the other commands take
def _hf_folder(path):
    """A tiny Llama with the byte tokenizer (ids < 257 <= vocab 300), saved as a plain Hugging Face folder."""
    from posenc.hf.export import byte_tokenizer
    from tests.support.tiny_hf import make_model

    make_model("llama").save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _greedy_text(folder, prompt: str, n: int, method=None, **params) -> str:
    """What transformers' own greedy decoding continues ``prompt`` with (the reference)."""
    from posenc.hf import patch
    from posenc.hf.source import load_source

    model, tok = load_source(folder)
    if method:
        patch.extend(model, method, **params)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)


def test_generate_takes_a_hugging_face_folder_and_what_extend_wrote(tmp_path, capsys):
    """``posenc generate`` on a Hugging Face folder, on the plain folder ``extend`` writes for YaRN and on the wrapper
    folder it writes for an engine method: the prompt then transformers' greedy continuation under the saved method,
    exit 0, the folders untouched; no "not a posenc checkpoint folder", no advice to delete anything."""
    base = _hf_folder(tmp_path / "base")
    assert cli.main(["extend", str(base), "--method", "yarn", "--factor", "2", "--out", str(tmp_path / "yarn"),
                     "--quiet"]) == 0
    assert cli.main(["extend", str(base), "--method", "rerope", "--window", "8", "--out", str(tmp_path / "rerope"),
                     "--quiet"]) == 0
    capsys.readouterr()
    for folder, method, params in ((base, None, {}), (tmp_path / "yarn", None, {}), (tmp_path / "rerope", None, {}),
                                   (base, "selfextend", {"group": 2, "window": 4})):
        before = _files(folder)
        argv = ["generate", folder, "--prompt", "hello world", "--max-new-tokens", "6", "--quiet"]
        argv += ["--method", method, *[f"--param={k}={v}" for k, v in params.items()]] if method else []
        assert cli.main([str(a) for a in argv]) == 0
        out, err = capsys.readouterr()
        assert out == "hello world" + _greedy_text(folder, "hello world", 6, method, **params) + "\n", (folder, out)
        assert "delete" not in err and "checkpoint" not in err, err
        assert _files(folder) == before


def test_generate_refuses_in_one_line_on_a_hugging_face_model(tmp_path, capsys):
    base = _hf_folder(tmp_path / "base")
    before = _files(base)
    capsys.readouterr()  # the save's own bars
    for extra, match in ((["--stream"], "--stream runs a run folder of `posenc train`"),
                         (["--method", "pi"], "--method pi needs --factor F"),
                         (["--method", "yran"], "unknown method 'yran' (did you mean 'yarn'?)"),
                         (["--factor", "2"], "--param, --factor and --window need --method")):
        rc, err = run_cli(["generate", base, "--prompt", "hi", *extra], capsys)
        assert_one_line_error(rc, err, match)
    assert _files(base) == before


@pytest.mark.slow
def test_generate_takes_the_bundled_model_and_its_gguf(capsys):
    """The README's model: by name and by its .gguf file, the same greedy text."""
    from posenc.hf.source import bundled_gguf

    outs = []
    for model in ("smollm2", str(bundled_gguf("smollm2"))):
        assert cli.main(["generate", model, "--prompt", "The capital of France is", "--max-new-tokens", "4",
                         "--quiet"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].startswith("The capital of France is") and len(outs[0]) > 26
