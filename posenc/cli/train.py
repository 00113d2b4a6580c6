"""``posenc train``: one flag per :class:`posenc.training.train.TrainConfig` field
(:func:`posenc.training.train.train`); the defaults are the lab's quick recipe."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from posenc.cli._common import (
    add_device,
    add_method,
    add_out,
    add_seed,
    deprecated,
    flag_names,
    merge_old,
    params_from_args,
    subparser,
    warn,
)

# TrainConfig fields with a flag of their own (or none) instead of the generic "--field-name"
_OWN_FLAGS = {"out_dir", "scheme", "scheme_params", "init", "compile", "device", "seed"}
HELP = {
    "corpus": "corpus: gutenberg, stdlib, or a file or folder of text",
    "tokenizer": "byte or bpe",
    "dim": "model width",
    "n_layers": "transformer blocks",
    "n_heads": "attention heads",
    "train_len": "training context length L (tokens per row)",
    "batch_size": "text rows per step",
    "steps": "optimizer steps",
    "lr": "peak learning rate (AdamW)",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup": "linear warmup steps (default: min(100, steps // 5))",
    "weight_decay": "AdamW weight decay on weight matrices",
    "grad_clip": "clip gradients to this global norm (0: off)",
    "dropout": "dropout probability",
    "save_every": "save a checkpoint every N steps (0: only at the end; Ctrl-C always saves)",
    "eval_every": "validation loss every N steps (0: only at the end)",
    "eval_batches": "batches per validation loss",
    "log_every": "update the progress bar's loss every N steps",
    "recall_batch": "key-value recall rows added to every step (0: text only)",
    "recall_weight": "weight of the recall rows' loss next to the text loss",
    "recall_pairs": "key-value pairs (recall) or definitions (kv) per recall row",
    "recall_task": "recall rows: recall (one needle, a content-copy task) or kv (kv_recall + offset, key matching)",
    "positions": "training position ids: contiguous, pose (PoSE skip-wise chunks) or randomized (Ruoss et al.)",
    "position_range": "the id range pose / randomized positions cover (> --train-len; required with them)",
    "pose_chunks": "PoSE's chunks per window (the paper's default 2)",
    "s2_groups": "LongLoRA S^2-attention groups per window during training (the paper's 4; 0: full attention)",
}


def add_parser(sub) -> None:
    from posenc.training.config import TrainConfig

    p = subparser(sub, "train", "train a TinyLM under a position scheme (resumable; torchrun for DDP)",
                  "Train a small Llama-style model (TinyLM) under a position scheme into the run folder --out. "
                  "Running the same command again resumes an interrupted run or returns a finished one. The "
                  "defaults are the lab's quick recipe (the model `posenc bench --preset quick` measures).")
    add_out(p, "run folder (checkpoint, config.json); created when missing", required=False)
    deprecated(p, "--out-dir", dest="old_out_dir", use="use --out DIR")
    p.add_argument("--scheme", default=None, metavar="NAME",
                   help="trained-in preset (see `posenc schemes`) or a scheme JSON file (default: rope)")
    add_method(p, "inference-time method applied to --scheme, or to --init's scheme for a short fine-tune "
               "(e.g. pi, yarn, rerope+logn)", param_help="parameter of --method, or of --scheme's preset when no "
               "--method is given; repeatable (e.g. --param every=2)")
    p.add_argument("--init", default=None, metavar="RUN", help="start from this run folder's weights (a fine-tune)")
    defaults = {f.name: f.default for f in fields(TrainConfig)}  # read, not built: building checks the device
    for f in fields(TrainConfig):
        if f.name in _OWN_FLAGS:
            continue
        v = defaults[f.name]
        kind = int if f.name == "warmup" else type(v)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=v, help=HELP[f.name],
                       metavar={int: "N", float: "X"}.get(kind, "NAME"))
    add_seed(p, defaults["seed"], help="seed of the weights' init and of every batch")
    add_device(p)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(func=run)


def _scheme(args: argparse.Namespace, params: dict) -> tuple[str | dict, dict]:
    """``(TrainConfig.scheme, TrainConfig.scheme_params)`` from --scheme, --method, --init and the parameters."""
    from posenc.methods import parse_methods
    from posenc.scheme.core import PositionScheme

    scheme = args.scheme
    if scheme is not None and scheme.endswith(".json") and Path(scheme).is_file():
        if args.method or params:
            raise ValueError("--method and --param go with a preset name, not with a scheme JSON file")
        return json.loads(Path(scheme).read_text()), {}
    if args.method is None and scheme is not None and args.init is not None:
        try:  # the old spelling of a fine-tune: --scheme METHOD --init RUN
            parse_methods(scheme, identity=False)
        except ValueError:
            pass
        else:
            warn(f"--scheme {scheme} with --init is deprecated and will be removed in the next release; use "
                 f"--method {scheme} --init RUN")
    if args.method is None:
        return scheme or "rope", params
    if args.init is not None:
        if scheme is not None:
            raise ValueError("--init takes its scheme from the run it starts from: give --method, not --scheme")
        return args.method, params
    base = PositionScheme.preset(scheme or "rope", train_len=args.train_len)
    return base.extend(args.method, **params).to_dict(), {}


def run(args: argparse.Namespace) -> int:
    from posenc.training.train import TrainConfig, TrainConfigWarning, _dist_env, train

    merge_old(args, "old_out_dir", "out", "--out", "--out-dir")
    if not args.out:
        raise ValueError("--out DIR is required: the run folder to train into")
    scheme, scheme_params = _scheme(args, params_from_args(args))
    kw = {f.name: getattr(args, f.name) for f in fields(TrainConfig)
          if f.name not in ("out_dir", "scheme", "scheme_params") and hasattr(args, f.name)}
    try:
        cfg = TrainConfig(out_dir=args.out, **kw, scheme=scheme, scheme_params=scheme_params)
    except ValueError as exc:
        raise ValueError(flag_names(str(exc), "TrainConfig")) from None
    if _dist_env()[0] == 0:
        for message in cfg.warnings():
            warn(flag_names(message, "TrainConfig"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainConfigWarning)  # printed above, with the flags' names
        summary = train(cfg, progress=not args.quiet)
    if _dist_env()[0] == 0:  # only rank 0 prints under torchrun
        out = {k: v for k, v in summary.items() if k != "history"}
        print(json.dumps(out, indent=2))
    return 0
