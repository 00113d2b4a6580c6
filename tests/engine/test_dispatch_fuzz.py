"""Differential fuzzing of the attention engine: every path that claims to apply gives the reference's
answer, with finite outputs, on random schemes, shapes, padding and dtypes (hypothesis; profiles and
scheme strategies in ``tests/support/fuzz.py``; ``make fuzz`` runs the long randomised profile).

Drawn per example: a scheme (any preset, trained or inference-time, ``+`` compositions, parameters
anywhere in their valid ranges, optional soft-cap), batch 1-3, query heads = key/value heads x 1-3
(GQA), head dim 4-32, Nk from 1 to 256 (CI) / 384 (fuzz) and Nq = Nk (a full forward) or the last
Nq <= Nk positions (a prefill continuing a cache / a decode step), left padding per row through
``key_mask`` (sometimes every key but one), fp32 or bf16, and in a quarter of the cases learned attention sinks
(GPT-OSS's ``s_aux``: one logit per head in every softmax denominator; the backends that cannot add them
pass the call on, so every impl still answers).

Paths: ``reference`` (in the example's dtype), ``sdpa``, ``blockwise``, ``toeplitz``, ``band``, ``sinks``,
``auto`` and the non-compiled ``flex`` routes (band merge, sinks + window, blockwise fallback) through
``run_attention``; the band merge and sinks + window backends also directly whenever their own ``why_not``
says they apply (``auto`` reaches them only from 64 queries on); compiled FlexAttention in its own test
(10-30 s of compilation per new graph on CPU: CI runs only its pinned examples).

Tolerances, as ``relative_error`` (max |a - e| / max |e|) against the **fp32 reference on the same
values** (bf16 examples round inputs and learned tables to bf16 first, so the comparison measures only
each path's arithmetic):

- fp32: 1e-5. Every path rotates q and k with the same code; what differs is the summation order of
  q.k and of the value average (a few ulps, 6e-8 each) and where the softmax max is subtracted. The
  logits drawn stay below ~50 in magnitude (unit-variance q/k, 1/sqrt(d) scale, log-n up to ~2,
  soft-caps, biases), so a logit error of a few ulps moves a weight by < 1e-5 relative.
- bf16: 2^-4 = 0.0625. bf16 keeps 8 significant bits (unit roundoff 2^-9 = 2e-3); paths round the
  scores (q.k in bf16, biases added in bf16) and the probabilities before the value product, so a
  logit of magnitude ~8 carries an absolute error up to ~0.03, a 3 % change in its weight, and the
  output (a weighted mean of values of size ~3) moves by a few hundredths of its largest value in the
  worst row. A bug (a wrong branch, a missed mask, a stale position) moves outputs by O(1).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from posenc import PositionScheme
from posenc._util import relative_error
from posenc.engine import AttentionParts, run_attention
from posenc.engine.backends import BY_NAME
from posenc.engine.dispatch import _sinks_reason, make_call, run_backend
from tests.support.fuzz import FUZZ, examples, flex_settings, schemes

TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -4}
N_MAX = 384 if FUZZ else 256  # CI: Nq * Nk <= 256^2, so "auto" never picks the compiled flex path
EAGER_IMPLS = ("reference", "sdpa", "blockwise", "toeplitz", "band", "sinks", "auto")


# ====================================================================== drawn cases
class Case:
    """Tensors, positions and the scheme's runtime parts (fp32 reference parts + the example's dtype)."""

    def __init__(self, drawn, B, H, Hk, D, Nq, Nk, pads, dtype, seed, sinks=False):
        self.drawn, self.dtype = drawn, dtype
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(B, H, Nq, D, generator=g)
        k, v = (torch.randn(B, Hk, Nk, D, generator=g) for _ in range(2))
        self.q, self.k, self.v = (t.to(dtype) for t in (q, k, v))
        # learned sinks: logits around the scale of the scores, so a sink takes a real share of the weight
        self.sink_logits = (torch.randn(H, generator=g) * 2).to(dtype) if sinks else None
        valid = torch.arange(Nk)[None] >= torch.tensor(pads)[:, None]  # [B,Nk] left padding
        k_pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        self.k_pos, self.q_pos = k_pos, k_pos[:, Nk - Nq:]
        self.key_mask = valid if any(pads) else None
        torch.manual_seed(seed)
        parts = AttentionParts(drawn.scheme, H, D)
        if parts.relative is not None:  # some tables start at zero: make every term count
            with torch.no_grad():
                for p in parts.relative.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.2)
        self.parts = parts.to(dtype).eval()
        self.ref_parts = copy.deepcopy(self.parts).float()

    def __repr__(self) -> str:
        B, H, Nq, D = self.q.shape
        pads = (~self.key_mask).sum(1).tolist() if self.key_mask is not None else 0
        return (f"Case({self.drawn!r}, B={B}, H={H}, Hk={self.k.shape[1]}, D={D}, Nq={Nq}, Nk={self.k.shape[2]}, "
                f"pads={pads}, dtype={self.dtype}, sinks={self.sink_logits is not None})")

    def run(self, impl, parts=None):
        with torch.no_grad():
            return run_attention(parts or self.parts, self.q, self.k, self.v, self.q_pos, self.k_pos, impl=impl,
                                 key_mask=self.key_mask, sink_logits=self.sink_logits)

    def reference32(self):
        with torch.no_grad():
            sinks = None if self.sink_logits is None else self.sink_logits.float()
            return run_attention(self.ref_parts, self.q.float(), self.k.float(), self.v.float(), self.q_pos,
                                 self.k_pos, impl="reference", key_mask=self.key_mask, sink_logits=sinks)

    def call(self):
        return make_call(self.parts, self.q, self.k, self.v, self.q_pos, self.k_pos, self.key_mask,
                         sink_logits=self.sink_logits)

    def applies(self, name, call) -> bool:
        """Whether backend ``name`` computes ``call`` itself (learned sinks included)."""
        return (_sinks_reason(BY_NAME[name], call) or BY_NAME[name].why_not(call)) is None

    def direct_paths(self):
        """The band merge, chunk merge, retrieved-keys and sinks + window backends run directly whenever their own
        ``why_not`` says they apply (``auto`` reaches them only from 64 queries on or for a few queries, and
        through ``flex`` only past 256 x 256)."""
        out = {}
        with torch.no_grad():
            call = self.call()
            for name in ("band", "chunks", "sinks", "retrieved"):
                if self.applies(name, call):
                    out[name] = run_backend(BY_NAME[name], call)
        return out

    def check(self, outputs: dict):
        ref = self.reference32()
        assert torch.isfinite(ref).all(), "the fp32 reference itself is not finite"
        tol = TOL[self.dtype]
        for impl, out in outputs.items():
            assert out.shape == ref.shape and out.dtype == self.dtype, (impl, out.shape, out.dtype)
            assert torch.isfinite(out).all(), f"{impl}: non-finite output"
            err = relative_error(out, ref)
            note(f"{impl}: relative error {err:.2e}")
            assert err <= tol, f"{impl}: relative error {err:.3e} > {tol:.1e} ({self.drawn!r})"


@st.composite
def cases(draw, n_max=N_MAX, lengths=None):
    D = draw(st.sampled_from([4, 8, 16, 32]))
    Hk = draw(st.integers(1, 3))
    H = Hk * draw(st.integers(1, 3))
    B = draw(st.integers(1, 3))
    if lengths is None:
        Nk = draw(st.integers(1, n_max))
        Nq = Nk if draw(st.booleans()) else draw(st.integers(1, Nk))
    else:
        Nq, Nk = draw(st.sampled_from(lengths))
    pads = [0] * B
    if draw(st.booleans()):  # left padding; sometimes every key but one is padding
        pads = [draw(st.sampled_from([0, Nk - 1]) | st.integers(0, Nk - 1)) for _ in range(B)]
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    drawn = draw(schemes(D))
    return Case(drawn, B, H, Hk, D, Nq, Nk, pads, dtype, draw(st.integers(0, 2 ** 16)),
                sinks=draw(st.integers(0, 3)) == 0)


def _pinned(name, Nq, Nk, pads, dtype=torch.float32, H=4, Hk=2, D=16, sinks=False, method=None, **params):
    from tests.support.fuzz import Drawn

    scheme = PositionScheme.preset(name, **params)
    recipe = f"preset({name!r}, **{params!r})"
    if method is not None:
        scheme, recipe = scheme.extend(method[0], **method[1]), recipe + f".extend({method[0]!r}, **{method[1]!r})"
    return Case(Drawn(scheme, recipe), len(pads), H, Hk, D, Nq, Nk, pads, dtype, 0, sinks=sinks)


# ====================================================================== tests
# learned sinks on the backends that cannot add them: they must pass the call on (band merge, sinks + window,
# toeplitz from 64 queries on), padding rows included
@example(case=_pinned("rope", 80, 80, [0, 79], train_len=16, sinks=True, method=("rerope", {"window": 8})))
@example(case=_pinned("rope", 70, 90, [3, 0], train_len=16, sinks=True, method=("streaming_llm", {"window": 20})))
@example(case=_pinned("alibi", 96, 96, [0, 0], torch.bfloat16, train_len=16, sinks=True))
# decode steps (a few queries after a long cache) with GQA, keys never repeated to the query heads: band's
# few-query pieces (key slices), chunks, sinks + window and sdpa's key span under a window
@example(case=_pinned("rope", 1, 90, [0, 0], H=6, Hk=2, train_len=16, method=("rerope", {"window": 8})))
@example(case=_pinned("rope", 3, 90, [0, 0], H=6, Hk=2, train_len=16, method=("rerope", {"window": 8})))
@example(case=_pinned("rope", 1, 90, [0, 0], H=6, Hk=3, train_len=16, method=("selfextend", {"window": 8, "group": 4})))
@example(case=_pinned("rope", 2, 90, [0, 0], H=6, Hk=2, train_len=16, method=("dca", {"chunk": 12, "local": 1})))
@example(case=_pinned("rope", 1, 90, [0, 0], H=6, Hk=2, train_len=16, method=("streaming_llm", {"window": 20})))
@example(case=_pinned("rope", 5, 90, [0, 0], H=6, Hk=2, train_len=16, method=("streaming_llm", {"window": 20})))
@example(case=_pinned("rope", 3, 90, [0, 0], H=6, Hk=3, train_len=16, method=("lm_infinite", {"window": 12})))
@example(case=_pinned("rope", 4, 90, [0, 0], H=6, Hk=1, train_len=16, method=("sliding_window", {"window": 20})))
@example(case=_pinned("rope", 1, 90, [0, 0], H=6, Hk=2, train_len=16, method=("dynamic_ntk", {})))
# InfLLM-style retrieval on the retrieved-keys backend: a long call (far tiles, GQA) and a decode step
@example(case=_pinned("rope", 90, 90, [0, 0], H=6, Hk=2, train_len=16,
                      method=("retrieval", {"window": 8, "n_sinks": 2, "block": 4, "top_k": 2})))
@example(case=_pinned("rope", 1, 90, [0, 0], H=6, Hk=3, train_len=16,
                      method=("retrieval", {"window": 8, "n_sinks": 1, "block": 3, "top_k": 3, "per_head": True})))
@settings(max_examples=examples(ci=12, fuzz=2500))
@given(case=cases())
def test_every_eager_path_equals_reference(case):
    outputs = {impl: case.run(impl) for impl in EAGER_IMPLS}
    with torch.no_grad():  # (learned biases count as fixed only without autograd, as in case.run)
        compiled = case.applies("flex", case.call())
    if not compiled:  # flex here is the band / sinks / blockwise route
        outputs["flex"] = case.run("flex")
    outputs.update(case.direct_paths())
    case.check(outputs)


FLEX_LENGTHS = [(1, 1), (40, 40), (5, 56), (129, 129), (200, 200), (64, 300)]


@pytest.mark.compile
@example(case=_pinned("sliding_window", 40, 40, [0, 0], train_len=16, window=10))  # a piece shorter than a block
@example(case=_pinned("alibi", 5, 56, [0, 3], train_len=16))  # Nq < Nk with padding
@flex_settings(ci_generated=0, fuzz=80)
@given(case=cases(lengths=FLEX_LENGTHS))
def test_compiled_flex_equals_reference(case):
    """Compiled FlexAttention (single-branch schemes; others take the routes tested above) on a few
    length families, so that the fuzz profile reuses compiled graphs."""
    outputs = {"flex": case.run("flex")}
    case.check(outputs)


@settings(max_examples=examples(ci=4, fuzz=30))
@given(segment=st.integers(1, 160), n=st.integers(1, N_MAX), heads=st.sampled_from([(4, 4), (4, 2), (4, 1)]),
       delta=st.booleans(), rope=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_infini_memory_paths_equal_reference(segment, n, heads, delta, rope, seed):
    """Infini-attention (once wrong on compiled flex at 200 tokens): its memory runs the engine once per segment,
    so segment lengths that are not multiples of any block are the norm. Eager paths here; compiled flex
    on such pieces is the pinned N = 40 example above (and the fuzz profile's drawn lengths)."""
    from posenc import PositionalAttention

    torch.manual_seed(seed)
    scheme = PositionScheme.preset("infini", train_len=64, segment_len=segment, rope=rope)
    scheme = replace(scheme, memory=replace(scheme.memory, params={"segment_len": segment, "delta_rule": delta}))
    m = PositionalAttention(32, heads[0], scheme, n_kv_heads=heads[1]).eval()
    with torch.no_grad():
        m.memory.beta.normal_()
        x = torch.randn(2, n, 32)
        ref = m(x, impl="reference")
        assert torch.isfinite(ref).all()
        for impl in ("sdpa", "blockwise", "toeplitz", "auto") + (("flex",) if FUZZ else ()):
            out = m(x, impl=impl)
            assert torch.isfinite(out).all(), impl
            assert relative_error(out, ref) <= TOL[torch.float32], (impl, relative_error(out, ref))


@example(case=_pinned("rope", 1, 90, [0, 0], H=6, Hk=3, train_len=16, method=("selfextend", {"window": 8, "group": 4})),
         pick=0)
@example(case=_pinned("rope", 40, 90, [0, 5], H=4, Hk=2, train_len=16, method=("dynamic_ntk", {"step": 8})), pick=3)
@example(case=_pinned("rope", 30, 30, [0], train_len=8, sinks=True, method=("retrieval", {})), pick=5)
@settings(max_examples=examples(ci=12, fuzz=1000))
@given(case=cases(), pick=st.integers(0, 2 ** 16))
def test_attention_weights_times_the_values_give_the_reference_output(case, pick):
    """``dispatch.attention_weights`` (the diagnostics' weights: posenc.analysis.attention) are the weights the
    reference applies: weighted values (plus a relative scheme's value terms) equal its output, for every query
    or a drawn subset of them, each under its own dynamic schedule; a row sums to 1 (less with learned sinks, 0
    where the query sees no key)."""
    from posenc.engine.dispatch import attention_weights

    if case.dtype != torch.float32:
        case = Case(case.drawn, case.q.shape[0], case.q.shape[1], case.k.shape[1], case.q.shape[3], case.q.shape[2],
                    case.k.shape[2], [0] * case.q.shape[0], torch.float32, pick)
    Nq = case.q.shape[2]
    chosen = sorted({(pick * (i + 1)) % Nq for i in range(1 + pick % 3)}) if pick % 2 else None
    idx = torch.arange(Nq) if chosen is None else torch.tensor(chosen)
    with torch.no_grad():
        call = case.call()
        w = attention_weights(call, queries=chosen)
        expected = case.run("reference").index_select(2, idx)
        v = call.expanded().v
        out = w @ v
        if case.parts.relative is not None:
            extra = case.parts.relative.values(w, call.q_pos.index_select(1, idx), call.k_pos)
            out = out if extra is None else out + extra
    assert w.shape == (case.q.shape[0], case.q.shape[1], len(idx), case.k.shape[2])
    assert relative_error(out, expected) <= TOL[torch.float32], relative_error(out, expected)
    sums = w.sum(-1)
    assert bool(((sums - 1).abs() < 1e-5).logical_or(sums < 1e-6).all()) or case.sink_logits is not None
    assert bool((sums <= 1 + 1e-5).all())
