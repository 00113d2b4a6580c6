"""Which backend runs a call, and the entry point :func:`run_attention`.

Shape legend: B batch, H query heads, Hk key/value heads (GQA when Hk < H), Nq queries, Nk keys,
D head dim. Inputs q ``[B,H,Nq,D]``, k/v ``[B,Hk,Nk,D]`` are *un-rotated* projections; positions are
``[B,Nq]`` / ``[B,Nk]`` original token positions (a KV cache stores exactly these).

Backends, one semantics (:mod:`posenc.engine.backends`, each with ``why_not(call)``: why it cannot
compute a call exactly, None when it can):

``reference``  materialises ``[B,H,Nq,Nk]`` scores; per pair it picks the branch whose region holds
               it, adds biases and content-relative terms, masks, softmaxes. Short and readable:
               the ground truth, and the training path (autograd) at short lengths.
``sdpa``       single-branch schemes: rotate once, fused SDPA with the bias and mask as one additive
               mask (or its own ``is_causal``); the training path.
``blockwise``  the same computation tiled over queries: for each query tile only the key blocks
               the mask allows are gathered, and each remap branch is evaluated only on tiles its
               region touches (boundary tiles twice). Memory O(tile * keys visible), never N x N.
``flex``       ``torch.compile(flex_attention)``: biases as ``score_mod``, masks as block masks
               (fully masked blocks skipped). In torch 2.13 compiled CPU flex has no backward and
               no ``return_lse``, so one flex call covers a single-branch scheme without
               content-relative terms at inference.
``band``       multi-branch remaps whose regions are distance bands (ReRoPE, Leaky ReRoPE, SelfExtend,
               distance ceiling) on a plain causal mask: the fused CPU flash kernel per branch, merged
               by log-sum-exp.
``toeplitz``   a bias that depends only on the distance (ALiBi, KERPLE, T5, Sandwich) and/or a causal
               sliding window, on the fused CPU flash kernel with the bias as an O(N) strided view
               (:mod:`posenc.engine.toeplitz`): close to bias-free SDPA, where a materialised bias
               costs N^2 memory and compiled flex a slower kernel (measurements:
               docs/results/performance.md, benchmarks/).
``sinks``      attention sinks + a window (StreamingLLM, LM-Infinite): the window piece on the Toeplitz
               kernel, the sink keys scored like ``reference``, merged by log-sum-exp.
``chunks``     chunked three-branch remaps (Dual Chunk Attention): per query chunk the same-chunk,
               previous-chunk and earlier-chunks pieces on the fused CPU flash kernel, merged by
               log-sum-exp (linear memory).

``impl="auto"`` walks :data:`AUTO_ORDER`, a list of rules ``(backend, prefer)``, and runs the first
backend that both computes the call exactly (``why_not`` is None) and is preferred for it (``prefer``
is None). ``prefer`` is about cost only and reads the call's *size route* (:func:`size_route`):

- single branch, no content-relative terms, no soft-cap: fused SDPA (its causal kernel needs no mask
  at all; a bias or window becomes one additive mask while that stays below ``SDPA_MASK_ELEMENTS``,
  and always when training);
- beyond that, at inference: compiled FlexAttention (score_mod + block mask, linear memory), or for
  what flex cannot run (several branches, content-relative terms) its stand-ins ``band``, ``sinks``,
  ``chunks``, ``blockwise`` (linear memory), once ``Nq * Nk > FLEX_MIN_PAIRS``;
- the materialised ``reference`` otherwise (small, or gradients through what SDPA cannot run);
- overriding sdpa and flex for at least ``TOEPLITZ_MIN_QUERIES`` queries: distance-only biases and
  causal sliding windows on the fused CPU flash kernel (``toeplitz``, also for training fixed biases),
  and at inference attention sinks + window (``sinks``).

An explicit name runs that backend, or where it cannot compute the call exactly, its fallback
(:data:`FALLBACKS`): ``sdpa`` -> ``blockwise``; ``flex`` -> ``band``, ``sinks``, ``chunks``, else ``blockwise``;
``toeplitz`` -> the auto choice without the long-query overrides (``sdpa``, ``flex`` and its stand-ins,
``reference``); ``band``, ``sinks``, ``chunks`` -> ``blockwise``; ``reference`` and ``blockwise`` run every call.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from posenc._util import as_positions, check_finite
from posenc.engine.backends import BACKENDS, BY_NAME, Backend
from posenc.engine.backends import sdpa as sdpa_backend
from posenc.engine.backends.toeplitz import TOEPLITZ_MIN_QUERIES
from posenc.engine.call import AttentionCall, memo_positions
from posenc.engine.exact import exact_call
from posenc.engine.parts import AttentionParts
from posenc.engine.scores import query_scale

IMPLS = ("auto",) + tuple(b.name for b in BACKENDS)
FLEX_MIN_PAIRS = 256 * 256  # Nq * Nk beyond which auto leaves the materialised reference at inference
CALL_HOOKS: list = []  # fn(call, n_kv_heads, scale) for every run_attention call (posenc.evals.calibrate)
log = logging.getLogger("posenc")


# ====================================================================== the auto choice
def size_route(call: AttentionCall) -> str:
    """The cost class of a call, before the long-query overrides: ``"sdpa"``, ``"flex"`` (compiled flex
    or, for what flex cannot run, its linear-memory stand-ins) or ``"reference"`` (see the module
    docstring)."""
    if BY_NAME["sdpa"].why_not(call) is None and not call.parts.remap.reads_content:  # duo: blockwise at length
        small = call.B * call.H * call.Nq * call.Nk <= sdpa_backend.SDPA_MASK_ELEMENTS
        if (sdpa_backend.needs_no_mask(call.parts) and call.q_gate is None) or small or call.needs_grad:
            return "sdpa"
        if BY_NAME["flex"].why_not(call) is None:
            return "flex"
    if call.needs_grad:
        return "reference"
    return "flex" if call.Nq * call.Nk > FLEX_MIN_PAIRS else "reference"


Prefer = Callable[[AttentionCall, str], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One step of a walk: ``backend`` (a name) where ``prefer(call, route)`` is None (a cost reason
    to pass over it otherwise; None = no preference, only ``why_not`` decides)."""

    backend: str
    prefer: Prefer | None = None


