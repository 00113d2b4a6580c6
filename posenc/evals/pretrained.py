"""Perplexity vs length and pass-key accuracy of a Hugging Face model under posenc methods, with the model's own
tokenizer.

``evaluate_hf(source, lengths=..., methods=..., text=...)`` loads the model (a folder, a GGUF file or a bundled
model, :mod:`posenc.hf.source`) once per method, applies the method (:func:`posenc.hf.extend`) and returns the lab's
:class:`posenc.evals.records.EvalRecord` rows, one per (method, length):

- **perplexity on the same target tokens at every length**: ``max_windows`` windows end at the same positions of
  the text; at length ``n`` a window holds the ``n`` tokens before its end, and only its last ``target`` tokens are
  scored (``logits_to_keep``: a 16k window of a 49k-token vocabulary would otherwise return 3.2 GB of logits). A
  longer length only adds context in front of the same scored tokens, so the numbers compare across lengths;
- **pass key** (``passkey_trials`` > 0): the long-context suite's pass-key contexts (:mod:`posenc.evals.suite`:
  Landmark's noise haystack, greedy decoding from one cached prefill), ``passkey_trials`` per depth.

The text is tokenized with the model's own tokenizer; a model without one is refused, and so is posenc's byte
tokenizer on a model that has its own (the ids would mean other tokens). ``tokens`` (ids) may be given instead of
``text``; they must come from the model's tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from posenc.evals.records import EvalRecord
from posenc.methods import check_method_params, is_identity, method_params

__all__ = ["evaluate_hf", "target_losses", "window_ends"]


def _check_tokenizer(tokenizer, own) -> object:
    """The tokenizer to use: the model's own unless the caller's is a transformers tokenizer; posenc's lab
    tokenizers (byte, BPE) are refused on a model that has its own."""
    if tokenizer is None:
        return own
    if not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise ValueError(f"tokenizer must be a transformers tokenizer (the model has its own, "
                         f"{type(own).__name__}); posenc's {type(tokenizer).__name__} would give other token ids")
    return tokenizer


def window_ends(n_tokens: int, longest: int, windows: int) -> list[int]:
    """``windows`` window ends spread over ``[longest, n_tokens - 1]`` (a window at the longest length fits before
    each end, and each end has a next token to predict)."""
    if n_tokens < longest + 1:
        raise ValueError(f"the text has {n_tokens} tokens (model's tokenizer); length {longest} needs more than "
                         f"{longest}")
    last = n_tokens - 1
    return sorted({int(x) for x in np.linspace(longest, last, windows).round()})


@torch.no_grad()
def target_losses(model, tokens: np.ndarray, length: int, ends: Sequence[int], target: int) -> tuple[np.ndarray,
                                                                                                     np.ndarray]:
    """Per-token loss (nats) and top-1 hits of the ``target`` tokens ending at each of ``ends`` (inclusive of the
    token right after the window), each window holding the ``length`` tokens before its end."""
    device = next(model.parameters()).device
    losses, hits = [], []
    for e in ends:
        x = torch.as_tensor(np.asarray(tokens[e - length:e], dtype=np.int64), device=device)[None]
        y = torch.as_tensor(np.asarray(tokens[e - target + 1:e + 1], dtype=np.int64), device=device)
        logits = model(input_ids=x, use_cache=False, logits_to_keep=target).logits[0].float()  # [target, V]
        losses.append(torch.nn.functional.cross_entropy(logits, y, reduction="none").cpu().numpy())
        hits.append((logits.argmax(-1) == y).cpu().numpy())
    return np.concatenate(losses), np.concatenate(hits)


def _passkey(model, tokenizer, length: int, depths, trials: int, seed: int) -> float:
    from posenc.evals.suite.prefill import run_context
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack

    hay = make_haystack("noise", tokenizer)
    right = []
    for d in depths or [None]:
        for t in range(trials):
            opts = {"passkey": {"depth": float(d)}} if d is not None else None
            ctx = build_context(tokenizer, hay, length, ("passkey",), seed=seed + t, options=opts)
            right += [a["correct"] for a in run_context(model, tokenizer, ctx)["answers"]]
    return sum(right) / len(right)


def _evaluate_one(model, tokenizer, tokens, lengths, ends, target, base: EvalRecord, passkey) -> list[dict]:
    rows = []
    for n in lengths:
        rec = base.replace(eval_len=int(n))
        try:
            nll, hit = target_losses(model, tokens, int(n), ends, target)
            loss = float(nll.mean())
            rec = rec.replace(ppl=float(np.exp(loss)), loss=loss, accuracy=float(hit.mean()), tokens=int(nll.size),
                              extra={**rec.extra, "target_tokens": target, "windows": len(ends)})
            if passkey is not None:
                rec = rec.replace(passkey=passkey(model, int(n)))
        except ValueError as exc:
            rec = rec.replace(status="error", note=str(exc))
        rows.append(rec.to_dict())
    return rows


@torch.no_grad()
def evaluate_hf(source, tokens=None, lengths: Sequence[int] = (256,), methods: Sequence[str] = ("none",), *,
                text: str | None = None, params: dict | None = None, max_windows: int | None = 4,
                target: int | None = None, passkey_depths: Sequence[float] | None = None, passkey_trials: int = 0,
                tokenizer=None, device=None, dtype: str | None = None, seed: int = 0) -> list[dict]:
    """One :class:`~posenc.evals.records.EvalRecord` row per (method, length) (module docstring): ``scheme`` is the
    model_type, ``params`` the method's parameters as applied, ``passkey`` the pass-key accuracy over
    ``passkey_depths`` (default: a random depth per trial) x ``passkey_trials`` (None when 0). ``target``: scored
    tokens per window (default a quarter of the shortest length). ``params`` go to each method that accepts them;
    one that no method accepts is a ``ValueError`` (it would be ignored). A method that cannot apply
    (``ValueError``) gives records with ``status="error"`` and the message in ``note``. ``device``: where the model
    runs (None: where it loads, the CPU); ``dtype``: the dtype it is loaded with (``"float32"``, ``"bfloat16"``,
    ``"float16"``; None: transformers' default)."""
    from posenc._util import check_device, check_dtype
    from posenc.hf.patch import applied_params, extend, load, train_len_of
    from posenc.hf.saved import saved_record
    from posenc.hf.source import load_tokenizer, source_folder

    device = None if device is None else check_device("device", device)
    dtype = None if dtype is None else check_dtype("dtype", dtype, device or "cpu")
    folder = source_folder(source)  # one clear error for a missing model, not one record per method
    tok = _check_tokenizer(tokenizer, load_tokenizer(source))
    if tokens is None:
        if text is None:
            raise ValueError("evaluate_hf needs text (or tokens of the model's own tokenizer)")
        tokens = tok(text, add_special_tokens=False)["input_ids"]
    tokens = np.asarray(tokens, dtype=np.int64)
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 2:
        raise ValueError(f"lengths must be non-empty integers >= 2, got {lengths}")
    target = int(target or max(1, min(lengths) // 4))
    if not 1 <= target <= min(lengths):
        raise ValueError(f"target must be in [1, {min(lengths)}] (the shortest length), got {target}")
    ends = window_ends(len(tokens), max(lengths), int(max_windows or 4))
    check_method_params(methods, params, hf=True)
    passkey = None
    if passkey_trials:
        def passkey(model, n):
            return _passkey(model, tok, n, passkey_depths, passkey_trials, seed)
    saved = saved_record(folder)  # a model saved extended: its rows are labelled with the method it runs
    records = []
    for method in methods:
        base = EvalRecord(scheme=None, method=method, train_len=None, eval_len=None)
        if saved is not None and is_identity(method):
            base = base.replace(method=saved["method"], extra={"saved": True})
        try:
            model = load(folder, **({"dtype": getattr(torch, dtype)} if dtype else {})).eval()
            vocab = model.config.vocab_size
            if int(tokens.max()) >= vocab:
                raise ValueError(f"token ids reach {int(tokens.max())} but the model's vocab_size is {vocab}")
            given = method_params(method, params, hf=True)
            if saved is not None and not is_identity(method):
                raise ValueError(f"the model was saved extended with {saved['method']}: methods do not stack; "
                                 "evaluate the model it was extended from")
            extend(model, method, **given)
            base = base.replace(scheme=model.config.model_type, train_len=train_len_of(model.config),
                                params=saved.get("resolved") or saved.get("params", {}) if saved is not None
                                else applied_params(model))
            if device is not None:
                model.to(device)
        except ValueError as exc:
            records += [base.replace(eval_len=n, status="error", note=str(exc)).to_dict() for n in lengths]
            continue
        records += _evaluate_one(model, tok, tokens, lengths, ends, target, base, passkey)
    return records
