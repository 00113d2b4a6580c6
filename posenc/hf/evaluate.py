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

from posenc.lab.evaluate import check_method_params, method_params
from posenc.lab.records import EvalRecord
from posenc.scheme.methods import parse_methods


def _used_params(model, method: str, given: dict) -> dict:
    """The parameters ``extend`` applied: the model's own ``rope_parameters`` for a method transformers runs
    (one schedule for all layers), else the given ones with the defaults the methods write in."""
    from posenc.hf.patch import train_len_of

    methods = parse_methods(method, hf=True)
    rp = getattr(model.config, "rope_parameters", None)
    if len(methods) == 1 and methods[0].hf_native and isinstance(rp, dict) and "rope_type" in rp:
        return {k: v for k, v in rp.items() if k not in ("rope_theta", "rope_type")}
    defaults: dict = {}
    for m in methods:
        defaults.update({k: v for k, v in m.filled_defaults(train_len_of(model.config)).items() if v is not None})
    return {**defaults, **given}


def _logits_fn(model):
    def fn(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False).logits

    return fn


@torch.no_grad()
def evaluate_hf(model_dir, tokens=None, lengths: Sequence[int] = (256,), methods: Sequence[str] = ("none",), *,
                text: str | None = None, params: dict | None = None, max_windows: int | None = 4,
                batch_size: int = 1, passkey_depths: Sequence[float] = (0.5,), passkey_trials: int = 0,
                tokenizer=None, device=None, seed: int = 0) -> list[dict]:
    """One :class:`posenc.lab.records.EvalRecord` row (``to_dict()``) per (method, length), with ``scheme``
    the model_type and ``params`` the parameters the method ran with. ``passkey`` is the mean exact
    accuracy over ``passkey_depths`` x ``passkey_trials`` prompts of that length (None when
    ``passkey_trials`` is 0). ``params`` go to each method that accepts them; one that no method accepts is a
    ``ValueError`` (it would be ignored). A method that cannot apply (``ValueError``) gives a record with
    ``status="error"`` and the message in ``note``."""
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
    check_method_params(methods, params, hf=True)
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

            given = method_params(method, params, hf=True)
            extend(model, method, **given)
            base = base.replace(params=_used_params(model, method, given))
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