def _long_fused(call: AttentionCall, route: str) -> str | None:
    """toeplitz and sinks beat a materialised SDPA mask and compiled flex once there are enough queries
    to amortise their per-chunk kernel calls; a decode step or a short prefix keeps SDPA."""
    if route not in ("sdpa", "flex"):
        return f"the size route is {route}"
    if call.Nq < TOEPLITZ_MIN_QUERIES:
        return f"{call.Nq} queries < TOEPLITZ_MIN_QUERIES: a materialised mask is as cheap"
    return None


def _few_fused(call: AttentionCall, route: str) -> str | None:  # noqa: ARG001 - any size route
    """band, chunks and sinks for a few queries at inference (a decode step): their pieces read and rotate
    only the keys each branch covers, where the materialised reference rotates every key once per branch
    (and sdpa, for sinks + window, every key)."""
    if call.needs_grad:
        return "autograd: the size route decides"
    if call.Nq >= TOEPLITZ_MIN_QUERIES:
        return f"{call.Nq} queries >= TOEPLITZ_MIN_QUERIES: the size route decides"
    return None


def _sinks_first(call: AttentionCall, route: str) -> str | None:
    """sinks over sdpa and flex: for long query runs (:func:`_long_fused`), and for a few queries of a scheme
    with attention sinks (:func:`_few_fused`; a window alone is sdpa's key slice)."""
    long = _long_fused(call, route)
    if long is None or not call.parts.mask.n_sinks:
        return long
    return None if _few_fused(call, route) is None else long


def _flex_route(call: AttentionCall, route: str) -> str | None:
    """Compiled flex on the flex size route, for a run of queries: it compiles once per shape, so a decode
    step (a new key count every step) goes to the pieces that read key slices instead."""
    if route != "flex":
        return f"the size route is {route}"
    if call.Nq < TOEPLITZ_MIN_QUERIES:
        return f"{call.Nq} queries < TOEPLITZ_MIN_QUERIES: compiled flex would compile a kernel per key count"
    return None


