"""``posenc export RUN``: write a lab run (``posenc train``'s folder) as a plain Hugging Face ``LlamaForCausalLM``
folder with its tokenizer (:func:`posenc.hf.export.export`)."""

from __future__ import annotations

import argparse
import json

from posenc.cli._common import add_out, subparser


def add_parser(sub) -> None:
    p = subparser(sub, "export", "export a trained RoPE run to a transformers LlamaForCausalLM folder",
                  "Write RUN (a run folder of `posenc train` under a RoPE scheme) as a plain transformers "
                  "LlamaForCausalLM folder (config.json, model.safetensors and the byte tokenizer) that loads "
                  "without posenc and gives the same logits. Schemes Llama has no place for (ALiBi, T5, NoPE, ...) "
                  "are refused.")
    p.add_argument("run", metavar="RUN", help="run folder of `posenc train` (model.safetensors + config.json)")
    add_out(p, "folder to write config.json, model.safetensors and the tokenizer into", required=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.hf.export import export
    from posenc.runtime.folders import check_target

    check_target(args.out, what="--out")  # before the run is loaded: nothing to undo
    out = export(args.run, args.out)
    cfg = json.loads((out / "config.json").read_text())
    print(json.dumps({"saved": str(out), "architectures": cfg.get("architectures"),
                      "rope_parameters": cfg.get("rope_parameters"),
                      "files": sorted(p.name for p in out.iterdir())}))
    return 0
