"""Perplexity vs length and passkey accuracy of a Hugging Face model under posenc methods.

``evaluate_hf(model_dir, tokens, lengths, methods)`` loads the model once per method
(:func:`posenc.hf.load`, then :func:`posenc.hf.extend`), scores :func:`posenc.metrics.evaluate_lm`
(non-overlapping windows) and :func:`posenc.tasks.run_passkey` at each length, and returns the lab's
record dicts. Tokens come from posenc's byte tokenizer (vocab 257) unless given as ids, so the model's
vocabulary must hold them (real HF checkpoints: pass ``tokens`` from their own tokenizer).
"""

from __future__ import annotations

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
