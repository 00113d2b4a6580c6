"""The command line's one grammar, defined once: the parser class, the help format, the shared flags and the
old spellings that still work for one release.

The rules (docs/cli.md has them as one table, and ``tests/cli/test_grammar.py`` checks every subcommand):

- the positional argument is the thing a command acts on (``RUN``: a folder written by ``posenc train``;
  ``MODEL``: a run folder or a Hugging Face model; ``NAME``, ``KIND``, ...);
- ``--out DIR`` is always a folder;
- ``--method SPEC`` takes a composition ``a+b`` wherever a method is taken, with ``--param KEY=VALUE`` and the
  shortcuts ``--factor`` and ``--window``;
- ``--quiet`` on every command, ``--device`` on every command that runs a model (with ``--dtype`` where the model
  may run in another precision than float32), ``--seed`` on every command that draws random numbers, each with the
  same meaning everywhere;
- every flag's help shows its default; a bad value is one line naming the flag, with "did you mean" for names.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys

# --------------------------------------------------------------------------------------------- messages


class UsageError(ValueError):
    """A command line that does not parse (unknown flag, missing value, bad choice): one line, exit status 2."""


def warn(message: str) -> None:
    """One line on stderr: ``posenc: warning: <message>`` (never silenced by ``--quiet``)."""
    print(f"posenc: warning: {' '.join(message.split())}", file=sys.stderr)


def did_you_mean(name: str, choices) -> str:
    """``" (did you mean 'yarn'?)"`` for the closest of ``choices`` to ``name`` (difflib, cutoff 0.6), else ``""``."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_INVALID_CHOICE = re.compile(r"invalid choice: '?([^'\s]*)'? \(choose from (.*)\)")


class Formatter(argparse.HelpFormatter):
    """Help with every option's default shown: appended as ``(default: X)`` unless the help already says
    what the default is or the flag is required. Descriptions are filled paragraph by paragraph (blank lines kept)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return "\n\n".join(textwrap.fill(" ".join(par.split()), width, initial_indent=indent,
                                         subsequent_indent=indent) for par in text.split("\n\n"))

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.help is argparse.SUPPRESS or "default" in text or not action.option_strings or action.required:
            return text  # a required flag has no default to show
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            return text
        return f"{text} (default: {show_default(action.default).replace('%', '%%')})"


def show_default(value) -> str:
    """How a default reads in ``--help``: ``off`` for a switch, ``none`` for None, lists joined by spaces."""
    if value is False:
        return "off"
    if value is True:
        return "on"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value) if value else "none"
    return str(value)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: a usage error raises :class:`UsageError` (printed by ``posenc.cli.main``
    as ``posenc: error: ...``, exit status 2) with "did you mean" for a mistyped choice."""

    def error(self, message: str):  # noqa: D401 (argparse's hook)
        m = _INVALID_CHOICE.search(message)
        if m:
            choices = [c.strip().strip("'\"") for c in m.group(2).split(",")]
            message += did_you_mean(m.group(1), choices)
        where = self.prog.removeprefix("posenc").strip()  # the subcommand, or "" for the top level
        raise UsageError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")


def subparser(sub, name: str, help: str, description: str | None = None) -> Parser:
    """A subcommand's parser in the shared format, with the shared ``--quiet`` flag."""
    p = sub.add_parser(name, help=help, description=description or help, formatter_class=Formatter)
    p.add_argument("--quiet", action="store_true", help="no progress bars or [posenc] info lines")
    return p


# ------------------------------------------------------------------------------------------ shared flags


def add_device(p: argparse.ArgumentParser) -> None:
    """``--device``: the torch device every model of the command runs on."""
    p.add_argument("--device", default="cpu", metavar="DEVICE", help="torch device: cpu, cuda, cuda:1, ...")


