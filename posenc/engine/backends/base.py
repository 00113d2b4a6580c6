"""What a backend is, and the checks several backends share.

A backend computes attention for an :class:`~posenc.engine.call.AttentionCall` exactly as the reference
does (same masks, branches, biases; only the summation order differs). It declares

- ``name``: the ``impl=`` value that selects it;
- ``why_not(call) -> str | None``: why it cannot compute this call exactly (None: it can). This is
  capability only; cost preferences of ``impl="auto"`` live in :mod:`posenc.engine.dispatch`;
- ``run(call) -> [B,H,Nq,Dv]``;
- ``learned_sinks``: whether it adds a call's ``sink_logits`` to the softmax denominator (the
  paths that finish on a materialised score tile, :func:`posenc.engine.scores.finish`); the others
  are passed over for such a call by :func:`posenc.engine.dispatch.choose_backend`;
- ``content_selection``: whether it applies a remap's key selection by head or content
  (:meth:`posenc.parts.remap.Remap.select`: InfLLM's block retrieval, DuoAttention's heads), which needs the
  score tile too; the others are passed over for such a scheme the same way.
- ``dtypes``: the input dtypes it computes. ``impl="auto"`` (and a fallback walk) passes over a backend
  for any other dtype; naming it for one (``impl="flex"`` with float64) is a ``TypeError`` that names
  the backends that run it. ``reference``, ``sdpa`` and ``blockwise`` run every float dtype (float64
  exactly: cos/sin and the softmax in float64); the fused CPU kernel takes float32 and bfloat16 only,
  compiled CPU flex float32, bfloat16 and float16 (inductor refuses float64).
"""

from __future__ import annotations

import torch

from posenc.engine.call import AttentionCall, position_run  # noqa: F401 - position_run: re-exported
from posenc.engine.parts import AttentionParts

ALL_FLOAT = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
FUSED_CPU = (torch.float32, torch.bfloat16)  # the fused pieces' dtypes (CPU flash kernel; CUDA memory-efficient)


class Backend:
    """Base class of the execution paths (one instance each in :data:`posenc.engine.backends.BACKENDS`)."""

    name: str = ""
    learned_sinks: bool = False  # can add call.sink_logits (one logit per head) to the softmax denominator
    content_selection: bool = False  # can run a remap that chooses keys by head or content (Remap.reads_content)
    dtypes: tuple[torch.dtype, ...] = ALL_FLOAT  # the input dtypes it computes (others: skipped / refused)

    def why_not(self, call: AttentionCall) -> str | None:  # noqa: ARG002 - every call, by default
        return None

    def gqa(self, call: AttentionCall) -> bool:  # noqa: ARG002 - no backend reads grouped keys unless it says so
        """Whether :meth:`run` takes keys and values with their own ``Hk < H`` heads (GQA: query head ``h``
        reads key head ``h // (H / Hk)``); otherwise :func:`posenc.engine.dispatch.run_backend` repeats them
        to the query heads first (a copy of the keys and values per call)."""
        return False

    def run(self, call: AttentionCall) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def first_reason(*checks: tuple[bool, str]) -> str | None:
    """The message of the first ``(failed, message)`` pair whose condition holds, else None."""
    return next((msg for failed, msg in checks if failed), None)


FEW_QUERIES = 64  # a decode step: below this many queries the pieces are key slices with small masks


def fused_reason(call: AttentionCall) -> str | None:
    """Why the device's fused kernel (:func:`posenc.engine.pieces.fused_lse`) cannot run the call's pieces (None:
    it can). On the CPU: the flash kernel, fp32 or bf16, values as wide as queries, any number of queries (it
    reads the Toeplitz views through their strides). On another device (CUDA) the pieces' masks are copied into
    aligned biases, so only a few queries (a decode step, fewer than :data:`FEW_QUERIES`) run there; a longer run
    goes to compiled FlexAttention, which merges branches by their log-sum-exp itself."""
    q, v = call.q, call.v
    if q.device.type != "cpu":
        return first_reason(
            (call.Nq >= FEW_QUERIES, f"on {q.device.type} the fused pieces take fewer than {FEW_QUERIES} queries "
                                     f"(a decode step; {call.Nq} here): FlexAttention runs a longer run"),
            (q.dtype not in FUSED_CPU, f"the fused pieces take fp32/bf16, not {q.dtype}"),
            (v.shape[-1] != q.shape[-1], "the fused kernel needs values as wide as queries"))
    return first_reason(
        (q.dtype not in (torch.float32, torch.bfloat16), f"the fused CPU flash kernel takes fp32/bf16, not {q.dtype}"),
        (v.shape[-1] != q.shape[-1], "the fused CPU flash kernel needs values as wide as queries"),
        (not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
         "this torch has no fused CPU flash kernel"))


def merged_pieces_reason(call: AttentionCall, *own: tuple[bool, str]) -> str | None:
    """Why a backend that runs a remap's pieces on the fused CPU flash kernel and merges them by log-sum-exp
    (``band``, ``chunks``, ``retrieved``) cannot run ``call``: its ``own`` checks first, then what every such
    backend needs (nothing else in the scores, plain causal mask, no padding, inference, the fused kernel, keys
    at positions ``0..Nk-1`` with a contiguous run of queries)."""
    parts = call.parts
    reason = first_reason(
        *own,
        (parts.bias is not None, "a bias would need the remapped distance per piece"),
        (parts.relative is not None, "content-relative terms"),
        (parts.scheme.softcap is not None, "a soft-cap"),
        (not parts.mask.is_plain_causal, "the mask is not plain causal"),
        (parts.remap.restricts_keys, "the remap adds a mask"),
        (call.key_mask is not None, "padding keys break the positions-as-indices layout"),
        (call.needs_grad, "the merge has no backward here"),
    ) or fused_reason(call)
    if reason is None and call.q_run is None:
        reason = "positions are not keys 0..Nk-1 with a contiguous run of queries in every row"
    return reason


def fixed_distance_bias(parts: AttentionParts) -> bool:
    """No bias, or one that depends only on the distance and needs no gradient here (its table can be
    read once as a profile)."""
    bias = parts.bias
    return bias is None or (bias.translation_invariant and not (
        torch.is_grad_enabled() and any(p.requires_grad for p in bias.parameters())))


def distance_profile(parts: AttentionParts, reach: int, device) -> torch.Tensor:
    """``[H, reach]`` bias at distances ``0..reach-1`` (zeros without a bias)."""
    if parts.bias is None:
        return torch.zeros(parts.n_heads, reach, dtype=torch.float32, device=device)
    return parts.bias.distance_profile(reach, device=device)
