"""``posenc eval MODEL``: a posenc run folder (:func:`posenc.evals.lab.evaluate.evaluate_checkpoint`) or a Hugging Face
model (:func:`posenc.evals.pretrained.evaluate_hf`) at several lengths under inference-time methods."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.cli._common import (
    add_device,
    add_dtype,
    add_method,
    add_out,
    add_seed,
    deprecated,
    device_dtype,
    floats,
    merge_old,
    params_from_args,
    subparser,
    warn,
)


def add_parser(sub) -> None:
    p = subparser(sub, "eval", "perplexity, accuracy and pass-key retrieval of a model at several lengths",
                  "Evaluate MODEL at several lengths, as trained and under inference-time methods. MODEL is a run "
                  "folder written by `posenc train` (scored on its corpus with its tokenizer) or a Hugging Face "
                  "model: a folder, a .gguf file or a bundled model (smollm2, gemma3-270m), scored on --text or "
                  "--corpus with "
                  "the model's own tokenizer. The table goes to stdout; --out DIR also writes results.json, "
                  "records.jsonl and the report.")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="a run folder of `posenc train`, or a Hugging Face folder, a .gguf file or a bundled model "
                        "(smollm2, gemma3-270m)")
    add_method(p, "inference-time method or composition a+b to evaluate besides the model as trained; repeatable "
               "(e.g. --method yarn --method rerope+logn)", repeat=True,
               param_help="method parameter, repeatable; overrides the per-length default of every method that "
               "takes it")
    p.add_argument("--lengths", type=int, nargs="+", default=None, metavar="N",
                   help="evaluation lengths (default: the run's train_len; 256 for a Hugging Face model)")
    add_out(p, "also write results.json, records.jsonl (one record per line), report.md, report.html and plots "
               "into this new or empty folder (written whole at the end; a folder holding files, or a file, is "
               "refused before anything is computed: an evaluation does not resume, and replaces nothing)")
    p.add_argument("--corpus", default=None, metavar="NAME", help="corpus name or path (default: the run's "
                   "training corpus; a Hugging Face model needs --corpus or --text)")
    p.add_argument("--text", default=None, metavar="FILE", help="Hugging Face model: a text file to score instead "
                   "of --corpus")
    p.add_argument("--split", default="test", choices=("train", "val", "test"), help="corpus split to score")
    p.add_argument("--mode", default="nonoverlap", choices=("nonoverlap", "sliding"),
                   help="run folder: score non-overlapping windows, or slide by half a window")
    p.add_argument("--max-windows", type=int, default=None, metavar="N",
                   help="windows scored per length (default: every window of a run's split; 4 for a Hugging Face "
                   "model)")
    p.add_argument("--batch-size", type=int, default=1, metavar="N", help="run folder: windows per forward")
    p.add_argument("--passkey", action="store_true", help="run folder: also run pass-key retrieval at each length")
    p.add_argument("--passkey-trials", type=int, default=0, metavar="N",
                   help="Hugging Face model: pass-key contexts per depth and length (0: none)")
    p.add_argument("--passkey-depths", type=floats, default=None, metavar="D,D,...",
                   help="Hugging Face model: pass-key depths in [0, 1], e.g. 0.1,0.5,0.9 (default: a random depth "
                   "per trial)")
    p.add_argument("--target", type=int, default=None, metavar="N", help="Hugging Face model: tokens scored at the "
                   "end of every window, the same tokens at every length (default: a quarter of the shortest length)")
    add_device(p)
    add_dtype(p)
    add_seed(p, 0, help="seed of the pass-key contexts")
    deprecated(p, "--methods", dest="old_methods", nargs="*", use="give --method once per method")
    deprecated(p, "--hf-model", dest="old_hf_model", use="give the model as the positional MODEL")
    deprecated(p, "--json", dest="old_json", use="use --out DIR (it writes DIR/results.json)")
    deprecated(p, "--report", dest="old_report", use="use --out DIR")
    p.set_defaults(func=run)


def _check_model(model: str) -> None:
    """``ValueError`` for a MODEL that is none of the things eval reads (before anything is loaded)."""
    from posenc.cli._common import did_you_mean

    p = Path(model)
    if p.exists():
        return
    from posenc.hf.source import BUNDLED

    if model in BUNDLED:
        return
    raise ValueError(f"MODEL {model!r} is not a run folder of `posenc train`, a Hugging Face model folder, a .gguf "
                     f"file, nor a bundled model ({', '.join(sorted(BUNDLED))}){did_you_mean(model, BUNDLED)}")


def _old_spellings(args: argparse.Namespace) -> Path | None:
    """Fold the deprecated flags into the new ones; returns the old ``--out FILE`` (JSON lines), if given."""
    merge_old(args, "old_methods", "method", "--method", "--methods")
    merge_old(args, "old_hf_model", "model", "MODEL", "--hf-model")
    merge_old(args, "old_report", "out", "--out", "--report")
    lines_file = None
    if args.out and Path(args.out).suffix in (".jsonl", ".json") and not Path(args.out).is_dir():
        warn(f"--out {args.out}: --out is a folder now; writing JSON lines to a file is deprecated and will be removed "
             f"in the next release (--out DIR writes DIR/records.jsonl)")
        lines_file, args.out = Path(args.out), None
    return lines_file


def _text(args: argparse.Namespace) -> str:
    if args.text:
        return Path(args.text).read_text(encoding="utf-8")
    if args.corpus:
        from posenc.data.corpora import check_default_corpus, load_corpus, split_documents

        check_default_corpus(args.corpus)
        return "\n\n".join(d.text for d in split_documents(load_corpus(args.corpus))[args.split])
    raise ValueError("a Hugging Face MODEL needs --text FILE or --corpus NAME to score")


def _evaluate_hf(args: argparse.Namespace, methods: list[str], params: dict, dtype: str) -> list[dict]:
    """A Hugging Face model under each method (see :mod:`posenc.evals.pretrained`), one method at a time behind a
    progress bar, reported like a run folder."""
    from tqdm.auto import tqdm

    from posenc.evals.pretrained import evaluate_hf
    from posenc.hf.source import load_tokenizer
    from posenc.methods import method_params

    text = _text(args)
    tok = load_tokenizer(args.model)
    tokens = tok(text, add_special_tokens=False)["input_ids"]
    records = []
    for method in tqdm(methods, desc=f"eval {Path(args.model).name}", unit="method", disable=args.quiet):
        records += evaluate_hf(args.model, tokens=tokens, tokenizer=tok, lengths=args.lengths or [256],
                               methods=[method], params=method_params(method, params, hf=True),
                               max_windows=args.max_windows or 4, target=args.target,
                               passkey_trials=args.passkey_trials, passkey_depths=args.passkey_depths,
                               device=None if args.device == "cpu" else args.device, dtype=dtype,
                               seed=args.seed)
    return records


def run(args: argparse.Namespace) -> int:
    from posenc._util import check_positive_int
    from posenc.evals.lab.evaluate import check_eval_args, evaluate_checkpoint, format_table
    from posenc.methods import check_method_params

    lines_file = _old_spellings(args)
    if args.out:
        from posenc.evals.results_folder import check_results_folder

        check_results_folder(args.out, "eval", what="--out")  # before anything is computed
    if not args.model:
        raise ValueError("give the MODEL to evaluate: a run folder of `posenc train`, a Hugging Face folder, a .gguf "
                         "file or smollm2")
    for n in args.lengths or []:
        check_positive_int("--lengths", n)
    check_positive_int("--batch-size", args.batch_size)
    if args.max_windows is not None:
        check_positive_int("--max-windows", args.max_windows)
    _, dtype = device_dtype(args)
    methods = list(args.method)
    check_eval_args([1], methods)  # an unknown method is refused before anything is loaded
    params = params_from_args(args)  # --factor/--window/--param: honoured on both paths, or refused here
    _check_model(args.model)
    from posenc.models.checkpoint import is_run_folder

    run_folder = is_run_folder(args.model)
    check_method_params(methods or ["none"], params, hf=not run_folder)
    if run_folder:
        from posenc.models.checkpoint import read_config

        if args.dtype not in ("auto", "float32"):
            raise ValueError(f"--dtype {args.dtype} is for Hugging Face models; a run folder is evaluated in float32 "
                             "(--dtype auto or float32)")
        from posenc.data.corpora import check_default_corpus

        check_default_corpus(args.corpus or read_config(args.model).get("extra", {}).get("corpus"))
        records = evaluate_checkpoint(args.model, args.corpus, args.lengths or (), methods, split=args.split,
                                      mode=args.mode, max_windows=args.max_windows, batch_size=args.batch_size,
                                      passkey=args.passkey, progress=not args.quiet, device=args.device,
                                      params=params, seed=args.seed)
    else:
        from posenc.methods import is_identity

        records = _evaluate_hf(args, ["none"] + [m for m in methods if not is_identity(m)], params, dtype)
    print(format_table(records))
    _write(args, records, lines_file)
    return _refused_rows(records)


def _refused_rows(records: list[dict]) -> int:
    """1 (after the table and the files are written) when a row of a method the user named was not evaluated,
    with the reasons on stderr: a refused method is not a silent success; 0 otherwise."""
    import sys

    from posenc.methods import is_identity

    missed = [r for r in records if r["status"] != "ok" and not is_identity(r["method"])]
    if not missed:
        return 0
    why = "; ".join(f"{r['method']} at {r['eval_len']}: {r['note']}" for r in missed[:3])
    print(f"posenc: {len(missed)} row(s) of the methods asked for were not evaluated (not_applicable in the table): "
          f"{why}{' ...' if len(missed) > 3 else ''}", file=sys.stderr)
    return 1


def _write(args: argparse.Namespace, records: list[dict], lines_file: Path | None) -> None:
    from posenc.runtime.atomic import atomic_write_bytes, atomic_write_json, named_os_error

    jsonl = "".join(json.dumps(r) + "\n" for r in records).encode()
    if args.old_json:
        atomic_write_bytes(Path(args.old_json), json.dumps(records, indent=1).encode())
    if lines_file is not None:
        atomic_write_bytes(lines_file, jsonl)
    if args.out:
        from posenc.evals.report.evaluation import write_eval_report
        from posenc.runtime.folders import staged_folder

        out = Path(args.out)
        results = {"meta": {"kind": "eval", "command": "posenc eval", "source": args.model, "lengths": args.lengths,
                            "methods": list(args.method)}, "records": records}
        staged = None
        try:
            with staged_folder(out, what="--out") as staging:  # the folder appears whole, or not at all
                staged = str(staging)
                atomic_write_json(staging / "results.json", results, indent=1)
                atomic_write_bytes(staging / "records.jsonl", jsonl)
                paths = write_eval_report(results, staging)
        except OSError as exc:  # a full disk: named by the file the user asked for, not the hidden staging folder
            if staged is None or not exc.strerror or staged not in exc.strerror:
                raise named_os_error(exc, out) from None
            raise OSError(exc.errno, exc.strerror.replace(staged, str(out))) from None
        print(f"report: {out / paths['html'].name}")