def add_dtype(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the dtype every model of the command is loaded with (read it with :func:`device_dtype`)."""
    from posenc._util import DTYPES

    p.add_argument("--dtype", default="auto", choices=DTYPES, metavar="DTYPE",
                   help="model dtype: auto (float32 on cpu, bfloat16 on cuda), float32, bfloat16 or float16")


def device_dtype(args: argparse.Namespace) -> tuple[str, str]:
    """``(device, dtype)`` of ``--device`` and ``--dtype``, checked: a device this machine lacks or a dtype that is
    not one of the choices is one line naming the flag; ``auto`` resolved for the device."""
    from posenc._util import check_device, check_dtype

    device = check_device("--device", args.device)
    return device, check_dtype("--dtype", args.dtype, device)


def add_seed(p: argparse.ArgumentParser, default, help: str = "random seed") -> None:
    """``--seed N``: the seed of everything random the command draws."""
    p.add_argument("--seed", type=int, default=default, metavar="N", help=help)


def add_out(p: argparse.ArgumentParser, help: str, *, required: bool = False, default=None) -> None:
    """``--out DIR``: always a folder (created when missing)."""
    p.add_argument("--out", required=required, default=default, metavar="DIR", help=help)


def add_param(p: argparse.ArgumentParser, help: str = "method parameter, repeatable (e.g. --param group=4)") -> None:
    """``--param KEY=VALUE`` (repeatable); read it with :func:`parse_params`."""
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_factor_window(p: argparse.ArgumentParser) -> None:
    """``--factor`` / ``--window``: shortcuts for ``--param factor=F`` / ``--param window=W``
    (read all three with :func:`params_from_args`)."""
    p.add_argument("--factor", type=float, default=None, metavar="F",
                   help="shortcut for --param factor=F (default: each method's own)")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="shortcut for --param window=W (default: each method's own)")


def add_method(p: argparse.ArgumentParser, help: str, *, repeat: bool = False, required: bool = False,
               param_help: str = "method parameter, repeatable (e.g. --param group=4)") -> None:
    """``--method SPEC`` (``a+b`` composes) with ``--param``, ``--factor`` and ``--window``; ``repeat``: the flag
    may be given several times (a list of specs)."""
    if repeat:
        p.add_argument("--method", action="append", default=[], metavar="SPEC", required=required, help=help)
    else:
        p.add_argument("--method", default=None, metavar="SPEC", required=required, help=help)
    add_param(p, param_help)
    add_factor_window(p)


def add_train_len(p: argparse.ArgumentParser, default: int | None, help: str = "trained context length L") -> None:
    p.add_argument("--train-len", type=int, default=default, metavar="L", help=help)


# ----------------------------------------------------------------------------------------- old spellings


class _Deprecated(argparse.Action):
    """An old flag kept for one release: hidden from ``--help``; using it prints one warning line and stores
    the value under its own ``dest`` (the command merges it with :func:`merge_old`)."""

    def __init__(self, option_strings, dest, use: str = "", **kwargs):
        self.use = use
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        warn(f"{option_string} is deprecated and will be removed in the next release; {self.use}")
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def deprecated(p: argparse.ArgumentParser, *flags: str, dest: str, use: str, **kwargs) -> None:
    """Add an old spelling ``flags`` (hidden, warns once when used); ``use`` says what to write instead."""
    if kwargs.get("nargs") == 0:
        kwargs.setdefault("default", False)
    p.add_argument(*flags, dest=dest, action=_Deprecated, use=use, help=argparse.SUPPRESS, **kwargs)


def merge_old(args: argparse.Namespace, old: str, new: str, new_flag: str, old_flag: str) -> None:
    """Move an old spelling's value (``args.<old>``) to the new one (``args.<new>``); both at once is an error."""
    value = getattr(args, old, None)
    if value is None or value is False or value == []:
        return
    current = getattr(args, new, None)
    if current not in (None, False, [], ()):
        raise UsageError(f"give {new_flag} or the old {old_flag}, not both")
    setattr(args, new, value)


# ------------------------------------------------------------------------------------------ value parsing


def parse_params(items) -> dict:
    """``["k=v", ...]`` -> ``{k: v}``; a value is read as JSON when it parses (``2`` -> 2, ``true`` -> True),
    else kept as a string. A key given twice is refused (which value was meant is not for posenc to guess)."""
    out = {}
    given = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--param expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        if k in given:
            raise ValueError(f"--param {k} is given twice ({k}={given[k]} and {k}={v}): give it once")
        given[k] = v
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def params_from_args(args: argparse.Namespace) -> dict:
    """The method parameters of ``--param`` plus the ``--factor`` / ``--window`` shortcuts (which win)."""
    params = parse_params(getattr(args, "param", None) or [])
    for k in ("factor", "window"):
        if getattr(args, k, None) is not None:
            params[k] = getattr(args, k)
    return params


def typed_params(args: argparse.Namespace) -> dict:
    """How each method parameter of :func:`params_from_args` was typed: ``{"factor": "--factor 0.5", "group":
    "--param group=0"}`` (the shortcut wins, as in :func:`params_from_args`)."""
    typed = {k: f"--param {item}" for item in getattr(args, "param", None) or [] for k in [item.split("=", 1)[0]]}
    for k in ("factor", "window"):
        if getattr(args, k, None) is not None:
            typed[k] = f"--{k} {getattr(args, k):g}"
    return typed


def check_method_flags(spec, params: dict, *, hf: bool = False, length=None, length_flag: str = "",
                       typed: dict | None = None) -> None:
    """Before anything is loaded: every parameter given is inside the range of the method it goes to (the first method
    of ``spec`` that takes it), and every parameter without a default is given, or one its rule names as the
    alternative (``"required (or alpha)"``), or, where the method derives it from a length, ``length`` (the value of
    ``length_flag``, e.g. ``--length N``). The message names the flag and the method as the user typed them
    (``typed``: :func:`typed_params`)."""
    import re

    from posenc.methods import parse_methods, split_spec

    if spec is None:
        return
    routed: set[str] = set()
    for as_typed, method in zip(split_spec(spec), parse_methods(spec, hf=hf)):
        from_length = set(method.length_defaults(1024, 4096, 64)) if method.eval_defaults else set()
        for p in method.params:
            value = params.get(p.name)
            if value is None:
                alternatives = set(re.findall(r"\bor (\w+)", p.rule))
                if not p.required or alternatives & set(params) or (length is not None and p.name in from_length):
                    continue
                need = {"factor": "--factor F", "window": "--window W"}.get(p.name, f"--param {p.name}=VALUE")
                need += "".join(f" or --param {a}=VALUE" for a in sorted(alternatives))
                need += f" or {length_flag}" if length_flag and p.name in from_length else ""
                raise ValueError(f"--method {as_typed} needs {need} ({as_typed}'s {p.name} has no default)")
            if p.name not in routed and not p.contains(value):
                typed_flag = (typed or {}).get(p.name) or (f"--{p.name} {value}" if p.name in ("factor", "window")
                                                            else f"--param {p.name}={value}")
                rng = " | ".join(p.choices) if p.choices is not None else p.range_text()
                raise ValueError(f"{typed_flag} is out of range for {as_typed}: its {p.name} must be {rng}")
            routed.add(p.name)


def floats(s: str) -> list[float]:
    """``"0.1,0.5 0.9"`` -> ``[0.1, 0.5, 0.9]``."""
    try:
        return [float(x) for x in s.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {s!r}") from None


def flag_names(message: str, prefix: str) -> str:
    """Rewrite a library message's ``<prefix>.field_name`` (e.g. ``TrainConfig.warmup``) as the flag
    ``--field-name``: errors name the flags the user typed."""
    return re.sub(re.escape(prefix) + r"\.(\w+)", lambda m: "--" + m.group(1).replace("_", "-"), message)