def _route_is(name: str) -> Prefer:
    """Preferred only on the size route ``name`` (sdpa's, or flex's and its stand-ins')."""

    def prefer(call: AttentionCall, route: str) -> str | None:
        return None if route == name else f"the size route is {route}"
    return prefer


#: ``impl="auto"``: the first rule whose backend is exact and preferred. toeplitz and sinks override sdpa
#: and flex for long query runs; band, sinks and blockwise stand in for flex where flex cannot run; band,
#: chunks and sinks (with attention sinks) also take a few queries (a decode step) from sdpa and reference.
AUTO_ORDER: tuple[Rule, ...] = (
    Rule("toeplitz", _long_fused),
    Rule("sinks", _sinks_first),
    Rule("sdpa", _route_is("sdpa")),
    Rule("flex", _flex_route),
    Rule("band", _route_is("flex")),
    Rule("sinks", _route_is("flex")),
    Rule("chunks", _route_is("flex")),
    Rule("retrieved", _route_is("flex")),
    Rule("blockwise", _route_is("flex")),
    Rule("band", _few_fused),
    Rule("chunks", _few_fused),
    Rule("retrieved", _few_fused),
    Rule("reference"),
)

#: The backends whose kernels read, for a causal sliding window, only the keys inside it (memory and time linear in
#: the length for a fixed window): the Toeplitz kernel's window slices, the sinks pieces, flex's block mask and
#: blockwise's gathered key blocks. ``sdpa`` (one materialised mask) and ``reference`` read every key.
WINDOWED_BACKENDS = frozenset({"toeplitz", "sinks", "flex", "blockwise"})

#: ``impl=<name>`` where that backend cannot compute the call exactly: the rules walked next.
FALLBACKS: dict[str, tuple[Rule, ...]] = {
    "reference": (),
    "blockwise": (),
    "sdpa": (Rule("blockwise"),),
    "flex": (Rule("band"), Rule("sinks"), Rule("chunks"), Rule("retrieved"), Rule("blockwise")),
    # the auto choice without the long-query overrides: what impl="toeplitz" has always fallen back to
    # (a scheme toeplitz cannot run keeps sdpa there rather than switching to the sinks pieces)
    "toeplitz": AUTO_ORDER[2:],
    "band": (Rule("blockwise"),),
    "sinks": (Rule("blockwise"),),
    "chunks": (Rule("blockwise"),),
    "retrieved": (Rule("blockwise"),),
}


def _sinks_reason(backend: Backend, call: AttentionCall) -> str | None:
    if call.sink_logits is not None and not backend.learned_sinks:
        return ("learned attention sinks join the softmax denominator of a materialised score tile "
                "(reference, blockwise)")
    if call.parts.remap.reads_content and not backend.content_selection:
        able = ", ".join(b.name for b in BACKENDS if b.content_selection)
        return f"the remap chooses keys by head or content, which only some backends apply ({able})"
    return None


def _dtype_reason(backend: Backend, call: AttentionCall) -> str | None:
    if call.q.dtype in backend.dtypes:
        return None
    return f"it does not run {call.q.dtype} (it runs {', '.join(str(d).split('.')[-1] for d in backend.dtypes)})"


def check_dtype(impl: str, dtype: torch.dtype) -> None:
    """A backend named by ``impl`` that does not run ``dtype`` is refused (``TypeError`` naming the backends
    that do); ``impl="auto"`` passes such backends over instead."""
    if impl == "auto" or dtype in BY_NAME[impl].dtypes:
        return
    able = [b.name for b in BACKENDS if dtype in b.dtypes]
    raise TypeError(f"impl={impl!r} does not run {dtype} inputs (it runs "
                    f"{', '.join(str(d) for d in BY_NAME[impl].dtypes)}); {dtype} runs on impl={able} "
                    f"or impl='auto', or convert the inputs")


