"""Train short, test long: perplexity / accuracy / passkey of a trained model at several lengths, under
its own scheme and under inference-time extension methods.

:func:`length_defaults` picks per-length defaults for each method in :data:`posenc.scheme.METHODS`
(the factor of PI / NTK / YaRN, windows of ReRoPE and the masks, SelfExtend's group ...), so that
``posenc eval run/ --lengths 128 512 --methods pi ntk yarn rerope`` needs no hand tuning.
:func:`evaluate_model` returns one :class:`posenc.lab.records.EvalRecord` row (as its ``to_dict()``) per
(eval_len, method), with ``status`` ``"ok"`` or ``"not_applicable"``.

A method that does not apply (ReRoPE on ALiBi, a second frequency schedule on a YaRN model, a learned
table read beyond its size) gives ``status="not_applicable"`` with the reason in ``note``; nothing is
silently truncated. A learned absolute table beyond its length is evaluated with Su's
``hierarchical`` decomposition when that method is requested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from posenc._util import check_device, check_positive_int
from posenc.lab.metrics import evaluate_lm
from posenc.lab.records import EvalRecord
from posenc.models.tinylm import TinyLM
from posenc.scheme.core import METHODS

_FACTOR_METHODS = ("pi", "ntk", "ntk_mixed", "yarn", "llama3")
PASSKEY_DEPTHS = (0.1, 0.5, 0.9)


def _leaky_factor(window: int, train_len: int, eval_len: int) -> float:
    """Smallest k >= 1 with ``w + (eval_len - 1 - w) / k <= train_len - 1`` (the largest relative distance
    at ``eval_len`` maps inside the trained range) and ``w (k - 1)`` an integer."""
    room = train_len - 1 - window
    if eval_len - 1 - window <= room or room <= 0:
        return 1.0 if room > 0 else float(max(1, eval_len))
    k_min = (eval_len - 1 - window) / room
    return 1.0 + math.ceil(window * (k_min - 1.0) - 1e-9) / window


def _selfextend_group(window: int, train_len: int, eval_len: int) -> int:
    """Smallest group G with the largest grouped position ``(eval_len-1)//G + w - w//G <= train_len - 1``."""
    for g in range(1, max(2, eval_len + 1)):
        if (eval_len - 1) // g + window - window // g <= train_len - 1:
            return g
    return max(1, eval_len)


def length_defaults(method: str, train_len: int, eval_len: int, *, head_dim: int | None = None,
                  base: float = 10000.0) -> dict:
    """Per-length defaults for an inference-time method (``"a+b"`` merges, the first method's value wins
    on a shared key, as ``PositionScheme.extend`` routes a parameter to the first method accepting it).

    - ``pi``/``ntk``/``ntk_mixed``/``yarn``/``llama3``: ``factor = max(1, eval_len / train_len)``;
    - ``rerope``: ``window = train_len // 2``;
    - ``leaky_rerope``: ``window = train_len // 4`` and the smallest ``factor`` with
      ``w + (eval_len - 1 - w) / factor <= train_len - 1`` and ``window * (factor - 1)`` an integer;
    - ``selfextend``: ``window = train_len // 2`` and the smallest ``group`` keeping grouped positions
      below ``train_len``;
    - ``rope_base``: ``base * (eval_len / train_len) ^ (d / (d - 2))`` (NTK-aware rule; needs ``head_dim`` d);
    - ``sliding_window``/``lm_infinite``: ``window = train_len`` (LM-Infinite: ``ceiling = train_len``,
      10 global tokens); ``streaming_llm``: 4 sinks + ``train_len - 4`` recent; ``bca``:
      ``block = train_len // 2``; ``pcw``: windows of ``train_len``;
    - dynamic schedules, ``logn``, ``hierarchical``, ``none``: no parameters.
    """
    names = [m.strip() for m in method.split("+") if m.strip()]
    if len(names) > 1:
        out: dict = {}
        for m in names:
            for k, v in length_defaults(m, train_len, eval_len, head_dim=head_dim, base=base).items():
                out.setdefault(k, v)
        return out
    fn = LENGTH_DEFAULTS.get(method)
    return {} if fn is None else fn(train_len, eval_len, head_dim, base)


def _rope_base_default(L, n, head_dim, base):
    if head_dim is None or head_dim <= 2:
        raise ValueError("method 'rope_base' needs head_dim (> 2) to choose the new base")
    return {"base": float(base) * max(1.0, n / L) ** (head_dim / (head_dim - 2))}


