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
    add_train_len(p, None, help="trained context length L (required for an inference-time method, unless --model)")
    p.add_argument("--model", default=None, metavar="MODEL", help="a Hugging Face folder, a .gguf file or a bundled "
                   "model (smollm2, gemma3-270m): "
                   "without NAME, print the model's own scheme and, for a model saved by `posenc extend`, what it was "
                   "extended with; with NAME, the trained length comes from the model")
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


def _model_facts(source) -> dict:
    """What ``posenc schemes --model`` prints: the model's trained length, its own RoPE scheme and, for a model
    saved extended by posenc, its record (:mod:`posenc.hf.saved`); read without loading the weights."""
    from posenc.hf.patch import scheme_from_config, train_len_of
    from posenc.hf.saved import model_config, saved_record
    from posenc.hf.source import describe_source, source_folder

    folder = source_folder(source)
    cfg = model_config(folder)
    record = saved_record(folder)
    if record is not None and record.get("native"):  # the config holds the extended schedule: the record says
        trained = record["trained_length"]
    else:
        trained = train_len_of(cfg)
    return {"model": describe_source(source), "folder": str(folder), "model_type": cfg.model_type,
            "trained_length": trained, "scheme": scheme_from_config(cfg).to_dict(), "extended": record}


def run(args: argparse.Namespace) -> int:
    from posenc.scheme.core import TRAINED, PositionScheme

    if args.model is not None:
        if args.train_len is not None:
            raise ValueError("give --model or --train-len, not both (the model states its trained length)")
        facts = _model_facts(args.model)
        if args.name is None:
            if args.param or args.factor is not None or args.window is not None:
                raise ValueError("--param, --factor and --window go with a NAME to print")
            print(json.dumps(facts, indent=2))
            return 0
        args.train_len = facts["trained_length"]
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
