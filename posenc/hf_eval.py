"""Perplexity vs length and passkey accuracy of a Hugging Face model under posenc methods.

``evaluate_hf(model_dir, tokens, lengths, methods)`` loads the model once per method
(:func:`posenc.hf.load`, then :func:`posenc.hf.extend`), scores :func:`posenc.metrics.evaluate_lm`
(non-overlapping windows) and :func:`posenc.tasks.run_passkey` at each length, and returns the lab's
record dicts. Tokens come from posenc's byte tokenizer (vocab 257) unless given as ids, so the model's
vocabulary must hold them (real HF checkpoints: pass ``tokens`` from their own tokenizer).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np
import torch

from posenc.scheme import METHODS


def _params_for(method: str, params: dict) -> dict:
    """The subset of ``params`` the parts of ``method`` accept (HF-native names take all)."""
    from posenc.hf import HF_NATIVE

    names = [m.strip() for m in method.split("+") if m.strip()]
    if names in (["none"], ["default"]):
        return {}
    if len(names) == 1 and names[0] in HF_NATIVE:
        return dict(params)
    accepted = {k for n in names if n in METHODS for k in METHODS[n][2]}
    return {k: v for k, v in params.items() if k in accepted}


def _logits_fn(model):
    def fn(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    return fn


@torch.no_grad()
def evaluate_hf(model_dir, tokens=None, lengths: Sequence[int] = (256,), methods: Sequence[str] = ("none",), *,
                text: str | None = None, params: dict | None = None, max_windows: int | None = 4,
                batch_size: int = 1, passkey_depths: Sequence[float] = (0.5,), passkey_trials: int = 0,
                tokenizer=None, device=None, seed: int = 0) -> list[dict]:
    """One record per (method, length): ``{"scheme": model_type, "method", "train_len", "eval_len",
    "ppl", "loss", "accuracy", "tokens", "passkey", "status", "note"}``. ``passkey`` is the mean exact
    accuracy over ``passkey_depths`` x ``passkey_trials`` prompts of that length (None when
    ``passkey_trials`` is 0). ``params`` go to each method that accepts them. A method that cannot
    apply (``ValueError``) gives a record with ``status="error"`` and the message in ``note``."""
    from pathlib import Path

    from posenc.data import make_tokenizer
    from posenc.hf import load, train_len_of
    from posenc.metrics import evaluate_lm
    from posenc.tasks import passkey_grid, run_passkey

    if not (Path(model_dir) / "config.json").is_file():  # one clear error, not one record per method
        raise ValueError(f"model dir {str(model_dir)!r} has no config.json (expected a folder written by "
                         "save_pretrained)")
    tok = tokenizer or make_tokenizer("byte")
    if tokens is None:
        if text is None:
            raise ValueError("evaluate_hf needs tokens or text")
        tokens = tok.encode_array(text)
    tokens = np.asarray(tokens)
    if not lengths:
        raise ValueError("lengths must be non-empty")
    records = []
    for method in methods:
        base = {"method": method, "scheme": None, "train_len": None}
        try:
            model = load(model_dir)
            base.update(scheme=model.config.model_type, train_len=train_len_of(model.config))
            vocab = model.config.vocab_size
            if int(tokens.max()) >= vocab:
                raise ValueError(f"token ids reach {int(tokens.max())} but the model's vocab_size is {vocab}")
            from posenc.hf import extend

            extend(model, method, **_params_for(method, dict(params or {})))
            if device is not None:
                model.to(device)
            fn = _logits_fn(model)
        except ValueError as exc:
            for n in lengths:
                records.append({**base, "eval_len": n, "ppl": None, "loss": None, "accuracy": None, "tokens": 0,
                                "passkey": None, "status": "error", "note": str(exc)})
            continue
        for n in lengths:
            rec = {**base, "eval_len": int(n), "ppl": None, "loss": None, "accuracy": None, "tokens": 0,
                   "passkey": None, "status": "ok", "note": ""}
            try:
                if len(tokens) <= n:
                    raise ValueError(f"text has {len(tokens)} tokens; eval length {n} needs more than {n}")
                r = evaluate_lm(fn, tokens, int(n), batch_size=batch_size, max_windows=max_windows,
                                progress=False, device=device)
                rec.update(ppl=r["ppl"], loss=r["loss"], accuracy=r["accuracy"], tokens=r["tokens"])
                if passkey_trials:
                    prompts = passkey_grid([int(n)], list(passkey_depths), passkey_trials, tok, seed=seed)
                    cells = run_passkey(fn, prompts, device=device)["cells"]
                    rec["passkey"] = float(np.mean([c["accuracy"] for c in cells]))
            except ValueError as exc:
                rec.update(status="error", note=str(exc))
            records.append(rec)
    return records


# ===================================================================== CLI hook for `posenc eval`
def _ints(s: str) -> list[int]:
    return [int(x) for x in s.replace(",", " ").split()]


def _strs(s: str) -> list[str]:
    return [x for x in s.replace(",", " ").split() if x]


def add_hf_eval_args(parser: argparse.ArgumentParser) -> None:
    """Add the HF options to an ``eval`` parser; options it already defines (``--lengths``,
    ``--methods``, ``--param``, ...) are reused, not added twice."""
    have = set(parser._option_string_actions)

    def add(flag, **kw):
        if flag not in have:
            parser.add_argument(flag, **kw)

    add("--hf-model", default=None, help="evaluate a Hugging Face model dir under posenc methods")
    add("--text", default=None, help="text file to score (byte tokenizer)")
    add("--corpus", default=None, help="posenc corpus name; its test split is scored (byte tokenizer)")
    add("--lengths", type=_ints, default=[256], help="evaluation lengths, e.g. 256,512,1024")
    add("--methods", type=_strs, default=["none"], help="methods, e.g. none,yarn,dynamic_ntk,rerope")
    add("--param", action="append", default=[], metavar="KEY=VALUE", help="method parameter, repeatable")
    add("--factor", type=float, default=None, help="shorthand for --param factor=F")
    add("--window", type=int, default=None, help="shorthand for --param window=W")
    add("--max-windows", type=int, default=4, help="evaluation windows per length")
    add("--passkey-trials", type=int, default=0, help="passkey prompts per depth (0: skip passkey)")
    add("--passkey-depths", type=lambda s: [float(x) for x in _strs(s)], default=[0.5])
    add("--out", default=None, help="write the records as JSON lines here")


def run_hf_eval(args: argparse.Namespace) -> int:
    from posenc.hf import method_params

    if args.text:
        from posenc.data import make_tokenizer

        with open(args.text, encoding="utf-8") as f:
            tokens = make_tokenizer("byte").encode_array(f.read())
    elif getattr(args, "corpus", None):
        from posenc.data import prepare

        tokens = prepare(args.corpus, "byte").split("test")
    else:
        raise ValueError("posenc eval --hf-model needs --text FILE or --corpus NAME")
    lengths = args.lengths if isinstance(args.lengths, list) else _ints(str(args.lengths))
    methods = args.methods if isinstance(args.methods, list) else _strs(str(args.methods))
    records = evaluate_hf(args.hf_model, tokens, lengths, methods, params=method_params(args),
                          max_windows=getattr(args, "max_windows", 4),
                          passkey_trials=getattr(args, "passkey_trials", 0),
                          passkey_depths=getattr(args, "passkey_depths", [0.5]))
    lines = [json.dumps(r) for r in records]
    if getattr(args, "out", None):
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0