def choose_backend(call: AttentionCall, impl: str = "auto") -> tuple[Backend, list[tuple[str, str]]]:
    """The backend ``impl`` runs for ``call``, and ``(name, reason)`` for each rule passed over first.
    A named backend that does not run the call's dtype is refused (:func:`check_dtype`)."""
    check_dtype(impl, call.q.dtype)
    rules = AUTO_ORDER if impl == "auto" else (Rule(impl), *FALLBACKS[impl])
    declined = []
    route = None
    for rule in rules:
        why = None
        if rule.prefer is not None:
            route = route or size_route(call)
            why = rule.prefer(call, route)
        backend = BY_NAME[rule.backend]
        why = why or _dtype_reason(backend, call) or _sinks_reason(backend, call) or backend.why_not(call)
        if why is None:
            return BY_NAME[rule.backend], declined
        declined.append((rule.backend, why))
    raise AssertionError(f"no backend for impl={impl!r}: {declined}")  # reference ends every walk


# ====================================================================== entry point
def run_attention(parts: AttentionParts, q, k, v, q_pos=None, k_pos=None, impl: str = "auto",
                  scale: float | None = None, key_mask: torch.Tensor | None = None,
                  gates: tuple[torch.Tensor, torch.Tensor] | None = None,
                  sink_logits: torch.Tensor | None = None, key_store=None) -> torch.Tensor:
    """Attention of un-rotated ``q [B,H,Nq,D]`` over ``k, v [B,Hk,Nk,D]`` under ``parts``.
    ``key_mask [B,Nk]`` (bool, True = real token) removes padding keys. On every path: a query that
    sees no key (all its keys padding or masked) gets a 0 output row, and a query row holding NaN or inf
    gets a NaN output row (NaN in, NaN out). ``scale``: the softmax scale, finite and > 0 (default
    ``1/sqrt(D)``). ``gates``: ``(q_gate [B,H,Nq], k_gate [B,H,Nk])`` cumulative log forget gates of a
    forget-gate scheme (FoX; :class:`~posenc.engine.PositionalAttention` computes them), required by one.
    ``sink_logits [H]``: learned attention sinks (GPT-OSS's ``s_aux``), one logit per query head added to every
    softmax denominator (a virtual key of value 0 that no mask hides); run by ``reference`` and
    ``blockwise`` (linear memory), the other backends pass such a call on. ``key_store``: a
    :class:`~posenc.engine.keystore.KeyStore` holding this layer's keys rotated by earlier calls (its owner has
    called ``begin`` for this call); only the keys it does not hold are rotated."""
    scale = check_inputs(q, k, v, impl, scale, key_mask)
    call = make_call(parts, q, k, v, q_pos, k_pos, key_mask, gates, sink_logits)
    if key_store is not None:
        call = replace(call, key_store=key_store)
    for hook in CALL_HOOKS:  # posenc.evals.calibrate.record_calls: what a calibration run attends to
        hook(call, k.shape[1], scale)
    if impl == "auto":
        call = exact_call(call)  # a window or remap that binds on no pair of the call: plain attention
    backend, declined = choose_backend(call, impl)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("attention impl=%s ran %s; declined: %s", impl, backend.name,
                  "; ".join(f"{n}: {why}" for n, why in declined) or "none")
    out = run_backend(backend, call, scale)
    if not math.isfinite(float(q.detach().sum())):  # NaN/inf in a query row gives a NaN output row, on every path
        out = out.masked_fill(~torch.isfinite(q).all(dim=-1)[..., None], float("nan"))  # [B,H,Nq,1]
    return out


