"""``posenc extend MODEL``: load a Hugging Face model, apply a posenc method (:func:`posenc.hf.extend`) and save it
(:func:`posenc.hf.save`) with its tokenizer files. It prints how to load the result: a method transformers
implements loads with plain transformers; any other one is saved in the form of :mod:`posenc.hf.saved`
(``posenc.hf.load``, or ``from_pretrained(..., trust_remote_code=True)``; plain ``from_pretrained`` refuses)."""

from __future__ import annotations

import argparse
import json

from posenc.cli._common import (
    add_method,
    add_out,
    check_method_flags,
    deprecated,
    merge_old,
    params_from_args,
    subparser,
    typed_params,
)


def add_parser(sub) -> None:
    p = subparser(sub, "extend", "extend a Hugging Face model's context with a posenc method and save it",
                  "Load MODEL, apply --method to it and save the result with its tokenizer into --out. A method "
                  "transformers implements (yarn, pi/linear, dynamic_ntk, llama3, longrope) is saved as a plain "
                  "transformers folder; any other is saved in posenc's wrapper form, which posenc.hf.load (or "
                  "from_pretrained with trust_remote_code=True) loads extended. The command prints how to load it and "
                  "its size on disk: a .gguf (the bundled smollm2 included) is de-quantized, so the folder holds "
                  "float32 weights, several times the size of the quantized file.")
    p.add_argument("model", nargs="?", metavar="MODEL", help="a Hugging Face folder, a .gguf file, or a bundled "
                   "model (smollm2, gemma3-270m)")
    add_method(p, "method or composition a+b, e.g. yarn, dynamic_ntk, rerope, selfextend+logn")
    p.add_argument("--length", type=int, default=None, metavar="N",
                   help="the length to read: parameters not given take each method's rule for N (YaRN's factor = N / "
                   "the trained length, SelfExtend's group, ...; `posenc schemes` states them); recorded in "
                   "posenc.json with every parameter's value")
    p.add_argument("--native", choices=("auto", "yes", "no"), default="auto",
                   help="use transformers' own code for linear/dynamic/yarn/llama3/longrope (auto: yes)")
    add_out(p, "folder to save the extended model and its tokenizer into (must not hold a model already); with "
            "--format gguf, the .gguf file to write (must not exist)")
    p.add_argument("--format", choices=("transformers", "gguf"), default="transformers",
                   help="transformers (default): a folder; gguf: a copy of the .gguf MODEL (the same quantised "
                   "tensors) with llama.cpp's RoPE keys for a method llama.cpp serves (yarn, pi/linear, longrope, "
                   "llama3), and the llama-cli/llama-server flags printed; any other method or setting is refused "
                   "with the reason")
    deprecated(p, "--model", dest="old_model", use="give the model as the positional MODEL")
    deprecated(p, "--save", dest="old_save", use="use --out DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    merge_old(args, "old_model", "model", "MODEL", "--model")
    merge_old(args, "old_save", "out", "--out", "--save")
    for value, what in ((args.model, "the MODEL to extend (a Hugging Face folder, a .gguf file or a bundled model: "
                                     "smollm2, gemma3-270m)"),
                        (args.method, "--method SPEC"), (args.out, "--out DIR, the folder to save the model into")):
        if not value:
            raise ValueError(f"posenc extend needs {what}")
    from posenc.hf.patch import extend, load, save
    from posenc.hf.saved import saved_record
    from posenc.hf.source import NoTokenizerError, load_tokenizer, source_folder
    from posenc.runtime.folders import check_target

    if args.format == "gguf":
        from pathlib import Path

        if Path(args.out).exists():
            raise ValueError(f"--out {args.out} exists; --format gguf writes a new file")
        if args.native == "no":
            raise ValueError("--format gguf with --native no: llama.cpp serves only transformers' own rope types")
        from posenc.hf.gguf_export import NotServable, check_servable_method

        try:
            check_servable_method(args.method)  # before the model is loaded
        except NotServable as exc:
            raise ValueError(f"--format gguf: {exc}") from None
    else:
        check_target(args.out, what="--out")  # before the model is loaded: nothing to undo
    check_method_flags(args.method, params_from_args(args), hf=True, length=args.length, length_flag="--length N",
                       typed=typed_params(args))
    if args.length is not None:
        from posenc._util import check_positive_int

        check_positive_int("--length", args.length)
    native = {"auto": None, "yes": True, "no": False}[args.native]
    gguf_source = _gguf_source(args) if args.format == "gguf" else None
    folder = source_folder(args.model)
    model = load(folder)
    extend(model, args.method, native=native, target_length=args.length, **params_from_args(args))
    if gguf_source is not None:
        from posenc.hf.gguf_export import NotServable, serve_extended

        try:
            print(json.dumps(serve_extended(model, gguf_source, args.out)))
        except NotServable as exc:
            raise ValueError(f"--format gguf: {exc}") from None
        return 0
    try:
        tokenizer = load_tokenizer(args.model)  # a damaged tokenizer file: ValueError naming it, nothing saved
    except NoTokenizerError:
        tokenizer = None  # a model without a tokenizer of its own is saved without one
    out = save(model, args.out, tokenizer=tokenizer)  # the tokenizer's files, chat template included
    cfg = json.loads((out / "config.json").read_text())
    if cfg.get("posenc"):  # posenc's engine: the wrapper that plain transformers refuses (posenc.hf.saved)
        how = (f"posenc.hf.load({str(out)!r}), or transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}, "
               f"trust_remote_code=True) with posenc installed; plain from_pretrained refuses it, and runtimes "
               f"without posenc (vLLM, llama.cpp) cannot serve this method")
    else:
        how = (f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}): transformers' own rope_parameters, "
               f"max_position_embeddings {cfg.get('max_position_embeddings')}")
    print(json.dumps({"saved": str(out), "rope_parameters": cfg.get("rope_parameters"),
                      "max_position_embeddings": cfg.get("max_position_embeddings"), "posenc": saved_record(out),
                      "size": _size(out, model, args.model), "load": how}))
    return 0


def _gguf_source(args):
    """The .gguf file ``--format gguf`` copies: MODEL itself or the bundled model's file."""
    from pathlib import Path

    from posenc.hf.source import BUNDLED, bundled_gguf, is_gguf

    path = bundled_gguf(args.model) if args.model in BUNDLED else Path(args.model)
    if not is_gguf(path):
        raise ValueError(f"--format gguf needs a .gguf MODEL (its quantised tensors are copied), got {args.model}; "
                         f"convert a folder with llama.cpp's convert_hf_to_gguf.py first")
    return path


def _size(out, model, source) -> str:
    """The saved folder's size on disk, its weights' dtype and, for a GGUF source, the quantized file's size (a user
    who extends a 98 MB .gguf gets a folder several times larger, and should hear it)."""
    from pathlib import Path

    from posenc.hf.source import BUNDLED, bundled_gguf, is_gguf

    saved = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    said = f"{saved / 1e6:.0f} MB on disk, weights in {str(model.dtype).removeprefix('torch.')}"
    gguf = bundled_gguf(source) if isinstance(source, str) and source in BUNDLED else Path(source)
    if is_gguf(gguf):
        said += f" (de-quantized from the {gguf.stat().st_size / 1e6:.0f} MB .gguf {gguf.name})"
    return said
