"""``posenc train``: one flag per :class:`posenc.lab.train.TrainConfig` field (:func:`posenc.lab.train.train`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from posenc.cli._common import add_param, add_quiet, parse_params

# TrainConfig fields with a flag of their own (or none) instead of the generic "--field-name (default v)"
_OWN_FLAGS = {"out_dir", "scheme", "scheme_params", "init", "compile"}


def add_parser(sub) -> None:
    from posenc.lab.train import TrainConfig

    p = sub.add_parser("train", help="train a TinyLM under a position scheme (resumable; torchrun for DDP)")
    p.add_argument("--out-dir", "--out", dest="out_dir", required=True, help="run folder (checkpoint)")
    p.add_argument("--scheme", default="rope", help="preset name (see `posenc schemes`) or a scheme JSON file")
    add_param(p, "scheme parameter, repeatable (e.g. --param factor=2)")
    p.add_argument("--init", default=None, metavar="CKPT", help="start from this checkpoint's weights")
    defaults = TrainConfig(out_dir="")
    for f in fields(TrainConfig):
        if f.name in _OWN_FLAGS:
            continue
        v = getattr(defaults, f.name)
        p.add_argument("--" + f.name.replace("_", "-"), type=type(v), default=v, help=f"(default {v})")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    add_quiet(p, "no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.lab.train import TrainConfig, _dist_env, train

    scheme: str | dict = args.scheme
    if scheme.endswith(".json") and Path(scheme).is_file():
        scheme = json.loads(Path(scheme).read_text())
    kw = {f.name: getattr(args, f.name) for f in fields(TrainConfig)
          if f.name not in ("scheme", "scheme_params") and hasattr(args, f.name)}
    cfg = TrainConfig(**kw, scheme=scheme, scheme_params=parse_params(args.param))
    summary = train(cfg, progress=not args.quiet)
    if _dist_env()[0] == 0:  # only rank 0 prints under torchrun
        out = {k: v for k, v in summary.items() if k != "history"}
        print(json.dumps(out, indent=2))
    return 0
