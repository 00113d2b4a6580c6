"""Where a method is the identity, run plain attention: a window that no pair of the call reaches and a remap
whose exact range holds every pair are dropped for that call.

StreamingLLM, LM-Infinite, a sliding window, ReRoPE, Leaky ReRoPE and SelfExtend change nothing while every
(query, key) distance stays inside their window: ReRoPE's and SelfExtend's near branch is plain RoPE, a window
of ``w`` keys hides nothing from a query that has fewer than ``w`` keys behind it, and StreamingLLM numbers its
sinks from the query's own slot until the cache is full. Their general paths (two branches merged by
log-sum-exp, the sinks + window pieces) still cost more than one causal kernel there: measured on SmolLM2 at 2k
tokens, StreamingLLM and LM-Infinite ran at about 2x the untouched model (docs/results/real-model-speed.md).
So for ``impl="auto"`` a call whose window hides no key (``max(q_pos) - max(min(k_pos), n_sinks) < window``: the
sinks are always visible), whose largest distance ``max(q_pos) - min(k_pos)`` is below the remap's distance limit
and whose largest query position is below its position limit
(:meth:`posenc.parts.branches.Remap.exact_within`), runs on :meth:`AttentionParts.plain_view
<posenc.engine.parts.AttentionParts.plain_view>`: the same scheme with a plain causal mask and no remap (biases,
log-n, frequencies and the dynamic schedule unchanged). ``tests/engine/test_exact.py`` checks the result equals the
general path's on both sides of each limit. A call that reaches a limit (one pair is enough) keeps the general
path, so a long prefill is not affected.
"""

from __future__ import annotations

import math
from dataclasses import replace

from posenc.engine.call import AttentionCall, memo_positions

__all__ = ["exact_call"]


def exact_call(call: AttentionCall) -> AttentionCall:
    """``call`` on its parts' :meth:`plain_view` where neither the mask's window nor the remap binds on any of its
    pairs; ``call`` itself otherwise (see the module docstring)."""
    parts = call.parts
    mask = parts.mask
    if not mask.causal or mask.block is not None or mask.chunk is not None or parts.multiaxis is not None:
        return call
    limits = parts.remap.exact_within()
    if limits is None or (mask.window is None and limits == (math.inf, math.inf)):
        return call  # a remap that states no exact range, or nothing to drop
    max_distance, max_position = limits
    q_max = memo_positions("max", (call.q_pos,), lambda: int(call.q_pos.max()))
    k_min = memo_positions("min", (call.k_pos,), lambda: int(call.k_pos.min()))
    if mask.window is not None and q_max - max(k_min, mask.n_sinks) >= mask.window:
        return call  # some key past the sinks is out of some query's window
    if q_max - k_min < max_distance and q_max < max_position:
        return replace(call, parts=parts.plain_view())
    return call
