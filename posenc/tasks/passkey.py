"""Passkey retrieval: find a 5-digit key hidden at a chosen depth in a long stretch of filler.

The prompt format is the one of Landmark Attention (Mohtashami & Jaggi, arXiv:2305.16300, file
``run_test.py``), reused by Position Interpolation (Chen et al., arXiv:2306.15595) and YaRN (Peng et al.,
arXiv:2309.00071)::

    There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. ...
    The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. (repeated)
    The pass key is 12345. Remember it. 12345 is the pass key.
    The grass is green. ... (repeated)
    What is the pass key? The pass key is 12345

Differences from the reference, for exact lengths under any tokenizer:

- the pieces are tokenized separately and their ids concatenated (for the byte tokenizer this is the
  tokenization of the joined text; for BPE it may differ from the canonical one at piece borders);
- the filler is cut in *tokens* to make the prompt exactly ``length_tokens`` long, and the key line is
  inserted at the filler-sentence border nearest to ``depth`` (the reference cuts characters, possibly
  mid-sentence);
- the question ends with a space, so the answer is exactly the digits (no leading-space token).

Scoring is teacher-forced greedy decoding in one forward pass (:func:`score_passkey`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from posenc._util import check_finite, check_positive_int
from posenc.tasks.landmark import FILLER, key_sentence

PASSKEY_FILLER = FILLER
PASSKEY_INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. "
                       "Find it and memorize them. I will quiz you about the important information there.")
PASSKEY_QUESTION = "What is the pass key? The pass key is "

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PasskeyPrompt:
    """One passkey trial. ``key_start`` is the token index where the key line begins, so the actual
    relative depth is ``key_start / length``."""

    length: int
    depth: float
    trial: int
    passkey: str
    prompt: list[int]
    answer: list[int]
    key_start: int


def _check_passkey(passkey) -> str:
    key = str(passkey)
    if isinstance(passkey, bool) or not re.fullmatch(r"[0-9]+", key):
        raise ValueError(f"passkey must be a non-negative integer or a string of digits, got {passkey!r}")
    return key


def _filler_tokens(filler: str, tokenizer, n: int, seed: int) -> tuple[list[int], list[int]]:
    """``n`` filler token ids (whole sentences repeated, the last one cut) and the token offsets at which
    sentences start. ``seed`` rotates which sentence comes first."""
    sentences = [s.strip() + " " for s in re.findall(r"[^.!?]+[.!?]*", filler) if s.strip()]
    if not sentences:
        raise ValueError("filler must contain some non-space text")
    shift = seed % len(sentences)
    encoded = [tokenizer.encode(s) for s in sentences[shift:] + sentences[:shift]]
    if min(len(e) for e in encoded) == 0:
        raise ValueError("every filler sentence must encode to at least one token")
    ids: list[int] = []
    starts: list[int] = []
    i = 0
    while len(ids) < n:
        starts.append(len(ids))
        ids += encoded[i % len(encoded)]
        i += 1
    return ids[:n], starts


def _build_passkey(length_tokens: int, depth: float, passkey, tokenizer, filler: str | None, seed: int,
                   instruction: str | None, bos: bool, trial: int = 0) -> PasskeyPrompt:
    length_tokens = check_positive_int("length_tokens", length_tokens)
    depth = check_finite("depth", depth, minimum=0.0, maximum=1.0)
    key = _check_passkey(passkey)
    bos_id = getattr(tokenizer, "bos_id", None) if bos else None
    head = [bos_id] if bos_id is not None else []
    head += tokenizer.encode(instruction + "\n") if instruction else []
    key_ids = tokenizer.encode("\n" + key_sentence(key) + "\n")
    tail = tokenizer.encode("\n" + PASSKEY_QUESTION)
    n_fill = length_tokens - len(head) - len(key_ids) - len(tail)
    if n_fill < 0:
        raise ValueError(f"length_tokens must be >= {length_tokens - n_fill} (instruction, key line and "
                         f"question alone) for this tokenizer, got {length_tokens}")
    fill, starts = _filler_tokens(filler or PASSKEY_FILLER, tokenizer, n_fill, seed)
    cuts = sorted({s for s in starts if s <= n_fill} | {0, n_fill})
    target = depth * n_fill
    cut = min(cuts, key=lambda c: (abs(c - target), c))  # nearest sentence border; ties -> earlier
    prompt = head + fill[:cut] + key_ids + fill[cut:] + tail
    assert len(prompt) == length_tokens
    return PasskeyPrompt(length_tokens, depth, trial, key, prompt, tokenizer.encode(key), len(head) + cut)


def make_passkey_prompt(length_tokens: int, depth: float, passkey, tokenizer, filler: str | None = None,
                        seed: int = 0, *, instruction: str | None = PASSKEY_INSTRUCTION,
                        bos: bool = True) -> tuple[list[int], list[int]]:
    """Passkey prompt of exactly ``length_tokens`` ids and the answer ids (the key's digits).

    ``depth`` in [0, 1] places the key line at that fraction of the filler (0: right after the
    instruction, 1: right before the question). ``seed`` rotates the filler's sentences. With ``bos``
    the prompt starts with ``tokenizer.bos_id`` when the tokenizer has one (as every training document
    does in :func:`posenc.data.tokenizer.encode_documents`). Format and deviations: see the module docstring.
    """
    p = _build_passkey(length_tokens, depth, passkey, tokenizer, filler, seed, instruction, bos)
    return p.prompt, p.answer


def passkey_grid(lengths: Sequence[int], depths: Sequence[float], n_trials: int, tokenizer, seed: int = 0,
                 *, filler: str | None = None, digits: int = 5, instruction: str | None = PASSKEY_INSTRUCTION,
                 bos: bool = True) -> list[PasskeyPrompt]:
    """Every (length, depth, trial) prompt, in that nesting order. The passkey of a trial is drawn
    uniformly from the ``digits``-digit numbers by ``np.random.default_rng([seed, length, depth_ppm,
    trial])``, so a cell's prompts do not change when other lengths or depths are added; trial ``t``
    rotates the filler by ``seed + t`` sentences."""
    n_trials = check_positive_int("n_trials", n_trials)
    digits = check_positive_int("digits", digits)
    out = []
    for length in lengths:
        for depth in depths:
            for trial in range(n_trials):
                rng = np.random.default_rng([int(seed), int(length), round(float(depth) * 1e6), trial])
                key = str(int(rng.integers(10 ** (digits - 1), 10**digits)))
                out.append(_build_passkey(length, depth, key, tokenizer, filler, int(seed) + trial,
                                          instruction, bos, trial))
    return out


@torch.no_grad()
def score_passkey(logits_fn: LogitsFn, prompt: Sequence[int], answer: Sequence[int],
                  device: torch.device | str | None = None) -> dict:
    """Teacher-forced greedy check of the answer in one forward pass.

    Feeds ``prompt + answer[:-1]`` (``[1, N]``; the last answer token is never an input) and takes the
    argmax of the logits at the ``len(answer)`` positions that predict the answer tokens. Returns
    ``exact`` (1.0 iff every answer token is right, else 0.0), ``digit_accuracy`` (fraction right;
    per digit for the byte tokenizer) and ``predicted`` (the argmax ids).
    """
    if len(prompt) == 0 or len(answer) == 0:
        raise ValueError("prompt and answer must be non-empty")
    ids = torch.tensor([list(prompt) + list(answer[:-1])], dtype=torch.long, device=device)  # [1, N]
    logits = logits_fn(ids)  # [1, N, V]
    if logits.dim() != 3 or logits.shape[:2] != ids.shape:
        raise ValueError(f"logits_fn must return [1, {ids.shape[1]}, V], got {tuple(logits.shape)}")
    start = len(prompt) - 1
    pred = logits[0, start:start + len(answer)].argmax(-1).cpu()  # [len(answer)]
    hits = pred == torch.tensor(list(answer), dtype=torch.long, device="cpu")  # pred was moved to the host
    return {"exact": float(hits.all()), "digit_accuracy": float(hits.float().mean()),
            "predicted": pred.tolist()}


def run_passkey(logits_fn: LogitsFn, prompts: Sequence[PasskeyPrompt], *, device=None,
                progress: bool = False) -> dict:
    """Score a grid. Returns ``trials`` (one dict per prompt) and ``cells``: per (length, depth) the mean
    ``accuracy`` (exact match) and ``digit_accuracy`` over trials, in grid order."""
    from tqdm.auto import tqdm

    trials, cells = [], {}
    for p in tqdm(prompts, desc="passkey", disable=not progress):
        s = score_passkey(logits_fn, p.prompt, p.answer, device)
        trials.append({"length": p.length, "depth": p.depth, "trial": p.trial, "passkey": p.passkey,
                       "key_start": p.key_start, **s})
        cells.setdefault((p.length, p.depth), []).append(s)
    rows = [{"length": length, "depth": depth, "n": len(v),
             "accuracy": sum(s["exact"] for s in v) / len(v),
             "digit_accuracy": sum(s["digit_accuracy"] for s in v) / len(v)}
            for (length, depth), v in cells.items()]
    return {"trials": trials, "cells": rows}
