"""Where a query looks: the attention weights of a call's last query as posenc's engine computes them, per layer and
head, summed over regions of the keys.

:func:`record_last_query` takes, for every engine call in its block, the weights of the call's last query over its
keys (:func:`posenc.engine.dispatch.attention_weights`: every branch, mask and content choice of the method, the
dynamic schedule at that length) and the relative position each key is read at. :func:`region_mass` sums a row
over named regions of the positions. With the suite's contexts (:mod:`posenc.evals.attention`) the regions are

- ``answer``: the tokens of the needle(s) holding the answer that spell it (the pass key's digits); ``needle``: the
  rest of those needles' tokens; ``other_needles``: the other needles' tokens;
- ``start``: the first ``start`` tokens of the context (where attention sinks form, Xiao et al. 2023,
  arXiv:2309.17453); ``question``: the question's own tokens; ``haystack``: every other key;

and, across those regions, ``remapped``: the keys the method reads at a relative position other than their
distance (a remap's far keys: ReRoPE's keys past its window, SelfExtend's grouped keys, DCA's earlier chunks,
STRING's shifted ones, PI's compressed ones; 0 for RoPE, YaRN and NTK, which keep positions and change
frequencies; :func:`posenc.analysis.maps.read_positions`), and ``beyond``: keys more than the model's trained
length back. The regions other than ``remapped`` and ``beyond`` partition the keys, so they sum to 1 per head
(less where the layer has learned sinks).

A layer that does not run on posenc's engine appends no row (a transformers model: ``posenc.hf.extend(model,
method, native=False)``; the untouched model: ``extend(model, "none", native=False)``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["REGIONS", "WeightRow", "record_last_query", "region_mass"]

REGIONS = ("answer", "needle", "other_needles", "start", "question", "haystack")
"""The regions that partition a question's keys in :mod:`posenc.evals.attention` (module docstring); ``remapped`` and
``beyond`` cut across them."""


@dataclass(frozen=True)
class WeightRow:
    """One engine call's last query (batch row 0): its weights over the call's keys ``[H, Nk]`` (float32), the keys'
    positions ``k_pos [Nk]``, the query's position ``q_pos``, and the relative position each key is read at
    ``read [Nk]`` (float64; NaN for a key the query does not see)."""

    weights: torch.Tensor
    k_pos: torch.Tensor
    q_pos: int
    read: torch.Tensor


@contextmanager
def record_last_query(rows: list, limit: int | None = None):
    """Within the block, each :func:`posenc.engine.run_attention` call (at most ``limit``, then none) appends the
    :class:`WeightRow` of its last query to ``rows``: a forward pass appends one row per layer, in layer order."""
    from posenc.analysis.maps import read_positions
    from posenc.engine import dispatch

    def hook(call, n_kv, scale):  # noqa: ARG001 - the hook's signature
        if limit is not None and len(rows) >= limit:
            return
        with torch.no_grad():
            w = dispatch.attention_weights(call, scale, queries=[call.Nq - 1])[0, :, 0]  # [H,Nk]
            qp = call.q_pos[0, -1:]
            kp = call.k_pos[0]
            visible = call.parts.allowed(qp[:, None], kp[None, :])[0]
            read = read_positions(call.parts, qp[:, None], kp[None, :])[0].masked_fill(~visible, float("nan"))
        rows.append(WeightRow(w.float().cpu(), kp.cpu(), int(qp), read.cpu()))

    dispatch.CALL_HOOKS.append(hook)
    try:
        yield rows
    finally:
        dispatch.CALL_HOOKS.remove(hook)


def region_mass(row: WeightRow, regions: dict[str, torch.Tensor], train_len: int | None = None
                ) -> dict[str, torch.Tensor]:
    """The weight ``[H]`` of ``row`` on each region (``regions``: name -> bool ``[n]`` over positions ``0..n-1``; a key
    past ``n`` is in none), plus ``remapped`` (keys read at a position other than their distance, by more than half
    a position) and, with ``train_len``, ``beyond`` (keys ``train_len`` or more back)."""
    kp = row.k_pos
    out = {}
    for name, where in regions.items():
        inside = torch.zeros_like(kp, dtype=torch.bool)
        ok = kp < where.numel()
        inside[ok] = where[kp[ok]]
        out[name] = row.weights[:, inside].sum(-1)
    distance = (row.q_pos - kp).double()
    moved = (row.read - distance).abs() > 0.5  # NaN (unseen) compares False
    out["remapped"] = row.weights[:, moved].sum(-1)
    if train_len is not None:
        out["beyond"] = row.weights[:, distance >= train_len].sum(-1)
    return out
