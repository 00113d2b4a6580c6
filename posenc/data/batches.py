"""Reproducible training batches and evaluation windows over a 1-D token array.

:func:`batch_iterator` draws training windows that depend only on ``(seed, step)``, so a resumed run
sees exactly the batches it would have seen; :func:`eval_windows` tiles a split for evaluation.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from posenc._util import check_positive_int


def get_batch(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int, *, rank: int = 0,
              world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch number ``step``: ``batch_size`` (global) random windows of ``seq_len + 1`` tokens whose
    starts come from ``np.random.default_rng([seed, step])``, so the batch depends only on
    ``(seed, step)``. Rank ``r`` of ``world_size`` gets rows ``[r*b, (r+1)*b)`` with
    ``b = batch_size // world_size``. Returns ``x, y`` LongTensors ``[b, seq_len]``, ``y`` = ``x``
    shifted by one."""
    batch_size = check_positive_int("batch_size", batch_size)
    seq_len = check_positive_int("seq_len", seq_len)
    world_size = check_positive_int("world_size", world_size)
    if batch_size % world_size:
        raise ValueError(f"batch_size ({batch_size}) must be divisible by world_size ({world_size})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if len(tokens) < seq_len + 1:
        raise ValueError(f"seq_len + 1 = {seq_len + 1} exceeds the {len(tokens)} tokens available")
    starts = np.random.default_rng([int(seed), int(step)]).integers(0, len(tokens) - seq_len, size=batch_size)
    b = batch_size // world_size
    starts = starts[rank * b:(rank + 1) * b]
    idx = starts[:, None] + np.arange(seq_len + 1)  # [b, seq_len + 1]
    win = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return win[:, :-1], win[:, 1:]


def batch_iterator(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, start_step: int = 0, *,
                   rank: int = 0, world_size: int = 1,
                   num_steps: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield :func:`get_batch` for steps ``start_step, start_step + 1, ...`` (forever, or ``num_steps``
    batches). Resuming at ``start_step=k`` reproduces batches ``k, k+1, ...`` of an uninterrupted run."""
    step = check_positive_int("start_step", start_step, minimum=0)
    end = None if num_steps is None else step + check_positive_int("num_steps", num_steps, minimum=0)
    while end is None or step < end:
        yield get_batch(tokens, batch_size, seq_len, seed, step, rank=rank, world_size=world_size)
        step += 1


EVAL_MODES = ("nonoverlap", "sliding", "tail")


def eval_window_starts(n_tokens: int, seq_len: int, mode: str = "nonoverlap", stride: int | None = None,
                       max_windows: int | None = None, *, target_len: int | None = None,
                       context_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and ``score_from`` of each evaluation window of ``seq_len + 1`` tokens.

    ``tail`` (like-for-like across lengths; needs ``target_len`` T and ``context_max`` C >= ``seq_len``): the
    windows' last targets sit at the same token indices ``C, C + T, C + 2T, ...`` whatever ``seq_len``, and only
    each window's last T targets count, so every length scores *the same* target tokens, each with
    ``seq_len - T`` to ``seq_len - 1`` tokens of context in front (a longer length only adds context).

    ``nonoverlap``: starts ``0, L, 2L, ...``; every target counts (``score_from = 0``).
    ``sliding`` (stride ``s``, default ``L // 2``): windows end ``s`` tokens apart; the first counts all
    its targets, later ones only their last ``s`` targets, which thus see a full ``L``-token context;
    together they score every target up to the last window exactly once.
    ``max_windows`` keeps that many windows evenly spaced over the split (first one included).
    """
    seq_len = check_positive_int("seq_len", seq_len)
    if n_tokens < seq_len + 1:
        raise ValueError(f"seq_len + 1 = {seq_len + 1} exceeds the {n_tokens} tokens available")
    last = n_tokens - seq_len - 1  # largest valid start
    if mode == "tail":
        starts, score_from = _tail_starts(n_tokens, seq_len, target_len, context_max)
    elif mode == "nonoverlap":
        starts = np.arange(0, last + 1, seq_len)
        score_from = np.zeros_like(starts)
    elif mode == "sliding":
        stride = check_positive_int("stride", (seq_len // 2 or 1) if stride is None else stride)
        if stride > seq_len:
            raise ValueError(f"stride must be in [1, seq_len={seq_len}], got {stride}")
        starts = np.arange(0, last + 1, stride)
        score_from = np.where(starts == 0, 0, seq_len - stride)
    else:
        raise ValueError(f"mode must be one of {EVAL_MODES}, got {mode!r}")
    if max_windows is not None and check_positive_int("max_windows", max_windows) < len(starts):
        keep = np.unique(np.linspace(0, len(starts) - 1, max_windows).round().astype(np.int64))
        starts, score_from = starts[keep], score_from[keep]
    return starts, score_from


def _tail_starts(n_tokens: int, seq_len: int, target_len, context_max) -> tuple[np.ndarray, np.ndarray]:
    """``tail`` mode's windows (:func:`eval_window_starts`): the last target of window ``j`` is token
    ``context_max + j * target_len``, whatever ``seq_len``."""
    if target_len is None or context_max is None:
        raise ValueError("mode 'tail' needs target_len and context_max")
    target_len = check_positive_int("target_len", target_len)
    context_max = check_positive_int("context_max", context_max)
    if not target_len <= seq_len <= context_max:
        raise ValueError(f"mode 'tail' needs target_len ({target_len}) <= seq_len ({seq_len}) <= context_max "
                         f"({context_max})")
    if n_tokens < context_max + 1:
        raise ValueError(f"context_max + 1 = {context_max + 1} exceeds the {n_tokens} tokens available")
    ends = np.arange(context_max, n_tokens, target_len)  # index of each window's last target token
    starts = ends - seq_len
    return starts, np.full_like(starts, seq_len - target_len)


def eval_windows(tokens: np.ndarray, seq_len: int, mode: str = "nonoverlap", stride: int | None = None,
                 max_windows: int | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``(window, score_from)``: ``window`` is int64 ``[seq_len + 1]`` (inputs ``window[:-1]``,
    targets ``window[1:]``), and targets ``[score_from:]`` count. See :func:`eval_window_starts`."""
    starts, score_from = eval_window_starts(len(tokens), seq_len, mode, stride, max_windows)
    for s, f in zip(starts.tolist(), score_from.tolist()):
        yield np.asarray(tokens[s:s + seq_len + 1], dtype=np.int64), f
