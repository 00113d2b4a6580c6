"""Answer every query of a context from one prefill: the affordable way to run a long-context suite on a CPU.

:func:`run_context` runs the model once over the context with a KV cache (``use_cache=True``), keeping only the
logits it needs (``logits_to_keep``: the target passage's, or the last one: a 16k context would otherwise return
16k x 49k float32 logits, 3.2 GB). From that one forward it reads

- the perplexity of the target passage (book haystacks: the last ``target`` tokens, scored with the whole
  context in front of them), and
- every answer: for each query the cache is rewound to the end of the context (each cache layer gets back the
  key and value tensors it held after the prefill: :func:`snapshot`, :func:`rewind`), the question is appended and
  the answer decoded greedily, token by token, until a line break, an end-of-sequence token or the query's budget.
  (``cache.crop`` cannot rewind a sliding-window layer once it has dropped keys past its window, as Gemma 3's
  local layers do after the prefill; transformers raises there. The tensors the prefill left are never changed in
  place, an update concatenates, so handing them back is exact on every layer kind.)

So a query costs a few dozen tokens of decoding against the cached context instead of a prefill of its own.
The prefill's wall time and the process's peak resident memory during it (Linux ``VmHWM``, reset before the
prefill through ``/proc/self/clear_refs``) are recorded with the answers; on CUDA the prefill is timed to the end
of its kernels (``torch.cuda.synchronize``) and the peak GPU memory it allocated is recorded too
(``peak_gpu_mb``). Every tensor is made on the model's device.

Right before the prefill the machine's speed is probed (:func:`matmul_gflops`: the best of a few float32 matmuls on
the model's device, about 0.1 s on 2 CPU cores) and recorded as ``gflops``: prefill times of different sittings are
comparable only where the machines were alike. (YaRN's 128k prefills of Gemma 3 270M took 483 s in one sitting and
821 s in the next, both on an idle 2-core machine.)
"""

from __future__ import annotations

import inspect
import math
import re
import time
from pathlib import Path

import torch

from posenc.tasks.context import Context
from posenc.tasks.score import answer_text, score

__all__ = ["cache_kwarg", "greedy_answer", "matmul_gflops", "output_cache", "peak_rss_mb", "reset_peak_rss", "rewind",
           "run_context", "snapshot"]

_STATUS = Path("/proc/self/status")


def reset_peak_rss() -> bool:
    """Reset the process's peak resident set size (Linux); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    """The process's peak resident set size since the last reset, in MiB (None where /proc is missing)."""
    try:
        m = re.search(r"VmHWM:\s+(\d+)\s+kB", _STATUS.read_text())
    except OSError:
        return None
    return int(m.group(1)) / 1024 if m else None


