"""``posenc schemes``: list the presets and methods, or print one preset's JSON
(:meth:`posenc.scheme.PositionScheme.preset`)."""

from __future__ import annotations

import argparse
import json

from posenc.cli._common import add_factor_window, add_param, add_train_len, params_from_args, subparser


def add_parser(sub) -> None:
    p = subparser(sub, "schemes", "list the presets and methods, or print one preset's JSON",
                  "Without NAME: every trained-in preset and inference-time method with its paper and parameters. "
                  "With NAME: the scheme's JSON (an inference-time method or composition a+b applies to a RoPE "
                  "model trained at --train-len).")
    p.add_argument("name", nargs="?", metavar="NAME", help="preset, method or composition a+b to print (e.g. alibi, "
                   "or yarn with --train-len)")
    add_train_len(p, None, help="trained context length L (required for an inference-time method)")
    add_param(p, "preset parameter, repeatable (e.g. --param factor=4)")
    add_factor_window(p)
    p.set_defaults(func=run)


def _listing() -> list[str]:
    """Trained-in presets, then every method of the registry with its kind, paper and parameters."""
    from posenc.methods import HF_ONLY, METHODS, TRAINED_METHODS
    from posenc.scheme.core import TRAINED

    out = ["trained-in presets (posenc schemes NAME [--train-len L]):"]
    for name, (_, desc) in TRAINED.items():
        record = TRAINED_METHODS.get(name)
        out.append(f"  {name:18s} {desc}" + (f" [{record.paper}]" if record else ""))
        if record is not None and record.params:
            out.append(f"  {'':18s}   " + "; ".join(p.describe() for p in record.params))
    out += ["", "inference-time methods (posenc schemes NAME --train-len L; combine with '+', e.g. rerope+logn):"]
    for name, m in METHODS.items():
        dynamic = ", dynamic" if m.dynamic else ""
        hf = f", transformers rope_type {m.hf_rope_type!r}" if m.hf_rope_type else ""
        out.append(f"  {name:18s} {m.kind}{dynamic}: {m.description} [{m.paper}{hf}]")
        if m.base_preset != "rope":
            out.append(f"  {'':18s}   applies to a {m.base_preset!r} model")
        if m.params:
            out.append(f"  {'':18s}   " + "; ".join(p.describe() for p in m.params))
    out += ["", "transformers' own (posenc.hf.extend; 'linear' is pi; longrope also on posenc's engine with "
                "native=False, its cache consistent across the original length):"]
    out += [f"  {name:18s} {m.description} [{m.paper}]" for name, m in HF_ONLY.items()]
    return out


def run(args: argparse.Namespace) -> int:
    from posenc.scheme.core import TRAINED, PositionScheme

    if args.name is None:
        if args.param or args.train_len is not None or args.factor is not None or args.window is not None:
            raise ValueError("--train-len, --param, --factor and --window go with a NAME to print")
        print("\n".join(_listing()))
        return 0
    params = params_from_args(args)
    if args.train_len is not None:
        params["train_len"] = args.train_len
    elif args.name not in TRAINED:
        from posenc.methods import parse_methods

        try:
            parse_methods(args.name, identity=False)
        except ValueError:
            PositionScheme.preset(args.name)  # "unknown preset 'x'" (with "did you mean" from posenc.cli.main)
        raise ValueError(f"{args.name!r} is an inference-time method: give --train-len L, the length the RoPE model "
                         f"was trained at (e.g. posenc schemes {args.name} --train-len 4096)")
    print(json.dumps(PositionScheme.preset(args.name, **params).to_dict(), indent=2))
    return 0