def make_call(parts: AttentionParts, q, k, v, q_pos=None, k_pos=None, key_mask=None, gates=None,
              sink_logits=None) -> AttentionCall:
    """The call record of checked inputs: default and broadcast positions, whether autograd needs the call.
    Keys and values keep their own heads (GQA): :func:`run_backend` repeats them to the query heads only for a
    backend that reads keys per query head. Its schedule is filled in by :func:`run_backend`."""
    B, H, Nq, D = q.shape
    if (H, D) != (parts.n_heads, parts.head_dim):
        raise ValueError(f"q must have {parts.n_heads} heads of head_dim {parts.head_dim} (the layer's), got {H}, {D}")
    Nk = k.shape[2]
    q_axes, q_pos = _axes(parts, q_pos, B, Nq, q.device)
    k_axes, k_pos = _axes(parts, k_pos, B, Nk, k.device)
    if q_pos is None and Nq > Nk:
        raise ValueError(f"q has more tokens ({Nq}) than k ({Nk}): pass q_pos (default: the last Nq key positions)")
    q_pos = _as_positions(q_pos if q_pos is not None else _default_positions(Nk - Nq, Nk, B, q.device), B, Nq, q.device)
    k_pos = _as_positions(k_pos if k_pos is not None else _default_positions(0, Nk, B, k.device), B, Nk, k.device)
    if parts.multiaxis is not None:  # [B,N] positions: the same coordinate on every axis
        from posenc.parts.multiaxis import as_axis_positions

        n_axes = parts.multiaxis.n_axes
        q_axes = as_axis_positions(q_pos, n_axes, B, Nq, q.device) if q_axes is None else q_axes
        k_axes = as_axis_positions(k_pos, n_axes, B, Nk, k.device) if k_axes is None else k_axes
    q_gate, k_gate = _check_gates(parts, gates, (B, H, Nq), (B, H, Nk))
    sink_logits = _check_sink_logits(sink_logits, H, q.device)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                 for t in (q, k, v, q_gate, k_gate, sink_logits))
    return AttentionCall(parts, q, k, v, q_pos, k_pos, key_mask, needs_grad, q_axes=q_axes, k_axes=k_axes,
                         q_gate=q_gate, k_gate=k_gate, sink_logits=sink_logits)


_DEFAULT_POSITIONS: dict = {}  # (lo, hi, B, device) -> [B, hi-lo] positions lo..hi-1, at most 16 kept


def _default_positions(lo: int, hi: int, B: int, device) -> torch.Tensor:
    """``lo .. hi-1`` in every row ``[B, hi-lo]``, the same tensor for the same arguments while kept, so calls of
    the functional API without positions share what the engine remembers about positions
    (:func:`posenc.engine.call.memo_positions`: block masks, position facts) as a model's layers do."""
    if torch.is_inference_mode_enabled():  # an inference tensor must not outlive its mode (autograd refuses it)
        return torch.arange(lo, hi, device=device)[None].expand(B, -1)
    key = (lo, hi, B, str(device))
    hit = _DEFAULT_POSITIONS.get(key)
    if hit is None:
        if len(_DEFAULT_POSITIONS) >= 16:
            _DEFAULT_POSITIONS.pop(next(iter(_DEFAULT_POSITIONS)))
        hit = _DEFAULT_POSITIONS[key] = torch.arange(lo, hi, device=device)[None].expand(B, -1)
    return hit


def _as_positions(pos, B: int, N: int, device) -> torch.Tensor:
    """:func:`posenc._util.as_positions`, with its check (no negative position) remembered for a ``[B or 1, N]``
    long tensor already on ``device`` (:func:`posenc.engine.call.memo_positions`): the layers of a forward
    pass the same position tensors."""
    if not (isinstance(pos, torch.Tensor) and pos.dtype == torch.long and pos.dim() == 2 and pos.shape[1] == N
            and pos.shape[0] in (1, B) and pos.device == torch.device(device) and pos.numel()):
        return as_positions(pos, B, N, device)
    low = memo_positions("min", (pos,), lambda: int(pos.min()))
    if low < 0:
        raise ValueError(f"positions must be >= 0, got min {low}")
    return pos.expand(B, -1) if pos.shape[0] != B else pos


