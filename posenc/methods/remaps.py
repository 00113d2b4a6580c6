"""Position remaps (``kind`` ``remap``): ReRoPE, Leaky ReRoPE, SelfExtend, PCW and STRING, with their per-length
defaults; the branches are :mod:`posenc.parts.remap`."""

from __future__ import annotations

import math

from posenc.methods.common import remap, window_param
from posenc.methods.records import Method, Param


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


def _leaky_default(L, n, head_dim, base):
    w = max(1, L // 4)
    return {"window": w, "factor": _leaky_factor(w, L, n)}


def _selfextend_default(L, n, head_dim, base):
    w = max(1, L // 2)
    return {"window": w, "group": _selfextend_group(w, L, n)}


def _string_default(L, n, head_dim, base):
    """STRING at ``n``: local window W, shift S = L // 3 raised so that ``n - 1 - S + W < L``; the diagonal piece
    (d < S) also stays below L only while ``n <= 2L - W`` (past it no S can: it reaches ``n - L + W - 1``)."""
    local = _string_local(L)
    return {"shift": min(max(L // 3, n - L + local, local, 1), max(n - 1, 1)), "local": local}


def _string_local(L: int) -> int:
    """STRING's local window W: 128 at the authors' 128k, here min(128, L // 16)."""
    return min(128, L // 16)


RECORDS = (
    Method(
        name="rerope",
        kind="remap",
        description="Su: relative position min(d, w)",
        paper="https://kexue.fm/archives/9708",
        apply=remap,
        params=(window_param("train_len // 2", lambda L: L // 2, filled=True, original="window"),),
        sets=("remap",),
        remap_kind="rerope",
        original="bojone/rerope rerope_patch.py",
        eval_defaults=lambda L, n, d, b: {"window": max(1, L // 2)},
    ),
    Method(
        name="leaky_rerope",
        kind="remap",
        description="Su: w + (d - w)/k beyond the window",
        paper="https://kexue.fm/archives/9708",
        apply=remap,
        params=(
            window_param("train_len // 4", lambda L: L // 4, filled=True, original="window"),
            Param(name="factor", default=16.0, minimum=1.0, filled=True, original="scaling_factor"),
        ),
        sets=("remap",),
        remap_kind="leaky_rerope",
        original="bojone/rerope leaky_rerope_patch.py",
        eval_defaults=_leaky_default,
    ),
    Method(
        name="selfextend",
        kind="remap",
        description="Jin et al. 2024: grouped positions beyond a neighbour window",
        paper="arXiv:2401.01325",
        apply=remap,
        params=(
            Param(
                name="group",
                default=4,
                minimum=1,
                integer=True,
                filled=True,
                original="group_size_1 (floor; LongLM's main patch uses W / G, equal when G divides W)",
            ),
            window_param("train_len // 2", lambda L: L // 2, filled=True, original="group_size_2 (neighbor window)"),
        ),
        sets=("remap",),
        remap_kind="selfextend",
        eval_defaults=_selfextend_default,
        original="datamllab/LongLM SelfExtend.py",
    ),
    Method(
        name="pcw",
        kind="remap",
        description="Ratner et al. 2023: parallel context windows",
        paper="arXiv:2212.10947",
        apply=remap,
        params=(
            window_param("train_len", lambda L: L, filled=True, original="the paper's context-window length"),
            Param(
                name="n_windows",
                default=2,
                minimum=1,
                integer=True,
                filled=True,
                original="the paper's number of windows B",
            ),
        ),
        sets=("remap",),
        remap_kind="pcw",
        eval_defaults=lambda L, n, d, b: {"window": L, "n_windows": max(1, math.ceil(n / L))},
    ),
    Method(
        name="string",
        kind="remap",
        description="An et al. 2024 (STRING): d < S keeps d, beyond it d - S + W (well-trained positions "
        "shifted over the far ones)",
        paper="arXiv:2410.18745",
        apply=remap,
        params=(
            Param(
                name="shift",
                rule="train_len // 3",
                minimum=1,
                integer=True,
                filled=True,
                from_train_len=lambda L: max(1, L // 3),
                original="shifted_offset (README: 0.25-0.4 L)",
            ),
            Param(
                name="local",
                rule="min(128, train_len // 16)",
                minimum=0,
                integer=True,
                filled=True,
                from_train_len=_string_local,
                original="small_local_value (local_value)",
            ),
            Param(
                name="attention_factor",
                default=1.0,
                minimum=0.0,
                strict=True,
                original="attention_factor = 0.1 ln 2 + 1 on cos and sin (hidden; set 1.0693 to reproduce)",
            ),
        ),
        sets=("remap",),
        remap_kind="string",
        eval_defaults=_string_default,
        original="HKUNLP/STRING string_for_llama.py",
    ),
)