def matmul_gflops(device="cpu", n: int = 1024, repeats: int = 5) -> float:
    """The best achieved float32 GFLOP/s of an ``n x n`` matmul (``2 n^3`` flops) on ``device``, now, over
    ``repeats`` timed runs after one untimed."""
    device = torch.device(device)
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b
    _sync(device)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def cache_kwarg(model) -> str:
    """The name a model's ``forward`` takes its KV cache by: ``cache`` (transformers >= 5.24) or
    ``past_key_values`` (earlier releases, where ``cache`` is not a parameter)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def output_cache(out):
    """The KV cache of a model output (``cache`` or, before transformers 5.24, ``past_key_values``)."""
    return out["cache"] if "cache" in out else out.past_key_values


_LAYER_STATE = ("keys", "values", "cumulative_length")  # what a transformers cache layer's update replaces


def snapshot(cache) -> list[dict]:
    """What each layer of ``cache`` holds now (its key and value tensors, and a sliding layer's token count): the
    references, not copies (module docstring)."""
    return [{a: getattr(layer, a) for a in _LAYER_STATE if hasattr(layer, a)} for layer in cache.layers]


def rewind(cache, state: list[dict]) -> None:
    """Give every layer of ``cache`` back what :func:`snapshot` saw."""
    for layer, saved in zip(cache.layers, state, strict=True):
        for a, v in saved.items():
            setattr(layer, a, v)


@torch.no_grad()
def greedy_answer(model, tokenizer, cache, ids, max_new_tokens: int, lines: bool = False) -> tuple[str, int]:
    """Append ``ids`` to ``cache`` and decode greedily until a line break after some text (a blank line with
    ``lines``), an end-of-sequence token or ``max_new_tokens``: ``(generated text, tokens decoded)``."""
    eos = {t for t in (tokenizer.eos_token_id,) if t is not None}
    device = next(model.parameters()).device
    inp = torch.tensor([list(ids)], device=device)
    kw = cache_kwarg(model)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(input_ids=inp, use_cache=True, logits_to_keep=1, **{kw: cache}).logits
        nxt = int(logits[0, -1].argmax())
        if nxt in eos:
            break
        out.append(nxt)
        text = tokenizer.decode(out)
        if answer_text(text, lines) != text.strip():  # a line break (a blank line for lists) ended the answer
            break
        inp = torch.tensor([[nxt]], device=device)
    return tokenizer.decode(out), len(out)


def _sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA runs asynchronously: a clock read before it ends would time
    the kernel launches, not the prefill)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _target_losses(logits: torch.Tensor, ids: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss (nats) and top-1 hit of the last ``target`` tokens from the logits of the ``target + 1``
    positions before them (``logits [target + 1, V]``)."""
    pred = logits[:-1].float()
    gold = ids[-target:]
    return torch.nn.functional.cross_entropy(pred, gold, reduction="none"), (pred.argmax(-1) == gold)


@torch.no_grad()
def run_context(model, tokenizer, ctx: Context, *, block: int = 64) -> dict:
    """Prefill ``ctx`` once, score its target passage and answer its queries (module docstring). Returns
    ``{"prefill_s", "peak_rss_mb", "target": {"loss", "accuracy", "block_losses", "tokens"} | None,
    "answers": [{"kind", "correct", "fraction", "answer", "depth", "distance", "chance"}], "decode_tokens",
    "decode_s", "gflops"}`` (and ``"peak_gpu_mb"`` on CUDA); ``block_losses`` are mean losses over consecutive
    ``block``-token blocks of the target."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(ctx.ids)], device=device)
    gflops = matmul_gflops(device)
    reset_peak_rss()
    gpu = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t = time.perf_counter()
    out = model(input_ids=ids, use_cache=True, logits_to_keep=ctx.target + 1 if ctx.target else 1)
    _sync(device)
    prefill_s = time.perf_counter() - t
    peak = peak_rss_mb()
    if device.type == "cuda":
        gpu = {"peak_gpu_mb": torch.cuda.max_memory_allocated(device) / 2**20}
    target = None
    if ctx.target:
        nll, hit = _target_losses(out.logits[0], ids[0], ctx.target)
        blocks = [float(nll[i:i + block].mean()) for i in range(0, len(nll), block)]
        target = {"loss": float(nll.mean()), "accuracy": float(hit.float().mean()), "block_losses": blocks,
                  "tokens": int(ctx.target)}
        if not math.isfinite(target["loss"]):
            raise ValueError(f"non-finite loss on the target passage ({target['loss']}) at length {ctx.length}")
    cache = output_cache(out)
    del out
    prefilled = snapshot(cache)
    answers, decoded = [], 0
    t = time.perf_counter()
    for q in ctx.queries:
        rewind(cache, prefilled)
        text, n = greedy_answer(model, tokenizer, cache, q.ids, q.max_new_tokens, lines=len(q.golds) > 1)
        decoded += n + len(q.ids)
        correct, fraction = score(text, q.golds)
        answers.append({"kind": q.kind, "correct": correct, "fraction": fraction,
                        "answer": answer_text(text, len(q.golds) > 1), "depth": round(ctx.depth(q), 4),
                        "distance": ctx.distance(q), "chance": q.chance})
    return {"prefill_s": prefill_s, "peak_rss_mb": peak, "target": target, "answers": answers,
            "decode_tokens": decoded, "decode_s": time.perf_counter() - t, "gflops": gflops, **gpu}
