"""``posenc schemes``: list the presets and methods, or print one preset's JSON
(:meth:`posenc.scheme.PositionScheme.preset`)."""

from __future__ import annotations

import argparse
import json

from posenc.cli._common import add_param, add_train_len, parse_params


def add_parser(sub) -> None:
    p = sub.add_parser("schemes", help="list presets, or print one preset's JSON")
    p.add_argument("name", nargs="?", help="preset to print (e.g. alibi, or yarn with --train-len)")
    add_train_len(p, None)
    add_param(p, "preset parameter, repeatable (e.g. --param factor=4)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.scheme.core import METHODS, PositionScheme

    if args.name is None:
        for name, desc in PositionScheme.presets().items():
            kind = "method " if name in METHODS else "trained"
            print(f"{name:18s} {kind}  {desc}")
        return 0
    params = parse_params(args.param)
    if args.train_len is not None:
        params["train_len"] = args.train_len
    print(json.dumps(PositionScheme.preset(args.name, **params).to_dict(), indent=2))
    return 0