def _leaky_default(L, n, head_dim, base):
    w = max(1, L // 4)
    return {"window": w, "factor": _leaky_factor(w, L, n)}


def _selfextend_default(L, n, head_dim, base):
    w = max(1, L // 2)
    return {"window": w, "group": _selfextend_group(w, L, n)}


def _streaming_default(L, n, head_dim, base):
    sinks = min(4, L // 2)
    return {"n_sinks": sinks, "window": L - sinks}


# method -> fn(train_len, eval_len, head_dim, base) -> parameters; methods not listed take none
LENGTH_DEFAULTS: dict = {
    **{m: (lambda L, n, d, b: {"factor": max(1.0, n / L)}) for m in _FACTOR_METHODS},
    "rerope": lambda L, n, d, b: {"window": max(1, L // 2)},
    "leaky_rerope": _leaky_default,
    "selfextend": _selfextend_default,
    "rope_base": _rope_base_default,
    "sliding_window": lambda L, n, d, b: {"window": L},
    "lm_infinite": lambda L, n, d, b: {"window": L, "n_global": min(10, L // 2), "ceiling": L},
    "streaming_llm": _streaming_default,
    "bca": lambda L, n, d, b: {"block": max(1, L // 2)},
    "pcw": lambda L, n, d, b: {"window": L, "n_windows": max(1, math.ceil(n / L))},
}


def model_variant(model: TinyLM, method: str, eval_len: int) -> tuple[TinyLM, dict]:
    """``model`` under ``method`` (``ValueError`` when the method does not apply)."""
    if method == "none":
        return model, {}
    rope = model.scheme.rope
    head_dim = model.cfg.dim // model.cfg.n_heads
    if rope is not None:
        head_dim = int(head_dim * getattr(rope, "partial_rotary_factor", 1.0))
    params = length_defaults(method, model.cfg.train_len, eval_len, head_dim=head_dim,
                           base=getattr(rope, "base", 10000.0) if rope is not None else 10000.0)
    return model.with_scheme(method, **params), params


def _passkey_rate(logits_fn, tokenizer, eval_len: int, n_trials: int, seed: int) -> float:
    from posenc.lab.tasks import passkey_grid, run_passkey

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
    if mode not in ("nonoverlap", "sliding"):
        raise ValueError(f"mode must be 'nonoverlap' or 'sliding', got {mode!r}")
    for method in methods:
        names = [m.strip() for m in str(method).split("+")]
        unknown = [m for m in names if m not in METHODS and m != "none"]
        if not isinstance(method, str) or unknown:
            raise ValueError(f"unknown method {method!r}; inference-time methods (combine with '+'): "
                             f"{sorted(METHODS)}")


def _evaluate_one(m: TinyLM, rec: EvalRecord, tokens, methods, mode, max_windows, batch_size, tokenizer,
                  progress, passkey_trials, seed, device) -> EvalRecord:
    """``rec`` filled in by ``m`` (the model under ``rec.method``) at ``rec.eval_len``; ``ValueError`` when the
    method does not apply. ``tokenizer`` is None when no passkey is asked for."""
    eval_len = rec.eval_len
    limit = m.scheme.max_positions
    if limit is not None and eval_len > limit:
        hint = (" (requested as method 'hierarchical')" if "hierarchical" in methods
                else "; add method 'hierarchical' to read it through Su's decomposition")
        raise ValueError(f"eval_len {eval_len} is beyond the learned position table of {limit} "
                         f"positions{hint}")
    m.eval()

    def logits_fn(x):
        return m(x, impl="auto")

    with torch.no_grad():
        r = evaluate_lm(logits_fn, tokens, eval_len, mode, batch_size, max_windows, progress=progress, device=device)
        rec = rec.replace(ppl=r["ppl"], loss=r["loss"], accuracy=r["accuracy"], tokens=r["tokens"])
        if tokenizer is not None:
            try:
                rec = rec.replace(passkey=_passkey_rate(logits_fn, tokenizer, eval_len, passkey_trials, seed))
            except ValueError as exc:
                rec = rec.replace(note=f"passkey skipped: {exc}")
    return rec


def evaluate_model(model: TinyLM, tokens, lengths: Sequence[int], methods: Sequence[str] = (),
                   mode: str = "nonoverlap", max_windows: int | None = None, batch_size: int = 1,
                   passkey: bool = False, tokenizer=None, progress: bool = True, *, passkey_trials: int = 2,
                   seed: int = 0, device: str | torch.device | None = None) -> list[dict]:
    """One record per (eval_len, method) for ``"none"`` (the model's own scheme) and each of ``methods``.

    Perplexity/loss/accuracy come from :func:`posenc.lab.metrics.evaluate_lm` (``mode``, ``max_windows``,
    ``batch_size``) under ``torch.no_grad`` with ``impl="auto"``. With ``passkey`` (needs ``tokenizer``)
    ``passkey`` is the exact-match rate over depths :data:`PASSKEY_DEPTHS` x ``passkey_trials``.
    A method raising ``ValueError`` (it does not apply, or a learned table is too short) is reported
    ``not_applicable`` with the message as ``note``.
    """
    check_eval_args(lengths, methods, mode, max_windows, batch_size)
    if passkey and tokenizer is None:
        raise ValueError("passkey=True needs the tokenizer the model was trained with")
    methods = ["none"] + [m for m in methods if m != "none"]
    was = model.training
    model.eval()
    records = []
    for eval_len in lengths:
        for method in methods:
            rec = EvalRecord(scheme=model.scheme.name, method=method, params={}, train_len=model.cfg.train_len,
                             eval_len=int(eval_len))
            try:
                variant, params = model_variant(model, method, eval_len)
                rec = rec.replace(params=params)
                rec = _evaluate_one(variant, rec, tokens, methods, mode, max_windows, batch_size,
                                    tokenizer if passkey else None, progress, passkey_trials, seed, device)
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
    from posenc.lab.checkpoint import load_model, read_config, tokenizer_spec
    from posenc.lab.data import prepare

    check_eval_args(lengths, methods, mode, max_windows, batch_size)
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


def format_table(records: Sequence[dict]) -> str:
    """Plain-text table of records (one line each)."""
    head = f"{'scheme':16s} {'method':16s} {'train':>6s} {'eval':>6s} {'ppl':>10s} {'acc':>6s} {'passkey':>7s}  status"
    lines = [head, "-" * len(head)]
    for r in records:
        ppl = f"{r['ppl']:.3f}" if r["ppl"] is not None else "-"
        acc = f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-"
        pk = f"{r['passkey']:.2f}" if r["passkey"] is not None else "-"
        status = r["status"] + (f" ({r['note'][:70]})" if r["status"] != "ok" else "")
        lines.append(f"{r['scheme'][:16]:16s} {r['method'][:16]:16s} {r['train_len']:6d} {r['eval_len']:6d} "
                     f"{ppl:>10s} {acc:>6s} {pk:>7s}  {status}")
    return "\n".join(lines)
