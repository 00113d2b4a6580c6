"""Language-model probes for any model callable ``logits_fn(input_ids [B, N]) -> logits [B, N, V]``.

:func:`evaluate_lm` gives perplexity, loss and next-token top-1 accuracy at one evaluation length, in
two standard protocols:

- ``nonoverlap``: the split is cut into consecutive windows of ``eval_len`` inputs and every position
  counts. Early positions of each window see little context, which is the point when the question is
  "does the model still work at positions up to ``eval_len``?" (the train-short / test-long tables of
  ALiBi, arXiv:2108.12409, and of Su's ReRoPE post, which also reports accuracy).
- ``sliding``: windows advance by ``stride``; only the last ``stride`` positions of each window count,
  so every counted token (after the first window) sees a full ``eval_len`` context (Hugging Face's
  "perplexity of fixed-length models" recipe).

:func:`perplexity_vs_length` runs it for several lengths (the extrapolation curve). With
``per_position_loss`` the loss is also averaged per position bucket, for plots of loss vs position.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from posenc._util import check_positive_int
from posenc.data.batches import eval_window_starts

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def evaluate_lm(logits_fn: LogitsFn, tokens: np.ndarray, eval_len: int, mode: str = "nonoverlap",
                batch_size: int = 1, max_windows: int | None = None, stride: int | None = None,
                progress: bool = True, *, per_position_loss: bool = False, position_buckets: int = 32,
                device: torch.device | str | None = None, target_len: int | None = None,
                context_max: int | None = None) -> dict:
    """Mean next-token cross-entropy, perplexity and top-1 accuracy of ``logits_fn`` on ``tokens``.

    ``loss = sum(-log p(y_t | x_<=t)) / n`` over the counted targets (float64 sums of float32
    per-token losses); ``ppl = exp(loss)``; ``accuracy`` = fraction of counted targets that are the
    argmax of their logits; ``tokens`` = n. Windows come from :func:`posenc.data.batches.eval_window_starts`
    (``mode``, ``stride`` (sliding only; default ``eval_len // 2``), ``max_windows`` evenly spaced).

    With ``per_position_loss`` the result also has ``position_loss`` (mean loss of the counted targets
    at input positions ``[position_edges[i], position_edges[i+1])``; NaN where none counted) and
    ``position_edges`` (``min(position_buckets, eval_len)`` equal buckets over ``[0, eval_len)``).
    ``tail`` mode (``target_len``, ``context_max``): the same ``target_len`` last targets of windows ending at
    the same tokens at every ``eval_len`` (like-for-like perplexity across lengths). The result also has
    ``ppl_lo`` / ``ppl_hi``: the 95% interval of the perplexity over the windows (Student's t on the windows'
    mean losses, exponentiated: :func:`posenc.evals.stats.intervals.ppl_interval`; None with one window).
    Runs under ``torch.no_grad``; put a model in ``eval()`` mode before wrapping it.
    """
    from posenc.evals.stats.intervals import ppl_interval

    eval_len = check_positive_int("eval_len", eval_len)
    batch_size = check_positive_int("batch_size", batch_size)
    starts, score_from = eval_window_starts(len(tokens), eval_len, mode, stride, max_windows, target_len=target_len,
                                            context_max=context_max)
    n_buckets = min(check_positive_int("position_buckets", position_buckets), eval_len)
    edges = np.linspace(0, eval_len, n_buckets + 1).round().astype(np.int64)
    bucket_of = torch.from_numpy(np.searchsorted(edges, np.arange(eval_len), side="right") - 1)  # [N]
    pos = torch.arange(eval_len, device="cpu")  # scoring is on the host: the logits are moved there per batch
    loss_sum = correct = count = 0.0
    window_losses: list[float] = []
    bucket_loss = torch.zeros(n_buckets, dtype=torch.float64, device="cpu")
    bucket_count = torch.zeros(n_buckets, dtype=torch.float64, device="cpu")

    from tqdm.auto import tqdm

    batches = range(0, len(starts), batch_size)
    for b0 in tqdm(batches, desc=f"eval@{eval_len}", disable=not progress):
        s, f = starts[b0:b0 + batch_size], score_from[b0:b0 + batch_size]
        idx = s[:, None] + np.arange(eval_len + 1)  # [B, N + 1]
        win = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
        x, y = win[:, :-1], win[:, 1:]  # [B, N] each
        logits = logits_fn(x if device is None else x.to(device))  # [B, N, V]
        if logits.dim() != 3 or logits.shape[:2] != x.shape:
            raise ValueError(f"logits_fn must return [B, N, V] = [{x.shape[0]}, {x.shape[1]}, V], "
                             f"got {tuple(logits.shape)}")
        logits = logits.float().cpu()
        nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").double()  # [B, N]
        hit = (logits.argmax(-1) == y).double()  # [B, N]
        mask = (pos[None, :] >= torch.from_numpy(f)[:, None]).double()  # [B, N] counted targets
        window_losses += ((nll * mask).sum(1) / mask.sum(1).clamp_min(1)).tolist()
        loss_sum += float((nll * mask).sum())
        correct += float((hit * mask).sum())
        count += float(mask.sum())
        if per_position_loss:
            bucket_loss.index_add_(0, bucket_of, (nll * mask).sum(0))
            bucket_count.index_add_(0, bucket_of, mask.sum(0))
    loss = loss_sum / count
    out = {"ppl": math.exp(loss), "loss": loss, "accuracy": correct / count, "tokens": int(count),
           "windows": len(starts), "eval_len": eval_len, "mode": mode}
    iv = ppl_interval(window_losses, over="windows")
    out["ppl_lo"], out["ppl_hi"] = (iv.lo, iv.hi) if iv.known else (None, None)
    if per_position_loss:
        out["position_loss"] = (bucket_loss / bucket_count).tolist()  # 0/0 -> NaN for empty buckets
        out["position_edges"] = edges.tolist()
    return out


def perplexity_vs_length(logits_fn: LogitsFn, tokens: np.ndarray, eval_lens: Sequence[int],
                         mode: str = "nonoverlap", *, max_tokens: int | None = None, batch_size: int = 1,
                         stride: int | None = None, progress: bool = True, **kwargs) -> list[dict]:
    """:func:`evaluate_lm` at each length in ``eval_lens``. With ``max_tokens`` each length scores about
    that many tokens (``max_windows = max(1, max_tokens // eval_len)`` for nonoverlap, ``// stride`` for
    sliding), so long and short lengths cost about the same number of counted targets."""
    rows = []
    for n in eval_lens:
        max_windows = None
        if max_tokens is not None:
            per_window = n if mode == "nonoverlap" else (stride or max(1, n // 2))
            max_windows = max(1, check_positive_int("max_tokens", max_tokens) // per_window)
        rows.append(evaluate_lm(logits_fn, tokens, n, mode, batch_size, max_windows, stride, progress,
                                **kwargs))
    return rows
