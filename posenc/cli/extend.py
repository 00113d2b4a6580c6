"""``posenc extend``: load a Hugging Face model, apply a posenc method (:func:`posenc.hf.extend`) and save it
(:func:`posenc.hf.save`) with its tokenizer files. It prints how to load the result: a method transformers
implements loads with plain transformers; any other one is saved in the form of :mod:`posenc.hf.saved`
(``posenc.hf.load``, or ``from_pretrained(..., trust_remote_code=True)``; plain ``from_pretrained`` refuses)."""

from __future__ import annotations

import argparse
import json

from posenc.cli._common import add_factor_window, add_param, params_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("extend", help="extend a Hugging Face model's context with a posenc method")
    p.add_argument("--model", required=True, help="the model: a Hugging Face folder, a .gguf file, or a bundled "
                   "model (smollm2)")
    p.add_argument("--method", required=True, help="e.g. yarn, dynamic_ntk, rerope, selfextend+logn")
    add_param(p)
    add_factor_window(p)
    p.add_argument("--native", choices=("auto", "yes", "no"), default="auto",
                   help="use transformers' own code for linear/dynamic/yarn/llama3/longrope (default: auto=yes)")
    p.add_argument("--save", required=True, help="output model dir")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.hf.patch import extend, load, save
    from posenc.hf.source import load_tokenizer, source_folder

    native = {"auto": None, "yes": True, "no": False}[args.native]
    folder = source_folder(args.model)
    model = load(folder)
    extend(model, args.method, native=native, **params_from_args(args))
    try:
        tokenizer = load_tokenizer(args.model)
    except ValueError:
        tokenizer = None  # a model without a tokenizer of its own is saved without one
    out = save(model, args.save, tokenizer=tokenizer)  # the tokenizer's files, chat template included
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
