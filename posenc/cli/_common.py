"""Flags that several subcommands share, defined once, and the parsing of their values."""

from __future__ import annotations

import argparse
import json


def add_param(p: argparse.ArgumentParser, help: str = "method parameter, repeatable") -> None:
    """``--param KEY=VALUE`` (repeatable); read it with :func:`parse_params`."""
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_factor_window(p: argparse.ArgumentParser) -> None:
    """``--factor`` / ``--window``: shorthands for ``--param factor=F`` / ``--param window=W``
    (read all three with :func:`params_from_args`)."""
    p.add_argument("--factor", type=float, default=None, help="shorthand for --param factor=F")
    p.add_argument("--window", type=int, default=None, help="shorthand for --param window=W")


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu")


def add_quiet(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--quiet", action="store_true", help=help)


def add_train_len(p: argparse.ArgumentParser, default: int | None) -> None:
    p.add_argument("--train-len", type=int, default=default)


def parse_params(items) -> dict:
    """``["k=v", ...]`` -> ``{k: v}``; a value is read as JSON when it parses (``2`` -> 2, ``true`` -> True),
    else kept as a string."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--param expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def params_from_args(args: argparse.Namespace) -> dict:
    """The method parameters of ``--param`` plus the ``--factor`` / ``--window`` shorthands (which win)."""
    params = parse_params(getattr(args, "param", None) or [])
    for k in ("factor", "window"):
        if getattr(args, k, None) is not None:
            params[k] = getattr(args, k)
    return params


def floats(s: str) -> list[float]:
    """``"0.1,0.5 0.9"`` -> ``[0.1, 0.5, 0.9]``."""
    return [float(x) for x in s.replace(",", " ").split()]
