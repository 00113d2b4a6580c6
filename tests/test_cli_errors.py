"""Every ``posenc`` subcommand answers a bad value with ONE line ``posenc: error: <message>`` on stderr and
exit status 2, no traceback. Most cases call ``posenc.cli.main`` in-process (fast); a few run
the real command in a subprocess to prove there is no traceback and that ``POSENC_DEBUG=1`` gives one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc import cli
from posenc.models import checkpoint as ckpt
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.scheme.core import PositionScheme

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny byte-level checkpoint (vocab 257) written the way `posenc train` writes one."""
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=257, dim=16, n_layers=1, n_heads=2, scheme=PositionScheme.preset("rope", train_len=16),
                   train_len=16)
    path = tmp_path_factory.mktemp("cli") / "run"
    ckpt.save_checkpoint(path, TinyLM(cfg), cfg, {"step": 1, "finished": True},
                         extra={"tokenizer": {"name": "byte", "bos": True}, "corpus": "stdlib"})
    return path


def run_cli(argv, capsys) -> tuple[int, str]:
    rc = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    # INFO progress lines, and the one-line warnings of old spellings (test_old_spellings_warn_once checks those)
    lines = [ln for ln in err.splitlines() if not ln.startswith(("[posenc]", "posenc: warning: "))]
    return rc, "\n".join(lines)


def assert_one_line_error(rc, err, match):
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("posenc: error: "), err
    assert "Traceback" not in err
    assert match in err, err


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
    (["generate", NO, "--prompt", "hi"], "is not a posenc checkpoint folder"),
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


@pytest.mark.parametrize("extra, match", [
    (["--method", "superrope"], "unknown method 'superrope'"),
    (["--method", "yarn+nope"], "unknown method 'yarn+nope'"),
    (["--method", "yarn", "--window", "4"], "parameter(s) ['window'] are taken by none of the methods ['yarn']"),
    (["--lengths", "0"], "--lengths must be an integer >= 1, got 0"),
])
def test_eval_on_a_real_checkpoint_refuses_bad_values(run_dir, extra, match, capsys):
    rc, err = run_cli(["eval", run_dir, *extra], capsys)
    assert_one_line_error(rc, err, match)


def test_train_with_a_missing_corpus_writes_nothing(tmp_path, capsys):
    rc, err = run_cli(["train", "--out", tmp_path / "a" / "run", "--corpus", tmp_path / "no.txt", "--steps", "1"],
                      capsys)
    assert_one_line_error(rc, err, "unknown corpus")
    assert not (tmp_path / "a").exists()


def test_train_with_a_mistyped_scheme_json_is_refused(tmp_path, capsys):
    scheme = tmp_path / "scheme.json"
    scheme.write_text(json.dumps({"name": "x", "rope": {}, "logn": "no", "train_len": 64}))
    rc, err = run_cli(["train", "--out", tmp_path / "run", "--scheme", scheme], capsys)
    assert_one_line_error(rc, err, "logn must be true or false, got 'no'")
    assert not (tmp_path / "run").exists()


def test_plot_does_not_create_missing_folders(tmp_path, capsys):
    rc, err = run_cli(["plot", "decay", "--out", tmp_path / "a" / "b" / "x.png"], capsys)
    assert_one_line_error(rc, err, "does not exist; create it first")
    assert not (tmp_path / "a").exists()


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


def test_real_plot_command_creates_no_folder(tmp_path):
    res = _posenc("plot", "decay", "--out", tmp_path / "x" / "y" / "d.png", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("extra, match", [
    (["--method", "rerope", "--factor", "2"], "parameter(s) ['factor'] are taken by none of the methods ['rerope']"),
    (["--factor", "2"], "method parameters ['factor'] were given but no method takes them"),
    (["--method", "yarn", "--param", "bogus=1"], "parameter(s) ['bogus'] are taken by none of the methods"),
    (["--method", "yarn", "--factor", "0.5"], "yarn.factor must be >= 1.0, got 0.5"),
])
def test_eval_flags_no_method_takes_are_refused_not_ignored(run_dir, extra, match, capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    argv = ["eval", run_dir, "--corpus", text, "--lengths", "32", *extra]
    if "0.5" in extra:  # a value out of range: the method's row is refused with the reason, and the exit is 1
        assert cli.main([str(a) for a in argv]) == 1
        out, err = capsys.readouterr()
        last = err.splitlines()[-1]
        assert last.startswith("posenc: 1 row(s) of the methods asked for were not evaluated") and match in last
        rows = [ln.split() for ln in out.splitlines()]
        assert [r[:2] for r in rows if r[:2] in (["rope", "none"], ["rope", "yarn"])] == [["rope", "none"],
                                                                                         ["rope", "yarn"]]
        yarn = " ".join(next(r for r in rows if r[:2] == ["rope", "yarn"]))
        assert f"not_applicable ({match})" in yarn, yarn
        return
    rc, err = run_cli(argv, capsys)
    assert_one_line_error(rc, err, match)


def test_eval_factor_is_used_and_printed(run_dir, capsys, tmp_path):
    """`posenc eval RUN --method yarn --factor 2` evaluates YaRN with factor 2 at every length (it recorded the
    per-length default 4.0 before) and the table shows the parameters each row used."""
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "r"
    rc = cli.main(["eval", str(run_dir), "--corpus", str(text), "--lengths", "32", "64", "--method", "yarn",
                   "--method", "rerope", "--factor", "2", "--out", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    records = json.loads((out / "results.json").read_text())["records"]
    assert [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()] == records
    yarn = [r for r in records if r["method"] == "yarn"]
    assert [r["params"]["factor"] for r in yarn] == [2.0, 2.0]  # not the length default 4.0 at 64 = 4L
    assert [r["params"] for r in records if r["method"] == "rerope"] == [{"window": 8}, {"window": 8}]
    lines = [ln for ln in printed.splitlines() if ln.split()[:2] in (["rope", "yarn"], ["rope", "rerope"])]
    assert len(lines) == 4 and all(("factor=2 " in ln) == (" yarn " in ln) for ln in lines)
    assert all("window=8" in ln for ln in lines if " rerope " in ln)


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