def _check_sink_logits(sink_logits, H: int, device) -> torch.Tensor | None:
    """``sink_logits`` as a ``[H]`` float tensor on ``device`` (None stays None); ``TypeError`` /
    ``ValueError`` otherwise."""
    if sink_logits is None:
        return None
    if not isinstance(sink_logits, torch.Tensor) or not sink_logits.is_floating_point():
        raise TypeError(f"sink_logits must be a floating-point tensor of one logit per head, got "
                        f"{getattr(sink_logits, 'dtype', type(sink_logits).__name__)}")
    if tuple(sink_logits.shape) != (H,):
        raise ValueError(f"sink_logits must have shape [heads] = ({H},), got {tuple(sink_logits.shape)}")
    bad = torch.isnan(sink_logits) | torch.isposinf(sink_logits)  # NaN/+inf would make every row NaN
    if bool(bad.any()):
        heads = bad.nonzero().flatten().tolist()
        raise ValueError(f"sink_logits must be finite, or -inf for a sink that takes no weight; got "
                         f"{[float(sink_logits[h]) for h in heads[:4]]} at head(s) {heads[:4]}")
    return sink_logits.to(device)


def _check_gates(parts: AttentionParts, gates, q_shape, k_shape):
    """``(q_gate, k_gate)`` as float32, or ``(None, None)``; ``ValueError`` when the scheme's forget gate and
    ``gates`` disagree (one without the other, or wrong shapes)."""
    has_gate = parts.scheme.gate is not None
    if gates is None:
        if has_gate:
            raise ValueError(f"scheme {parts.scheme.name!r} has a forget gate ({parts.scheme.gate.kind}), which reads "
                             f"the layer input: use posenc.PositionalAttention (or pass gates=(q_gate, k_gate))")
        return None, None
    if not has_gate:
        raise ValueError(f"gates were given but scheme {parts.scheme.name!r} has no forget gate")
    q_gate, k_gate = gates
    if tuple(q_gate.shape) != q_shape or tuple(k_gate.shape) != k_shape:
        raise ValueError(f"gates must be [B,H,Nq] = {q_shape} and [B,H,Nk] = {k_shape}, got "
                         f"{tuple(q_gate.shape)} and {tuple(k_gate.shape)}")
    return q_gate.float(), k_gate.float()


def _axes(parts: AttentionParts, pos, B: int, N: int, device):
    """``(axes [B or 1,N,A], None)`` for ``[B,N,A]`` positions of a multi-axis scheme (token order then
    gives the mask positions: the default ones), else ``(None, pos)``."""
    from posenc.parts.multiaxis import as_axis_positions, is_axis_positions

    if pos is None:
        return None, pos
    if parts.multiaxis is None:
        if torch.as_tensor(pos).dim() == 3:
            raise ValueError(f"positions of shape {tuple(torch.as_tensor(pos).shape)} (multi-axis) need a scheme with "
                             f"a multiaxis part; this scheme takes [seq] or [batch, seq]")
        return None, pos
    if not is_axis_positions(pos, parts.multiaxis.n_axes, B, N):
        return None, pos

    return as_axis_positions(pos, parts.multiaxis.n_axes, B, N, device), None


def run_backend(backend: Backend, call: AttentionCall, scale: float | None = None) -> torch.Tensor:
    """Run ``backend`` with the call's frequencies and query scale, per dynamic-schedule group (no choice,
    no fallback: the caller has checked ``backend.why_not(call)``)."""
    if call.n_rep > 1 and not backend.gqa(call):
        call = call.expanded()  # [B,Hk,Nk,D] -> [B,H,Nk,D] for a path that reads keys per query head
    parts, q_pos = call.parts, call.q_pos
    ells = parts.schedule_lengths(q_pos, call.k_pos)
    if ells is None:
        return backend.run(scheduled(call, None, scale))

    # dynamic schedule: queries grouped by the length their schedule sees (one group per step of the schedule).
    # Under a causal mask with keys at their indices, a group of queries up to position p reads keys 0..p only:
    # the group's call is cut there, so it rotates and scores those keys and not the whole prefill's (which made a
    # stepped prefill cost a rectangle of scores, twice the causal triangle, and rotate every key per group)
    out = None
    causal_run = call.q_run if parts.mask.causal else None
    for ell in torch.unique(ells).tolist():
        group = scheduled(call, int(ell), scale)
        sel = ells == ell  # [B,Nq]
        if bool((sel == sel[:1]).all()):  # same queries in every row: compute only those
            idx = sel[0].nonzero().flatten()
            group = group.select_queries(idx)
            if causal_run is not None:
                end = causal_run + int(idx[-1]) + 1  # the last key the group's last query can see, plus one
                if end < call.Nk:
                    group = group.key_prefix(end)
            o = backend.run(group)
            if out is None:
                out = torch.zeros(call.B, call.H, call.Nq, call.v.shape[-1], dtype=o.dtype, device=o.device)
            out.index_copy_(2, idx, o)  # in place: no copy of the whole output per group
        else:
            o = backend.run(group)
            out = o if out is None else torch.where(sel[:, None, :, None], o, out)
    return out


