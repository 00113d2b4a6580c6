"""``posenc bench --out``: a file, or a folder holding another command's results, is refused in one line naming --out
before anything is loaded or trained (the results there are kept); a real-model preset is stopped by a signal in
tests/evals/suite/test_grid.py."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_one_line_error, run_cli


@pytest.mark.parametrize("preset", ["quick", "smollm2"])
def test_bench_out_that_is_a_file_is_one_line(preset, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    rc, err = run_cli(["bench", "--preset", preset, "--out", afile, "--quiet"], capsys)
    assert_one_line_error(rc, err, f"--out {str(afile)!r} exists and is not a folder")
    assert afile.read_text() == "keep"


@pytest.mark.parametrize("preset, meta, match", [
    ("smollm2", {"model_id": "m", "length": 512, "budget_forwards": 4}, "holds the results of posenc tune"),
    ("quick", {"preset": "smollm2", "model_id": "m"}, "holds the results of posenc bench (real-model preset)"),
    ("smollm2", {"preset": "quick", "runs_dir": "r"}, "holds the results of posenc bench (lab preset)"),
    ("smollm2", {"preset": "smollm2_full", "model_id": "m"}, "(preset 'smollm2_full'; this one: preset 'smollm2')"),
    ("quick", {"command": "posenc eval"}, "holds the results of posenc eval"),
])
def test_bench_out_holding_other_results_is_refused_and_kept(preset, meta, match, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"meta": meta}))
    (out / "report.md").write_text("# theirs")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, err = run_cli(["bench", "--preset", preset, "--out", out, "--quiet"], capsys)
    assert_one_line_error(rc, err, match)
    assert f"--out {str(out)!r}" in err and {p.name: p.read_bytes() for p in out.iterdir()} == before


def _tiny(root, length):
    import torch
    import transformers

    from posenc.hf.export import byte_tokenizer

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=length)
    transformers.LlamaForCausalLM(cfg).save_pretrained(root)
    byte_tokenizer().save_pretrained(root)
    return root


def test_bench_model_runs_the_suite_at_the_models_lengths_or_refuses_in_one_line(tmp_path, capsys):
    """``posenc bench --model M`` is the suite at L/2..4L of M's trained length: a model trained at 64 tokens cannot
    hold the keys at 32 (one line naming --lengths); with --lengths it reaches the reference, which a random model
    does not pass (one line naming the floor). Neither prints an effective length."""
    model = _tiny(tmp_path / "m64", 64)
    capsys.readouterr()
    rc, err = run_cli(["bench", "--model", model, "--out", tmp_path / "a", "--quiet"], capsys)
    assert_one_line_error(rc, err, "model trained at 64 tokens: the context noise:keys does not fit its length 32")
    assert "--lengths" in err and "effective length" not in err
    model = _tiny(tmp_path / "m1024", 1024)  # holds the keys at its trained length, finds none of them
    capsys.readouterr()
    rc, err = run_cli(["bench", "--model", model, "--lengths", "2048", "--out", tmp_path / "b", "--quiet"], capsys)
    assert_one_line_error(rc, err, "at its trained length 1024, below the floor 0.5")
    assert "effective length" not in err and not (tmp_path / "b" / "results.json").exists()


@pytest.mark.parametrize("value", ["", "8k", "0,1024"])
def test_bench_lengths_must_be_positive_counts(value, tmp_path, capsys):
    model = _tiny(tmp_path / "m", 64)
    capsys.readouterr()
    rc, err = run_cli(["bench", "--model", model, "--lengths", value, "--out", tmp_path / "o", "--quiet"], capsys)
    assert_one_line_error(rc, err, "--lengths")


def test_bench_lengths_is_for_the_real_model_presets(tmp_path, capsys):
    rc, err = run_cli(["bench", "--preset", "quick", "--lengths", "1024", "--out", tmp_path / "o", "--quiet"], capsys)
    assert_one_line_error(rc, err, "--lengths is for the real-model presets")
