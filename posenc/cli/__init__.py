"""The ``posenc`` command line.

The only place where posenc uses argparse. Each subcommand is one module of this package with
``add_parser(subparsers)`` (which sets ``func``) and ``run(args)``, which turns the parsed flags into calls
of the library's plain functions. The grammar every subcommand follows (positional = the thing acted on,
``--out`` a folder, ``--method`` a spec, the shared flags) is defined once in :mod:`posenc.cli._common`. This
file wires the subcommands together and turns user errors into one line."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys

# subcommand -> module that defines add_parser(subparsers). Imported lazily (and each imports the library
# inside its functions) so a missing optional dependency only breaks its own command.
SUBCOMMANDS = {
    "bench": "posenc.cli.bench",
    "train": "posenc.cli.train",
    "eval": "posenc.cli.eval",
    "generate": "posenc.cli.generate",
    "extend": "posenc.cli.extend",
    "export": "posenc.cli.export",
    "plot": "posenc.cli.plot",
    "perf": "posenc.cli.perf",
    "schemes": "posenc.cli.schemes",
    "compat": "posenc.cli.compat",
    "data": "posenc.cli.data",
    "tune": "posenc.cli.tune",
}

DESCRIPTION = """posenc: positional encodings and length extrapolation for transformers.

Every command follows one grammar: the positional argument is the thing the command acts on, --out is a
folder, --method takes a method or a composition such as rerope+logn (with --param KEY=VALUE, --factor and
--window), and --quiet, --device and --seed mean the same everywhere. Run `posenc COMMAND --help` for a
command's flags and their defaults."""


def build_parser(names=None):
    """The ``posenc`` parser with every subcommand (or only ``names``)."""
    from posenc._version import __version__
    from posenc.cli._common import Formatter, Parser

    parser = Parser(prog="posenc", description=DESCRIPTION, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if names is not None and name not in names:
            continue
        importlib.import_module(module).add_parser(sub)
    return parser


# Errors a user's input can cause: printed as one line, exit status 2 (POSENC_DEBUG=1 re-raises them).
USER_ERRORS = (ValueError, TypeError, OSError, ModuleNotFoundError)


def main(argv=None) -> int:
    """Run one subcommand. A bad value prints ``posenc: error: <message>`` (one line, no traceback, with "did
    you mean" for a mistyped name) on stderr and returns 2; an interruption (SIGINT, or SIGTERM during
    ``train``/``bench``, which save first) prints ``posenc: <what was saved>`` and returns 128 + the signal
    number. Set ``POSENC_DEBUG=1`` to get the traceback instead."""
    debug = os.environ.get("POSENC_DEBUG", "") not in ("", "0")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv)
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"posenc: error: {named_path(exc, argv) or with_hint(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C; posenc.runtime.interrupt.Interrupted says what a run saved
        if debug:
            raise
        message = " ".join(str(exc).split()) or "interrupted"
        print(f"posenc: {message}", file=sys.stderr)
        return int(getattr(exc, "exit_status", 130))


_UNKNOWN = re.compile(r"unknown (preset|method|bundled model)\S* '([^']+)'")


def _known(kind: str) -> list[str]:
    """The names a mistyped ``kind`` could have meant (the registries)."""
    if kind == "bundled model":
        from posenc.hf.source import BUNDLED

        return sorted(BUNDLED)
    from posenc.methods import HF_ONLY, METHODS
    from posenc.scheme.core import TRAINED

    return sorted(METHODS) + sorted(HF_ONLY) + (sorted(TRAINED) if kind == "preset" else [])


def with_hint(exc: BaseException) -> str:
    """The error as one line; an unknown preset, method or bundled model gets "(did you mean 'x'?)" after the
    name (the unknown part of a composition ``a+b`` comes from the registry's ``UnknownMethodError``)."""
    from posenc.cli._common import did_you_mean

    message = " ".join(str(exc).split()) or type(exc).__name__
    m = _UNKNOWN.search(message)
    if m is None or "did you mean" in message:
        return message
    name, seen = m.group(2), exc
    while seen is not None:  # the registry's error, possibly chained under the one raised
        if type(seen).__name__ == "UnknownMethodError":
            name = seen.name
            break
        seen = seen.__cause__ or seen.__context__
    hint = did_you_mean(name, _known(m.group(1)))
    if not hint:
        return message
    return message[:m.end()] + hint + message[m.end():]


def named_path(exc: BaseException, argv: list[str]) -> str | None:
    """An ``OSError`` about a path the user typed as a flag's value, as one line naming the flag and the path
    (``--text /x.txt: No such file or directory``); None for any other error."""
    from pathlib import Path

    filename = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if filename is None:
        return None
    why = exc.strerror or type(exc).__name__
    for i, item in enumerate(argv):
        flag, eq, value = item.partition("=")
        if not (eq and flag.startswith("--")):
            flag, value = (argv[i - 1], item) if i and argv[i - 1].startswith("--") else ("", "")
        if flag and value and str(Path(value)) == str(Path(filename)):
            return f"{flag} {value}: {why}"
    return None


def _run(argv) -> int:
    names = None
    if argv and argv[0] in SUBCOMMANDS:
        names = {argv[0]}  # import only the module the user asked for
    elif argv[:1] == ["--version"]:
        names = set()  # the version alone: no subcommand's module
    parser = build_parser(names)
    args = parser.parse_args(argv)
    import logging

    logger = logging.getLogger("posenc")
    if not logger.handlers:  # progress messages of long one-off steps (flex compiles, model conversions)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[posenc] %(message)s"))
        logger.addHandler(handler)
    quiet = getattr(args, "quiet", False)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    if not quiet:
        return int(args.func(args) or 0)
    with library_bars_off():
        return int(args.func(args) or 0)


# the progress bars of the libraries posenc loads models with: (module, is_on, off, on)
_LIBRARY_BARS = (
    ("transformers.utils.logging", "is_progress_bar_enabled", "disable_progress_bar", "enable_progress_bar"),
    ("huggingface_hub.utils", None, "disable_progress_bars", "enable_progress_bars"),
)


@contextlib.contextmanager
def library_bars_off():
    """``--quiet`` for transformers' and huggingface_hub's own bars too ("Loading weights", "Writing model shards"):
    off for the command, as they were after it (the tests run many commands in one process). The environment
    variable covers a library the command imports first; the libraries' switches cover one already imported."""
    env = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    before = {name: (sys.modules[name], is_on is None or getattr(sys.modules[name], is_on)())
              for name, is_on, _, _ in _LIBRARY_BARS if name in sys.modules}
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    for name, _, off, _ in _LIBRARY_BARS:
        if name in sys.modules:
            getattr(sys.modules[name], off)()
    try:
        yield
    finally:
        if env is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = env
        import warnings

        for name, _, _, on in _LIBRARY_BARS:
            module = sys.modules.get(name)
            was_on = before[name][1] if name in before else env in (None, "", "0")
            if module is not None and was_on:
                with warnings.catch_warnings():  # huggingface_hub imported under the variable keeps it: a no-op
                    warnings.simplefilter("ignore")
                    getattr(module, on)()


if __name__ == "__main__":
    raise SystemExit(main())
