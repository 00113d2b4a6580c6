"""Train short, test long: perplexity / accuracy / passkey of a trained model at several lengths, under
its own scheme and under inference-time extension methods.

:func:`length_defaults` picks per-length defaults for each method (the records'
:meth:`posenc.methods.Method.length_defaults`: the factor of PI / NTK / YaRN, windows of ReRoPE
and the masks, SelfExtend's group ...), so that
``posenc eval run/ --lengths 128 512 --methods pi ntk yarn rerope`` needs no hand tuning.
:func:`evaluate_model` returns one :class:`posenc.evals.records.EvalRecord` row (as its ``to_dict()``) per
(eval_len, method), with ``status`` ``"ok"`` or ``"not_applicable"``.

A method that does not apply (ReRoPE on ALiBi, a second frequency schedule on a YaRN model, a learned
table read beyond its size) gives ``status="not_applicable"`` with the reason in ``note``; nothing is
silently truncated. A learned absolute table beyond its length is evaluated with Su's
``hierarchical`` decomposition when that method is requested.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc._util import check_device, check_positive_int
from posenc.data.batches import EVAL_MODES
from posenc.evals.lab.metrics import evaluate_lm
from posenc.evals.records import EvalRecord
from posenc.methods import (
    METHODS,
    NONE,
    check_method_params,
    is_identity,
    length_defaults,
    method_params,
    parse_methods,
)
from posenc.models.tinylm import TinyLM

PASSKEY_DEPTHS = (0.1, 0.5, 0.9)








def model_variant(model: TinyLM, method: str, eval_len: int, params: dict | None = None) -> tuple[TinyLM, dict]:
    """``model`` under ``method`` (``ValueError`` when the method does not apply), with the parameters used.
    ``params`` (those the method takes: :func:`method_params`) override the per-length defaults at every
    length. The length defaults read the RoPE of the model's layers (each layer of a pattern; base 1e4 and
    the full head when none rotates); where the RoPE layers differ in a way that changes them
    (``rope_base`` on Gemma 3's 1e4 and 1e6 layers), no one default fits and the method is refused rather
    than given one layer's value."""
    if is_identity(method):
        return model, {}
    given = method_params(method, params)
    full = model.cfg.dim // model.cfg.n_heads
    ropes = sorted({(s.rope.base, s.rope.partial_rotary_factor)
                    for s in model.cfg.layer_schemes if s.rope is not None}) or [(10000.0, 1.0)]
    options = [{**length_defaults(method, model.cfg.train_len, eval_len, head_dim=int(full * part), base=base),
                **given} for base, part in ropes]
    if any(o != options[0] for o in options):
        raise ValueError(f"method {method!r} defaults to different parameters on this model's RoPE layers "
                         f"(base, rotary fraction) {ropes}: {options}; apply it per layer with "
                         f"model.with_scheme({method!r}, layers=[...], ...)")
    return model.with_scheme(method, **options[0]), options[0]


def _passkey_rate(logits_fn, tokenizer, eval_len: int, n_trials: int, seed: int) -> float:
    from posenc.tasks.passkey import passkey_grid, run_passkey

    digits = 5
    length = eval_len - (digits - 1)  # the answer's first digits - 1 are fed too: inputs stay <= eval_len
    prompts = passkey_grid([length], PASSKEY_DEPTHS, n_trials, tokenizer, seed, digits=digits)
    cells = run_passkey(logits_fn, prompts)["cells"]
    return sum(c["accuracy"] for c in cells) / len(cells)


def check_eval_args(lengths: Sequence[int], methods: Sequence[str] = (), mode: str = "nonoverlap",
                    max_windows: int | None = None, batch_size: int = 1) -> None:
    """``ValueError`` for a setting that would otherwise only turn every record into an error row:
    a length or batch size < 1, ``max_windows`` < 1, an unknown mode, or an unknown method name."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise ValueError(f"lengths must be a list of integers >= 1, got {lengths!r}")
    for n in lengths:
        check_positive_int("eval length", n)
    check_positive_int("batch_size", batch_size)
    if max_windows is not None:
        check_positive_int("max_windows", max_windows)
    if mode not in EVAL_MODES:
        raise ValueError(f"mode must be one of {EVAL_MODES}, got {mode!r}")
    for method in methods:
        try:
            parse_methods(method)
        except ValueError:
            raise ValueError(f"unknown method {method!r}; inference-time methods (combine with '+'): "
                             f"{sorted(METHODS)}") from None


def _evaluate_one(m: TinyLM, rec: EvalRecord, tokens, methods, mode, max_windows, batch_size, tokenizer,
                  progress, passkey_trials, seed, device, tail=None) -> EvalRecord:
    """``rec`` filled in by ``m`` (the model under ``rec.method``) at ``rec.eval_len``; ``ValueError`` when the
    method does not apply. ``tokenizer`` is None when no passkey is asked for."""
    eval_len = rec.eval_len
    limit = m.scheme.max_positions
    if limit is not None and eval_len > limit:
        reader = next(r.name for r in METHODS.values() if r.kind == "embedding")  # Su's hierarchical table
        requested = any(r.kind == "embedding" for spec in methods for r in parse_methods(spec))
        hint = (f" (requested as method {reader!r})" if requested
                else f"; add method {reader!r} to read it through Su's decomposition")
        raise ValueError(f"eval_len {eval_len} is beyond the learned position table of {limit} "
                         f"positions{hint}")
    m.eval()

    def logits_fn(x):
        return m(x, impl="auto")

    with torch.no_grad():
        r = evaluate_lm(logits_fn, tokens, eval_len, mode, batch_size, max_windows, progress=progress, device=device,
                        **(tail or {}))
        rec = rec.replace(ppl=r["ppl"], loss=r["loss"], accuracy=r["accuracy"], tokens=r["tokens"],
                          extra={**rec.extra, "windows": r["windows"], "ppl_lo": r["ppl_lo"], "ppl_hi": r["ppl_hi"]})
        if tokenizer is not None:
            try:
                rec = rec.replace(passkey=_passkey_rate(logits_fn, tokenizer, eval_len, passkey_trials, seed))
            except ValueError as exc:
                rec = rec.replace(note=f"passkey skipped: {exc}")
    return rec


def evaluate_model(model: TinyLM, tokens, lengths: Sequence[int], methods: Sequence[str] = (),
                   mode: str = "nonoverlap", max_windows: int | None = None, batch_size: int = 1,
                   passkey: bool = False, tokenizer=None, progress: bool = True, *, passkey_trials: int = 2,
                   seed: int = 0, device: str | torch.device | None = None, params: dict | None = None,
                   target_len: int | None = None, context_max: int | None = None) -> list[dict]:
    """One record per (eval_len, method) for ``"none"`` (the model's own scheme) and each of ``methods``,
    its ``params`` those actually used: the per-length defaults, overridden by ``params`` (each to the methods
    that take it; one that none takes is a ``ValueError``: :func:`check_method_params`).

    Perplexity/loss/accuracy come from :func:`posenc.evals.lab.metrics.evaluate_lm` (``mode``, ``max_windows``,
    ``batch_size``; ``mode="tail"`` with ``target_len`` and ``context_max``: the same targets at every length)
    under ``torch.no_grad`` with ``impl="auto"``; each record's extra keys ``windows``, ``ppl_lo``, ``ppl_hi``
    give the number of windows and the perplexity's 95% interval over them. With ``passkey`` (needs ``tokenizer``)
    ``passkey`` is the exact-match rate over depths :data:`PASSKEY_DEPTHS` x ``passkey_trials``.
    A method raising ``ValueError`` (it does not apply, or a learned table is too short) is reported
    ``not_applicable`` with the message as ``note``.
    """
    check_eval_args(lengths, methods, mode, max_windows, batch_size)
    check_method_params(methods, params)
    if passkey and tokenizer is None:
        raise ValueError("passkey=True needs the tokenizer the model was trained with")
    methods = [NONE.name] + [m for m in methods if not is_identity(m)]
    was = model.training
    model.eval()
    records = []
    for eval_len in lengths:
        for method in methods:
            rec = EvalRecord(scheme=model.scheme.name, method=method, params={}, train_len=model.cfg.train_len,
                             eval_len=int(eval_len))
            try:
                variant, used = model_variant(model, method, eval_len, params)
                rec = rec.replace(params=used)
                rec = _evaluate_one(variant, rec, tokens, methods, mode, max_windows, batch_size,
                                    tokenizer if passkey else None, progress, passkey_trials, seed, device,
                                    tail={"target_len": target_len, "context_max": context_max} if mode == "tail"
                                    else None)
            except ValueError as exc:
                rec = rec.replace(status="not_applicable", note=str(exc))
            records.append(rec.to_dict())
    model.train(was)
    return records


def evaluate_checkpoint(run_dir, corpus: str | None = None, lengths: Sequence[int] = (), methods=(), *,
                        split: str = "test", mode: str = "nonoverlap", max_windows: int | None = None,
                        batch_size: int = 1, passkey: bool = False, progress: bool = True,
                        device: str = "cpu", **kw) -> list[dict]:
    """:func:`evaluate_model` on a saved run, on the ``split`` of ``corpus`` (default: the corpus it was
    trained on) prepared with the run's tokenizer. Each record also gets ``run_dir``, ``corpus``, ``split``."""
    from posenc.data.prepare import prepare
    from posenc.models.checkpoint import load_model, read_config, tokenizer_spec

    check_eval_args(lengths, methods, mode, max_windows, batch_size)
    check_method_params(methods, kw.get("params"))
    check_device("device", device)
    config = read_config(run_dir)
    tok_name, _ = tokenizer_spec(config)
    extra = config.get("extra") or {}
    corpus = corpus or extra.get("corpus") or "gutenberg"
    model = load_model(run_dir, device=device)
    data = prepare(corpus, tok_name)
    if data.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"corpus {corpus!r} with tokenizer {tok_name!r} gives vocab_size {data.vocab_size}, "
                         f"the model in {run_dir} has {model.cfg.vocab_size}")
    recs = evaluate_model(model, data.split(split), lengths or [model.cfg.train_len], methods, mode, max_windows,
                          batch_size, passkey, data.tokenizer, progress, device=device, **kw)
    for r in recs:
        r.update(run_dir=str(run_dir), corpus=str(corpus), split=split)
    return recs


def format_params(params: dict | None) -> str:
    """``{"factor": 2.0, "window": 8}`` -> ``"factor=2 window=8"`` (``-`` for none)."""
    if not params:
        return "-"
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))


def format_table(records: Sequence[dict]) -> str:
    """Plain-text table of records (one line each), with the method parameters each row actually used."""
    width = max([6] + [len(format_params(r.get("params"))) for r in records])
    head = (f"{'scheme':16s} {'method':16s} {'params':{width}s} {'train':>6s} {'eval':>6s} {'ppl':>10s} {'acc':>6s} "
            f"{'passkey':>7s}  status")
    lines = [head, "-" * len(head)]
    for r in records:
        ppl = f"{r['ppl']:.3f}" if r["ppl"] is not None else "-"
        acc = f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-"
        pk = f"{r['passkey']:.2f}" if r["passkey"] is not None else "-"
        status = r["status"] + (f" ({r['note'][:70]})" if r["status"] != "ok" else "")
        train = "-" if r["train_len"] is None else r["train_len"]
        lines.append(f"{str(r['scheme'])[:16]:16s} {r['method'][:16]:16s} {format_params(r.get('params')):{width}s} "
                     f"{train:>6} {r['eval_len']:6d} {ppl:>10s} {acc:>6s} {pk:>7s}  {status}")
    return "\n".join(lines)
