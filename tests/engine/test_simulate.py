"""posenc.engine.simulate: CUDA's engine paths, run on the CPU.

- **The pieces backends as they run on CUDA** (band, chunks, sinks, retrieved, toeplitz for a few queries): every
  fused call routed through the device layout, against the fp32 reference, on the fuzz's drawn cases.
- **Compiled flex with log-sum-exp** (CUDA's path for multi-branch remaps, prefill): compiled CPU flex in torch
  2.13 returns no log-sum-exp, so here flex is the eager ``flex_attention`` (same block masks, same
  ``score_mod``, same per-branch calls and merge; on CUDA the compiled kernel computes the same function)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from posenc.engine.backends import BY_NAME
from posenc.engine.dispatch import run_backend
from posenc.engine.simulate import device_pieces, flex_with_lse
from tests.engine.test_dispatch_fuzz import _pinned, cases
from tests.support.fuzz import examples


def _check(case, outputs: dict) -> None:
    """``case.check`` outside a hypothesis test: every output within the dtype's tolerance of the fp32 reference."""
    from posenc._util import relative_error
    from tests.engine.test_dispatch_fuzz import TOL

    ref = case.reference32()
    for impl, out in outputs.items():
        assert out.shape == ref.shape and torch.isfinite(out).all(), impl
        err = relative_error(out, ref)
        assert err <= TOL[case.dtype], f"{impl}: relative error {err:.3e} ({case.drawn!r})"


# ====================================================================== the pieces backends as on CUDA
@settings(max_examples=examples(ci=25, fuzz=1500), deadline=None)
@given(case=cases())
def test_pieces_through_the_device_layout_equal_reference(case):
    """band, chunks, sinks, retrieved and toeplitz (directly where they apply, and through ``auto``) with every
    fused call on the device layout."""
    with device_pieces():
        outputs = {impl: case.run(impl) for impl in ("toeplitz", "band", "sinks", "auto")}
        with torch.no_grad():
            call = case.call()
            for name in ("band", "chunks", "sinks", "retrieved", "toeplitz"):
                if case.applies(name, call):
                    outputs[f"{name} (direct)"] = run_backend(BY_NAME[name], call)
    case.check(outputs)


@pytest.mark.parametrize("method,params", [("rerope", {"window": 8}), ("selfextend", {"window": 8, "group": 4}),
                                           ("dca", {"chunk": 12, "local": 1}), ("streaming_llm", {"window": 20})])
@pytest.mark.parametrize("Nq", [1, 3])
def test_decode_steps_on_the_device_layout(method, params, Nq):
    """A decode step after a 90-token cache with GQA (the calls CUDA sends to the pieces backends)."""
    case = _pinned("rope", Nq, 90, [0, 0], H=6, Hk=2, train_len=16, method=(method, params))
    with device_pieces():
        outputs = {"auto": case.run("auto")}
        with torch.no_grad():
            call = case.call()
            ran = [n for n in ("band", "chunks", "sinks") if case.applies(n, call)]
            outputs.update({n: run_backend(BY_NAME[n], call) for n in ran})
    assert ran, "no pieces backend took the decode step"
    _check(case, outputs)


# ====================================================================== flex with log-sum-exp
MULTI = [("rerope", {"window": 24}), ("leaky_rerope", {"window": 24, "factor": 2.0}),
         ("selfextend", {"window": 24, "group": 4}), ("dca", {"chunk": 40, "local": 4}),
         ("string", {"shift": 30, "local": 8}), ("streaming_llm", {"window": 40, "n_sinks": 4}),
         ("lm_infinite", {"window": 40, "n_global": 4, "ceiling": 30}), ("sliding_window", {"window": 50})]


@pytest.mark.parametrize("method,params", MULTI, ids=[m for m, _ in MULTI])
@pytest.mark.parametrize("Nq,Nk,pads,dtype", [(200, 200, [0, 0], torch.float32), (70, 150, [0, 9], torch.float32),
                                              (200, 200, [0, 0], torch.bfloat16)])
def test_flex_merges_branches_by_lse(method, params, Nq, Nk, pads, dtype):
    """Multi-branch remaps on flex, one call per branch (its region minus later branches' regions) merged by
    log-sum-exp, GQA keys read as they are, padding keys and partial blocks: equal to the fp32 reference."""
    case = _pinned("rope", Nq, Nk, pads, dtype, H=6, Hk=2, train_len=32, method=(method, params))
    with flex_with_lse():
        with torch.no_grad():
            assert BY_NAME["flex"].why_not(case.call()) is None
        out = case.run("flex")
    _check(case, {"flex": out})


@settings(max_examples=examples(ci=15, fuzz=400), deadline=None)
@given(case=cases(n_max=160))
def test_flex_with_lse_equals_reference_on_drawn_cases(case):
    """Every drawn scheme flex takes on a device with log-sum-exp (multi-branch remaps included), else its
    fallback route, equals the reference."""
    with flex_with_lse():
        out = case.run("flex")
    case.check({"flex": out})
