"""``posenc generate``: bad values on a real checkpoint, a checkpoint that still works, streaming."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import cli
from tests.support.cli import assert_one_line_error, run_cli


@pytest.mark.parametrize("extra, match", [
    (["--method", "superrope"], "unknown method 'superrope'"),
    (["--method", "yarn", "--param", "factor=0"], "yarn.factor must be >= 1.0, got 0"),
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
