"""``posenc eval``: a posenc checkpoint (:func:`posenc.lab.evaluate.evaluate_checkpoint`) or, with ``--hf-model``,
a Hugging Face model (:func:`posenc.hf.evaluate.evaluate_hf`) at several lengths under inference-time methods."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.cli._common import add_device, add_factor_window, add_param, add_quiet, floats, params_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="perplexity / accuracy / passkey of a checkpoint at several lengths")
    p.add_argument("checkpoint", nargs="?", help="run folder written by `posenc train`")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="evaluation lengths (default: train_len)")
    p.add_argument("--methods", nargs="*", default=[], help="inference-time methods (e.g. pi ntk yarn rerope)")
    p.add_argument("--corpus", default=None, help="corpus name or path (default: the training corpus)")
    p.add_argument("--split", default="test", choices=("train", "val", "test"))
    p.add_argument("--mode", default="nonoverlap", choices=("nonoverlap", "sliding"))
    p.add_argument("--max-windows", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--passkey", action="store_true", help="also run passkey retrieval at each length")
    add_device(p)
    p.add_argument("--json", default=None, metavar="OUT", help="write the records to this JSON file")
    p.add_argument("--out", default=None, help="write the records as JSON lines here (one record per line)")
    add_quiet(p, "no progress bars")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="also write results.json, report.md, report.html and plots (as posenc bench does)")
    _add_hf_args(p)
    p.set_defaults(func=run)


def _add_hf_args(p: argparse.ArgumentParser) -> None:
    """The options only ``--hf-model`` reads (``--lengths``, ``--methods``, ``--corpus``, ``--max-windows``
    and the method parameters ``--param``/``--factor``/``--window`` serve both paths)."""
    p.add_argument("--hf-model", default=None, help="evaluate a Hugging Face model under posenc methods: a folder, "
                   "a .gguf file, or a bundled model (smollm2); scored with the model's own tokenizer")
    p.add_argument("--text", default=None, help="text file to score (tokenized with the model's own tokenizer)")
    add_param(p, "method parameter, repeatable; overrides the per-length default of every method that takes it")
    add_factor_window(p)
    p.add_argument("--target", type=int, default=None, help="--hf-model: tokens scored at the end of every window, "
                   "the same tokens at every length (default: a quarter of the shortest length)")
    p.add_argument("--passkey-trials", type=int, default=0, help="pass-key contexts per depth and length (0: none)")
    p.add_argument("--passkey-depths", type=floats, default=None,
                   help="pass-key depths in [0, 1], e.g. '0.1,0.5,0.9' (default: a random depth per trial)")


def _evaluate_hf(args: argparse.Namespace) -> list[dict]:
    """``posenc eval --hf-model DIR --text FILE|--corpus NAME``: a Hugging Face model under each
    method (see :mod:`posenc.hf.evaluate`), reported like a posenc checkpoint."""
    from posenc.hf.evaluate import evaluate_hf

    if args.text:
        text = Path(args.text).read_text(encoding="utf-8")
    elif args.corpus:
        from posenc.lab.corpora import load_corpus, split_documents

        text = "\n\n".join(d.text for d in split_documents(load_corpus(args.corpus))[args.split])
    else:
        raise ValueError("posenc eval --hf-model needs --text FILE or --corpus NAME")
    return evaluate_hf(args.hf_model, lengths=args.lengths or [256], methods=args.methods or ["none"], text=text,
                       params=params_from_args(args), max_windows=args.max_windows or 4, target=args.target,
                       passkey_trials=args.passkey_trials, passkey_depths=args.passkey_depths)


def run(args: argparse.Namespace) -> int:
    from posenc.lab.evaluate import check_eval_args, check_method_params, evaluate_checkpoint, format_table

    check_eval_args(args.lengths or [1], (), args.mode, args.max_windows, args.batch_size)  # both paths
    # --factor/--window/--param: honoured on both paths (they override the per-length defaults), or refused
    # here when no method takes them; never dropped
    params = params_from_args(args)
    check_method_params(args.methods or ["none"], params, hf=bool(args.hf_model))
    if args.hf_model:
        records = _evaluate_hf(args)
    else:
        if not args.checkpoint:
            raise ValueError("give a checkpoint folder (or --hf-model NAME)")
        records = evaluate_checkpoint(args.checkpoint, args.corpus, args.lengths or (), args.methods,
                                      split=args.split, mode=args.mode, max_windows=args.max_windows,
                                      batch_size=args.batch_size, passkey=args.passkey, progress=not args.quiet,
                                      device=args.device, params=params)
    print(format_table(records))
    if args.report:
        _write_report(args, records)
    from posenc.lab.atomic import atomic_write_bytes

    if args.json:
        atomic_write_bytes(Path(args.json), json.dumps(records, indent=1).encode())
    if args.out:  # one record per line
        atomic_write_bytes(Path(args.out), "".join(json.dumps(r) + "\n" for r in records).encode())
    return 0


def _write_report(args: argparse.Namespace, records: list[dict]) -> None:
    from posenc.lab.report import write_report

    results = {"meta": {"command": "posenc eval", "source": args.hf_model or args.checkpoint,
                        "lengths": args.lengths, "methods": args.methods}, "records": records}
    from posenc.lab.atomic import atomic_write_json

    out = Path(args.report)
    atomic_write_json(out / "results.json", results, indent=1)
    paths = write_report(results, out)
    print(f"report: {paths['html']}")
