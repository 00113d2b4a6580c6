"""Every ``posenc`` subcommand follows the one grammar of :mod:`posenc.cli._common` (docs/cli.md has it as a
table): its ``--help`` is read here and checked rule by rule. In-process and fast: nothing is loaded or run."""

from __future__ import annotations

import argparse
import re

import pytest

from posenc import cli
from posenc.cli import SUBCOMMANDS, build_parser

# The positional argument is the thing acted on, named by what it is (never ckpt/run_dir/checkpoint).
POSITIONAL = {"eval": "MODEL", "generate": "MODEL", "extend": "MODEL", "export": "RUN", "plot": "KIND",
              "perf": "BENCHMARK", "schemes": "NAME", "compat": "FAMILY", "data": "CORPUS", "tune": "MODEL"}
# Commands that run a model take --device (and --dtype where it may run in another precision than float32);
# commands that draw random numbers take --seed.
DEVICE = {"bench", "train", "eval", "generate", "tune"}
DTYPE = {"bench", "eval", "generate", "tune"}
SEED = {"bench", "train", "eval", "generate", "compat", "tune"}
# Commands that take a method take --method SPEC with --param, --factor and --window.
METHOD = {"train", "eval", "generate", "extend", "plot"}  # plot: the method of `plot map`
# Commands that write files write them into the folder --out.
OUT = {"bench", "train", "eval", "extend", "export", "plot", "perf", "compat", "tune"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


PARSERS = _subparsers()


def _help(name: str, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[-1]: a for a in p._actions if a.option_strings and a.help is not argparse.SUPPRESS}


def test_every_subcommand_is_in_the_parser():
    assert set(PARSERS) == set(SUBCOMMANDS)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_help_runs_and_reads_as_plain_text(name, capsys):
    """``--help`` exits 0 and shows no Sphinx markup (``:mod:``, double backticks) or Python field names."""
    text = _help(name, capsys)
    assert text.startswith("usage: posenc " + name)
    assert "``" not in text and not re.search(r":(mod|func|class|meth|attr|data):", text), text
    assert "TrainConfig." not in text and "out_dir" not in text


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_positional_is_the_thing_acted_on(name):
    positional = [a.metavar for a in PARSERS[name]._actions if not a.option_strings]
    assert positional == ([POSITIONAL[name]] if name in POSITIONAL else [])
    for action in PARSERS[name]._actions:
        if not action.option_strings:
            assert action.help, f"posenc {name}: positional {action.metavar} has no help"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_out_is_a_folder(name, capsys):
    options = _options(PARSERS[name])
    assert ("--out" in options) == (name in OUT)
    if name in OUT:
        assert options["--out"].metavar == "DIR"
        assert "--out DIR" in _help(name, capsys)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_shared_flags_mean_the_same_everywhere(name):
    options = _options(PARSERS[name])
    assert options["--quiet"].help == "no progress bars or [posenc] info lines"
    assert ("--device" in options) == (name in DEVICE)
    if name in DEVICE:
        assert options["--device"].default == "cpu" and options["--device"].metavar == "DEVICE"
    assert ("--dtype" in options) == (name in DTYPE)
    if name in DTYPE:
        assert options["--dtype"].default == "auto" and options["--dtype"].metavar == "DTYPE"
        assert tuple(options["--dtype"].choices) == ("auto", "float32", "bfloat16", "float16")
    assert ("--seed" in options) == (name in SEED)
    if name in SEED:
        assert options["--seed"].type is int and options["--seed"].metavar == "N"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_method_is_a_spec_with_its_parameters(name):
    options = _options(PARSERS[name])
    assert ("--method" in options) == (name in METHOD)
    if name in METHOD:
        assert options["--method"].metavar == "SPEC"
        for flag, metavar in (("--param", "KEY=VALUE"), ("--factor", "F"), ("--window", "W")):
            assert options[flag].metavar == metavar, (name, flag)
    assert "--methods" not in options and "--scheme-param" not in options


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_flag_has_help_with_its_default(name, capsys):
    """Every flag has help, and the help shows the default (argparse's help format, or the help's own words); a
    required flag shows none (it has none: "(default: none)" would say it may be left out)."""
    parser = PARSERS[name]
    for flag, action in _options(parser).items():
        if flag == "--help":
            continue
        assert action.help, f"posenc {name} {flag} has no help"
        shown = parser._get_formatter()._get_help_string(action)
        if action.required:
            assert "(default: " not in shown, f"posenc {name} {flag} is required: {shown!r}"
        else:
            assert "default" in shown, f"posenc {name} {flag}: {shown!r}"
        assert "_" not in flag, f"posenc {name} {flag}: flags use dashes"
    text = _help(name, capsys)
    assert "(default: " in text or name in ("data",), text


def test_version(capsys):
    from posenc._version import __version__

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"posenc {__version__}"


def test_top_level_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert re.search(rf"^\s+{name}\s", text, re.M), name


def test_grammar_table_in_the_docs_names_every_subcommand():
    """docs/cli.md's table has one row per subcommand, with the positional this test checks."""
    from pathlib import Path

    table = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    for name in SUBCOMMANDS:
        row = next((ln for ln in table.splitlines() if ln.startswith(f"| `posenc {name}")), None)
        assert row is not None, name
        assert (POSITIONAL.get(name, "") in row) and (("`--out DIR`" in row) == (name in OUT)), row
