"""``posenc`` command line.

The only place where posenc uses argparse. Each subcommand is one module of this package with
``add_parser(subparsers)`` (which sets ``func``) and ``run(args)``, which turns the parsed flags into calls
of the library's plain functions. Flags shared by several subcommands are defined once in
:mod:`posenc.cli._common`. This file wires the subcommands together and turns user errors into one line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> module that defines add_parser(subparsers). Imported lazily (and each imports the library
# inside its functions) so `posenc --help` stays fast and a missing optional dependency only breaks its own
# command.
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
}


def build_parser(names=None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in SUBCOMMANDS.items():
        if names is not None and name not in names:
            continue
        importlib.import_module(module).add_parser(sub)
    return parser


# Errors a user's input can cause: printed as one line, exit status 2 (POSENC_DEBUG=1 re-raises them).
USER_ERRORS = (ValueError, TypeError, OSError, ModuleNotFoundError)


def main(argv=None) -> int:
    """Run one subcommand. A bad value prints ``posenc: error: <message>`` (one line, no traceback) on
    stderr and returns 2; an interruption (SIGINT, or SIGTERM during ``train``/``bench``, which save first)
    prints ``posenc: <what was saved>`` and returns 128 + the signal number. Set ``POSENC_DEBUG=1`` to get
    the traceback instead."""
    debug = os.environ.get("POSENC_DEBUG", "") not in ("", "0")
    try:
        return _run(argv)
    except USER_ERRORS as exc:
        if debug:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__  # one line
        print(f"posenc: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C; posenc.lab.interrupt.Interrupted says what a run saved
        if debug:
            raise
        message = " ".join(str(exc).split()) or "interrupted"
        print(f"posenc: {message}", file=sys.stderr)
        return int(getattr(exc, "exit_status", 130))


def _run(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = None
    if argv and argv[0] in SUBCOMMANDS:
        names = {argv[0]}  # import only the module the user asked for
    parser = build_parser(names)
    args = parser.parse_args(argv)
    import logging

    if not logging.getLogger("posenc").handlers:  # progress messages of long one-off steps (flex compiles)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[posenc] %(message)s"))
        logging.getLogger("posenc").addHandler(handler)
        logging.getLogger("posenc").setLevel(logging.INFO)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
