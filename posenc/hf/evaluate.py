"""Perplexity vs length and passkey accuracy of a Hugging Face model under posenc methods.

``evaluate_hf(model_dir, tokens, lengths, methods)`` loads the model once per method
(:func:`posenc.hf.load`, then :func:`posenc.hf.extend`), scores :func:`posenc.lab.metrics.evaluate_lm`
(non-overlapping windows) and :func:`posenc.lab.tasks.run_passkey` at each length, and returns the lab's
:class:`posenc.lab.records.EvalRecord` rows. Tokens come from posenc's byte tokenizer (vocab 257) unless given
as ids, so the model's vocabulary must hold them (real HF checkpoints: pass ``tokens`` from their own tokenizer).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from posenc.lab.records import EvalRecord
from posenc.scheme.methods import parse_methods


def _params_for(method: str, params: dict) -> dict:
    """The subset of ``params`` the parts of ``method`` accept (HF-native names take all)."""
    methods = parse_methods(method, hf=True)
    if len(methods) == 1 and methods[0].hf_native:
        return dict(params)
    accepted = {k for m in methods for k in m.param_names}
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
    """One :class:`posenc.lab.records.EvalRecord` row (``to_dict()``, no ``params``) per (method, length), with
    ``scheme`` the model_type. ``passkey`` is the mean exact
    accuracy over ``passkey_depths`` x ``passkey_trials`` prompts of that length (None when
    ``passkey_trials`` is 0). ``params`` go to each method that accepts them. A method that cannot
    apply (``ValueError``) gives a record with ``status="error"`` and the message in ``note``."""
    from pathlib import Path

    from posenc.hf.patch import load, train_len_of
    from posenc.lab.metrics import evaluate_lm
    from posenc.lab.tasks import passkey_grid, run_passkey
    from posenc.lab.tokenizer import make_tokenizer

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
        base = EvalRecord(scheme=None, method=method, train_len=None, eval_len=None)
        try:
            model = load(model_dir)
            base = base.replace(scheme=model.config.model_type, train_len=train_len_of(model.config))
            vocab = model.config.vocab_size
            if int(tokens.max()) >= vocab:
                raise ValueError(f"token ids reach {int(tokens.max())} but the model's vocab_size is {vocab}")
            from posenc.hf.patch import extend

            extend(model, method, **_params_for(method, dict(params or {})))
            if device is not None:
                model.to(device)
            fn = _logits_fn(model)
        except ValueError as exc:
            records += [base.replace(eval_len=n, status="error", note=str(exc)).to_dict() for n in lengths]
            continue
        for n in lengths:
            rec = base.replace(eval_len=int(n))
            try:
                if len(tokens) <= n:
                    raise ValueError(f"text has {len(tokens)} tokens; eval length {n} needs more than {n}")
                r = evaluate_lm(fn, tokens, int(n), batch_size=batch_size, max_windows=max_windows,
                                progress=False, device=device)
                rec = rec.replace(ppl=r["ppl"], loss=r["loss"], accuracy=r["accuracy"], tokens=r["tokens"])
                if passkey_trials:
                    prompts = passkey_grid([int(n)], list(passkey_depths), passkey_trials, tok, seed=seed)
                    cells = run_passkey(fn, prompts, device=device)["cells"]
                    rec = rec.replace(passkey=float(np.mean([c["accuracy"] for c in cells])))
            except ValueError as exc:
                rec = rec.replace(status="error", note=str(exc))
            records.append(rec.to_dict())
    return records