def scheduled(call: AttentionCall, length: int | None, scale: float | None = None) -> AttentionCall:
    """The call with the frequencies its schedule has at ``length`` (None: a static schedule's) and the query scale
    they give filled in."""
    parts = call.parts
    freqs = parts.frequencies(length) if parts.rope is not None else None
    attn_scale = freqs.attention_scale if freqs is not None else 1.0
    return call.scheduled(freqs, query_scale(parts, call.q_pos, attn_scale, call.q.dtype, scale, call.k_pos))


def attention_weights(call: AttentionCall, scale: float | None = None, queries=None) -> torch.Tensor:
    """The weights ``[B,H,nq,Nk]`` the call's queries at indices ``queries`` (the same in every row; default: every
    query) give each of its keys, as ``reference`` computes them (every branch, bias, mask, content choice and
    learned sink), each query under the schedule its own length sees; float32 (float64 for float64 inputs). For
    diagnostics (:mod:`posenc.analysis.attention`): it materialises ``nq x Nk`` scores per head."""
    from posenc.engine.scores import content_mask, scores_tile, weights

    call = replace(call, key_store=None).expanded()
    idx = torch.arange(call.Nq, device=call.q.device)
    if queries is not None:
        idx = idx[torch.as_tensor(queries, dtype=torch.long, device=call.q.device).flatten()]
    ells = call.parts.schedule_lengths(call.q_pos, call.k_pos)
    ells = None if ells is None else ells.index_select(1, idx)
    out = None
    for ell in [None] if ells is None else torch.unique(ells).tolist():
        sub = scheduled(call, None if ell is None else int(ell), scale).select_queries(idx)
        allowed = sub.parts.allowed(sub.q_pos[:, None, :, None], sub.k_pos[:, None, None, :])
        if sub.key_mask is not None:
            allowed = allowed & sub.key_mask[:, None, None, :]
        chosen = content_mask(sub, sub.q, sub.q_pos)
        if chosen is not None:
            allowed = allowed & chosen
        w = weights(sub.parts, scores_tile(sub), allowed, sub.q, sub.k, sub.q_pos, sub.k_pos, sub.q_scale,
                    sub.sink_logits)
        out = w if out is None else torch.where((ells == ell)[:, None, :, None], w, out)
    return out


def check_inputs(q, k, v, impl, scale, key_mask) -> float | None:
    """Refuse what the engine cannot compute, with the argument and the allowed values in the message;
    return ``scale`` as a float (or None)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [batch, heads, tokens, head_dim], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{name} must have q's dtype and device ({q.dtype}, {q.device}), got {t.dtype}, {t.device}")
        if min(t.shape) == 0:
            raise ValueError(f"{name} must have batch, heads, tokens and head_dim >= 1, got shape {tuple(t.shape)}")
    B, H, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"k and v must have q's batch size {B}, got k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or H % k.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, dividing q's {H} heads (GQA); "
                         f"got k {k.shape[1]}, v {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same number of tokens, got k {k.shape[2]}, v {v.shape[2]}")
    if k.shape[3] != D:
        raise ValueError(f"k must have q's head_dim {D}, got {k.shape[3]}")
    if key_mask is not None:
        if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be a bool tensor (True = real token), got "
                            f"{getattr(key_mask, 'dtype', type(key_mask).__name__)}")
        if tuple(key_mask.shape) != (B, k.shape[2]):
            raise ValueError(f"key_mask must have shape [batch, keys] = {(B, k.shape[2])}, got {tuple(key_mask.shape)}")
    return None if scale is None else check_finite("scale", scale, minimum=0.0, strict_min=True)
