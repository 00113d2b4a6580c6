"""DuoAttention's head choice, training-free: :func:`calibrate_duo` runs a short calibration input once, and
for every attention call it saw, measures how much each key/value head's output changes when that head
attends only to the sinks and a recent window; the heads that change most keep full attention.

The original (Xiao et al. 2024, arXiv 2410.10819; mit-han-lab/duo-attention ``duo_attn/train.py``) learns one
gate per key/value head by gradient descent on synthetic passkey data (the output of a mix of full and
streaming attention distilled towards full attention, with an L1 penalty on the gates) and keeps the heads
whose gate passes a threshold. Here the same question (which heads need the distant keys?) is answered by
the quantity that optimisation trades off, without training: the relative deviation of each head's output,

    e_g = sum_(h in g, real queries) ||o_full(h) - o_stream(h)||^2 / sum_(h in g, real queries) ||o_full(h)||^2,

averaged over the query heads h of key/value head g, accumulated over every call of the run. The
``retrieval_fraction`` of all (layer, head) pairs with the largest e keep full attention (DuoAttention's
deployments keep 25-50 %); the rest stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import torch

from posenc._util import check_finite, check_positive_int
from posenc.engine import dispatch
from posenc.engine.parts import AttentionParts
from posenc.parts.retrieval import duo_query_heads
from posenc.scheme.part import Part

__all__ = ["calibrate_duo", "head_deviation", "record_calls"]


@contextmanager
def record_calls(calls: list):
    """Within the block, every :func:`posenc.engine.run_attention` call appends ``(call, n_kv_heads, scale)`` to
    ``calls`` (layers in the order a forward pass runs them)."""

    def hook(call, n_kv, scale):
        calls.append((call, n_kv, scale))

    dispatch.CALL_HOOKS.append(hook)
    try:
        yield calls
    finally:
        dispatch.CALL_HOOKS.remove(hook)


def _streaming_parts(parts: AttentionParts, n_sinks: int, window: int) -> AttentionParts:
    """The call's scheme with every head streaming (sinks + window)."""
    scheme = parts.scheme
    if scheme.remap is not None and not parts.remap.calibrated:
        raise ValueError(f"calibrate_duo needs layers without a position remap (or with 'duo'); this layer has "
                         f"{scheme.remap.kind!r}")
    heads = list(range(parts.n_heads))
    duo = Part("duo", {"streaming": heads, "n_sinks": n_sinks, "window": window})
    return AttentionParts(replace(scheme, remap=duo), parts.n_heads, parts.head_dim)


def head_deviation(call, n_kv_heads: int, scale, n_sinks: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(squared deviation, squared norm)`` per key/value head ``[Hk]`` of one call: full attention (its own
    scheme, every head retrieving) against every head streaming, summed over the real queries."""
    parts = call.parts
    if parts.remap.calibrated:  # a duo layer: calibrate it as all-full
        parts = AttentionParts(replace(parts.scheme, remap=None), parts.n_heads, parts.head_dim)
    stream = _streaming_parts(parts, n_sinks, window)
    args = dict(q_pos=call.q_pos, k_pos=call.k_pos, impl="blockwise", scale=scale, key_mask=call.key_mask)
    with torch.no_grad():
        full = dispatch.run_attention(parts, call.q, call.k, call.v, **args)
        part = dispatch.run_attention(stream, call.q, call.k, call.v, **args)
    dev = (full - part).double().pow(2).sum(dim=(0, 2, 3))  # [H]
    norm = full.double().pow(2).sum(dim=(0, 2, 3))
    g = parts.n_heads // n_kv_heads
    return dev.view(n_kv_heads, g).sum(1), norm.view(n_kv_heads, g).sum(1)


def calibrate_duo(run: Callable[[], object], n_layers: int, *, n_sinks: int = 4, window: int = 256,
                  retrieval_fraction: float = 0.5) -> list[list[int]]:
    """DuoAttention's streaming heads for a model, from one calibration run (see the module docstring).

    ``run()`` does a forward pass (or several) of the model through posenc's engine: a
    :class:`~posenc.TinyLM` (any RoPE scheme without a remap) or a transformers model after
    ``posenc.hf.extend(model, "duo")`` (every head retrieving). Calls are assigned to layers in order
    (call i belongs to layer ``i % n_layers``). Returns, per layer, the *query* heads that stream, ready for
    ``extend("duo", streaming=...)``. The input should hold what the model must retrieve from far back
    (DuoAttention calibrates on passkeys in long filler text) and be longer than ``n_sinks + window``."""
    check_positive_int("n_layers", n_layers)
    check_positive_int("n_sinks", n_sinks, minimum=0)
    check_positive_int("window", window)
    check_finite("retrieval_fraction", retrieval_fraction, minimum=0.0, maximum=1.0)
    calls: list = []
    with record_calls(calls):
        run()
    if not calls or len(calls) % n_layers:
        raise ValueError(f"calibrate_duo saw {len(calls)} attention calls, not a multiple of n_layers={n_layers}: "
                         f"run() must run whole forward passes through posenc's engine")
    dev: list = [None] * n_layers
    norm: list = [None] * n_layers
    kv = [0] * n_layers
    for i, (call, n_kv, scale) in enumerate(calls):
        d, n = head_deviation(call, n_kv, scale, n_sinks, window)
        layer = i % n_layers
        dev[layer] = d if dev[layer] is None else dev[layer] + d
        norm[layer] = n if norm[layer] is None else norm[layer] + n
        kv[layer] = n_kv
    errors = torch.cat([d / n.clamp(min=1e-300) for d, n in zip(dev, norm)])  # [sum Hk], layer-major
    keep = math.ceil(retrieval_fraction * errors.numel())
    order = torch.argsort(errors, descending=True, stable=True)
    retrieval = set(order[:keep].tolist())
    out, start = [], 0
    for layer in range(n_layers):
        streaming = [g for g in range(kv[layer]) if start + g not in retrieval]
        n_heads = calls[layer][0].parts.n_heads
        out.append(duo_query_heads(streaming, n_heads, kv[layer]))
        start += kv[layer]
    return out
