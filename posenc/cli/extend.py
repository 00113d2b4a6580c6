"""``posenc extend``: load a Hugging Face model, apply a posenc method (:func:`posenc.hf.extend`) and save it
(:func:`posenc.hf.save`) with its tokenizer files. It prints how to load the result: a method transformers
implements loads with plain transformers; any other one is saved in the form of :mod:`posenc.hf.saved`
(``posenc.hf.load``, or ``from_pretrained(..., trust_remote_code=True)``; plain ``from_pretrained`` refuses)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.cli._common import add_factor_window, add_param, params_from_args

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def add_parser(sub) -> None:
    p = sub.add_parser("extend", help="extend a Hugging Face model's context with a posenc method")
    p.add_argument("--model", required=True, help="HF model dir")
    p.add_argument("--method", required=True, help="e.g. yarn, dynamic_ntk, rerope, selfextend+logn")
    add_param(p)
    add_factor_window(p)
    p.add_argument("--native", choices=("auto", "yes", "no"), default="auto",
                   help="use transformers' own code for linear/dynamic/yarn/llama3/longrope (default: auto=yes)")
    p.add_argument("--save", required=True, help="output model dir")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.hf.patch import extend, load, save

    native = {"auto": None, "yes": True, "no": False}[args.native]
    model = load(args.model)
    extend(model, args.method, native=native, **params_from_args(args))
    out = save(model, args.save)
    from posenc.lab.atomic import atomic_write_bytes

    for f in _TOKENIZER_FILES:
        src = Path(args.model) / f
        if src.exists():
            atomic_write_bytes(out / f, src.read_bytes())
    cfg = json.loads((out / "config.json").read_text())
    if cfg.get("posenc"):  # posenc's engine: the wrapper that plain transformers refuses (posenc.hf.saved)
        how = (f"posenc.hf.load({str(out)!r}), or transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}, "
               f"trust_remote_code=True) with posenc installed; plain from_pretrained refuses it, and runtimes "
               f"without posenc (vLLM, llama.cpp) cannot serve this method")
    else:
        how = (f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}): transformers' own rope_parameters, "
               f"max_position_embeddings {cfg.get('max_position_embeddings')}")
    print(json.dumps({"saved": str(out), "rope_parameters": cfg.get("rope_parameters"),
                      "max_position_embeddings": cfg.get("max_position_embeddings"), "posenc": cfg.get("posenc"),
                      "load": how}))
    return 0
