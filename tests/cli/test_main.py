"""Every ``posenc`` subcommand answers a bad value with ONE line ``posenc: error: <message>`` on stderr and
exit status 2, no traceback (the handler of :func:`posenc.cli.main`). Most cases call ``posenc.cli.main``
in-process (fast); a few run the real command in a subprocess to prove there is no traceback and that
``POSENC_DEBUG=1`` gives one. The cases of one subcommand's own flags are in that subcommand's file here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc import cli
from tests.support.cli import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parents[2]




NO = "/nonexistent/posenc-run"

CASES = [
    # schemes
    (["schemes", "rope", "--param", "bogus=1"], "does not take parameter 'bogus'"),
    (["schemes", "alibi", "--param", "bogus=1"], "bias 'alibi' does not take parameter(s) ['bogus']"),
    (["schemes", "ropee"], "unknown preset 'ropee'"),
    (["schemes", "sliding_window", "--train-len", "64", "--param", "window=0"],
     "sliding_window.window must be an integer >= 1, got 0"),
    (["schemes", "bca", "--train-len", "64", "--param", "block=0"], "bca.block must be an integer >= 1, got 0"),
    (["schemes", "yarn", "--train-len", "64", "--param", "factor=0.5"], "yarn.factor must be >= 1.0, got 0.5"),
    (["schemes", "yarn", "--train-len", "64", "--param", 'factor="4"'], "yarn.factor must be a finite number"),
    (["schemes", "yarn", "--train-len", "64", "--param", "factor"], "--param expects KEY=VALUE"),
    (["schemes", "yarn"], "give --train-len L"),
    (["schemes", "yrn", "--train-len", "64"], "unknown preset 'yrn' (did you mean 'yarn'?)"),
    # train (nothing may be written)
    (["train", "--out", NO, "--param", "bogus=1", "--steps", "1"], "does not take parameter 'bogus'"),
    (["train", "--out", NO, "--scheme", "alibi", "--param", "bogus=1"], "does not take parameter(s) ['bogus']"),
    (["train", "--out", NO, "--scheme", "superrope"], "unknown preset 'superrope'"),
    (["train", "--out", NO, "--device", "bogus"], "--device must be a torch device"),
    (["train", "--out", NO, "--steps", "0"], "--steps must be a positive integer, got 0"),
    (["train", "--out", NO, "--lr", "nan"], "--lr must be a finite number"),
    (["train", "--out", NO, "--lr", "1e-5"], "--min-lr (0.0001) must be <= --lr (1e-05)"),
    (["train", "--out", NO, "--warmup", "-1"], "--warmup must be a non-negative integer"),
    (["train", "--out", NO, "--init", NO, "--scheme", "rope", "--method", "pi"], "give --method, not --scheme"),
    (["train"], "--out DIR is required"),
    (["train", "--out", NO, "--corpus", "/nonexistent/corpus.txt", "--steps", "1"],
     "unknown corpus '/nonexistent/corpus.txt'"),
    (["train", "--out", NO, "--corpus", "gutenbrg", "--steps", "1"], "unknown corpus 'gutenbrg' (did you mean"),
    # perf
    (["perf", "bogus"], "unknown benchmark 'bogus'"),
    (["perf", "bench_rop"], "unknown benchmark 'bench_rop' (did you mean 'bench_rope'?)"),
    # eval (checked before the checkpoint or the corpus is read)
    (["eval", NO, "--method", "superrope"], "unknown method 'superrope'"),
    (["eval", NO, "--method", "yrn"], "unknown method 'yrn' (did you mean 'yarn'?)"),
    (["eval", NO, "--method", "rerope+lgn"], "unknown method 'rerope+lgn' (did you mean 'logn'?)"),
    (["eval", NO, "--lengths", "0"], "--lengths must be an integer >= 1, got 0"),
    (["eval", NO, "--lengths", "64", "-5"], "--lengths must be an integer >= 1, got -5"),
    (["eval", NO, "--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
    (["eval", NO, "--max-windows", "-1"], "--max-windows must be an integer >= 1, got -1"),
    (["eval", NO, "--device", "bogus"], "--device must be a torch device"),
    (["eval", NO], "MODEL '/nonexistent/posenc-run' is not a run folder of `posenc train`"),
    (["eval", "smolm2"], "(did you mean 'smollm2'?)"),
    (["eval"], "give the MODEL to evaluate"),
    # plot
    (["plot", "decy"], "invalid choice: 'decy'"),
    (["plot", "decy"], "(did you mean 'decay'?)"),
    (["plot", "rotations", "--out", "/tmp", "--head-dim", "0"], "--head-dim must be an integer >= 2"),
    (["plot", "rotations", "--out", "/tmp", "--base", "0"], "--base must be"),
    # generate / bench
    (["generate", NO, "--prompt", "hi"], "model '/nonexistent/posenc-run' is neither a folder, a .gguf file, nor a "
                                         "bundled model"),
    (["generate", "smolm2", "--prompt", "hi"], "model 'smolm2' (did you mean 'smollm2'?)"),
    (["extend", "smolm2", "--method", "yarn", "--factor", "2", "--out", NO],
     "model 'smolm2' (did you mean 'smollm2'?)"),
    (["generate", NO, "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1, got 0"),
    (["generate", NO, "--prompt", "hi", "--max-new-tokens", "-2"], "--max-new-tokens must be an integer >= 1"),
    (["generate", NO, "--prompt", "hi", "--param", "x"], "--param expects KEY=VALUE"),
    (["bench", "--out", NO, "--device", "bogus"], "device must be a torch device"),
    (["bench", "--out", NO, "--threads", "0"], "threads must be an integer >= 1, got 0"),
    (["bench", "--out", NO, "--preset", "quik"], "(did you mean 'quick'?)"),
    (["bench", "--out", NO, "--preset", "smollm2", "--seed", "3"], "--seed is for the lab presets"),
    (["bench", "--out", NO, "--preset", "smollm2", "--dtype", "bf16"], "invalid choice: 'bf16'"),
    (["bench", "--out", NO, "--preset", "smollm2", "--device", "bogus"], "--device must be a torch device"),
    (["bench", "--out", NO, "--dtype", "float16"], "--dtype float16 is for the real-model presets"),
    (["tune", NO, "--length", "64", "--out", NO, "--device", "bogus"], "--device must be a torch device"),
    (["tune", NO, "--length", "64", "--out", NO, "--dtype", "fp16"], "invalid choice: 'fp16'"),
    (["bnech", "--out", NO], "invalid choice: 'bnech'"),
    (["bnech", "--out", NO], "(did you mean 'bench'?)"),
    (["train", "--out", NO, "--stpes", "3"], "unrecognized arguments: --stpes 3"),
    (["extend", NO], "posenc extend needs --method SPEC"),
    (["extend", NO, "--method", "yarn"], "posenc extend needs --out DIR"),
    (["extend", NO, "--model", NO, "--method", "yarn", "--out", NO], "give MODEL or the old --model, not both"),
    (["data", "gutenbrg"], "unknown corpus 'gutenbrg' (did you mean 'gutenberg'?)"),
    # compat: an empty list is a mistake, not "every family"
    (["compat", "--families", ""], "--families must name at least one transformers family"),
    (["compat", "llama", "--families", "llama"], "give the families as positional arguments or the old --families"),
    (["compat", "--families", " , "], "--families must name at least one transformers family"),
    (["compat", ""], "each FAMILY must name a transformers family (e.g. llama gemma3), got ['']"),
    (["compat", "llama", " "], "each FAMILY must name a transformers family (e.g. llama gemma3), got ['llama', ' ']"),
]


@pytest.mark.parametrize("argv, match", CASES, ids=[" ".join(c[0][:4]) for c in CASES])
def test_bad_values_print_one_line_and_exit_2(argv, match, capsys):
    rc, err = run_cli(argv, capsys)
    assert_one_line_error(rc, err, match)
    assert not Path(NO).exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("argv", [["train", "--out", NO], ["eval", NO], ["bench", "--out", NO],
                                  ["bench", "--out", NO, "--preset", "smollm2"],
                                  ["tune", NO, "--length", "64", "--out", NO]])
def test_cuda_without_cuda_is_a_clear_error(argv, capsys):
    rc, err = run_cli(argv + ["--device", "cuda"], capsys)
    assert_one_line_error(rc, err, "'cuda' is not available on this machine")


@pytest.mark.parametrize("exc", [ValueError("bad\nvalue"), TypeError("bad type"), OSError(28, "No space left"),
                                 ModuleNotFoundError("No module named 'transformers'", name="transformers")])
def test_the_handler_prints_every_user_error_as_one_line(exc, monkeypatch, capsys):
    def fail(argv):
        raise exc

    monkeypatch.setattr(cli, "_run", fail)
    monkeypatch.delenv("POSENC_DEBUG", raising=False)
    rc, err = run_cli(["schemes"], capsys)
    assert_one_line_error(rc, err, " ".join(str(exc).split()))


def test_posenc_debug_re_raises(monkeypatch):
    monkeypatch.setenv("POSENC_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown preset 'ropee'"):
        cli.main(["schemes", "ropee"])


def test_other_errors_are_not_hidden(monkeypatch):
    def fail(argv):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_run", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["schemes"])


# ------------------------------------------------------------------------------------------------ real processes
def _posenc(*argv, debug=False, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k != "POSENC_DEBUG"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if debug:
        env["POSENC_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "posenc", *map(str, argv)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("argv, match", [
    (["schemes", "rope", "--param", "bogus=1"], "does not take parameter 'bogus'"),
    (["eval", NO, "--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
    (["perf", "bogus"], "unknown benchmark 'bogus'"),
    (["trian"], "(did you mean 'train'?)"),
])
def test_real_command_prints_no_traceback(argv, match):
    res = _posenc(*argv)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "Traceback" not in res.stderr
    assert res.stderr.startswith("posenc: error: ") and match in res.stderr


def test_real_command_with_posenc_debug_shows_the_traceback():
    res = _posenc("schemes", "rope", "--param", "bogus=1", debug=True)
    assert res.returncode == 1 and "Traceback" in res.stderr and "ValueError" in res.stderr


def test_ctrl_c_in_any_command_is_one_line_and_status_130(monkeypatch, capsys):
    import posenc.cli.schemes as schemes

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(schemes, "run", interrupted)
    monkeypatch.setattr(cli, "build_parser", _parser_with(schemes, interrupted))
    assert cli.main(["schemes"]) == 130
    assert capsys.readouterr().err.strip() == "posenc: interrupted"


def _parser_with(module, func):
    real = cli.build_parser

    def build(names=None):
        parser = real(names)
        parser.set_defaults(func=func)
        return parser

    return build


# ------------------------------------------------------------------------------ a path the user typed, named
def test_a_missing_file_names_its_flag_and_path(capsys):
    """``--text /nonexistent.txt``: one line naming the flag and the path, not a bare ``[Errno 2]``; nothing loaded."""
    missing = "/nonexistent/posenc-text.txt"
    rc, err = run_cli(["eval", "smollm2", "--text", missing], capsys)
    assert_one_line_error(rc, err, f"--text {missing}: No such file or directory")
    rc, err = run_cli(["eval", "smollm2", f"--text={missing}"], capsys)
    assert_one_line_error(rc, err, f"--text {missing}: No such file or directory")
    assert not Path(missing).exists()


def test_an_os_error_about_another_path_keeps_its_own_message(monkeypatch, capsys):
    def fail(argv):
        raise FileNotFoundError(2, "No such file or directory", "/somewhere/else")

    monkeypatch.setattr(cli, "_run", fail)
    rc, err = run_cli(["eval", "x", "--text", "/a.txt"], capsys)
    assert_one_line_error(rc, err, "[Errno 2] No such file or directory: '/somewhere/else'")


def test_real_command_names_the_missing_text_file():
    res = _posenc("eval", "smollm2", "--text", "/nonexistent.txt")
    assert res.returncode == 2 and res.stderr.strip() == "posenc: error: --text /nonexistent.txt: No such file or " \
                                                        "directory", res.stderr


# ------------------------------------------------------------------------------ --quiet: the libraries' bars too
def _tiny_folder(path):
    from tests.support.tiny_hf import make_model

    make_model("llama").save_pretrained(path)
    return path


@pytest.mark.parametrize("quiet", [False, True])
def test_quiet_hides_the_bars_of_transformers(quiet, tmp_path, capsys, monkeypatch):
    """transformers' "Loading weights" and "Writing model shards" bars: shown without --quiet, hidden with it, and as
    they were after the command (the switch does not leak into the next command of the process)."""
    import transformers.utils.logging as tlog

    base = _tiny_folder(tmp_path / "base")
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    tlog.enable_progress_bar()
    capsys.readouterr()
    argv = ["extend", base, "--method", "yarn", "--factor", "2", "--out", tmp_path / "out"] + (["--quiet"] * quiet)
    rc, err = run_cli(argv, capsys)
    assert rc == 0, err
    shown = "Loading weights" in err or "Writing model shards" in err
    assert shown != quiet, err
    assert tlog.is_progress_bar_enabled() and os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") is None
