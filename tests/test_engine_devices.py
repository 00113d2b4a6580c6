"""The engine's device paths, checked on the CPU: what runs on CUDA is built from pieces whose logic runs here.

- **The device kernel's layout** (:func:`posenc.engine.pieces.device_lse`): on CUDA the log-sum-exp pieces go to
  the memory-efficient kernel, which needs equal query and key heads and bias rows aligned to 16 elements. The
  packing of a decode step's GQA query heads, the repeated keys of longer GQA calls and the aligned copy of a
  bias (the Toeplitz kernel's strided views included) are the same code on every device; here they run with
  :func:`~posenc.engine.pieces.math_lse` as the kernel and must equal the CPU flash kernel.
- **The pieces backends as they run on CUDA** (band, chunks, sinks, retrieved, toeplitz for a few queries): every
  fused call routed through that device layout, against the fp32 reference, on the fuzz's drawn cases.
- **Compiled flex with log-sum-exp** (CUDA's path for multi-branch remaps, prefill): compiled CPU flex in torch
  2.13 returns no log-sum-exp, so here flex is the eager ``flex_attention`` (same block masks, same
  ``score_mod``, same per-branch calls and merge; on CUDA the compiled kernel computes the same function).
- **Nothing made off the input's device**: the engine run with every default-device tensor factory pointed at
  ``meta`` (``with torch.device("meta")``): a tensor made without ``device=`` then lands on ``meta`` and mixing it
  with the CPU inputs raises, so every tensor the engine makes follows its inputs (on CUDA: no silent copy from
  the CPU, no CPU tensor mixed into a CUDA kernel).
"""

from __future__ import annotations

import pytest
import torch
from fuzz_support import examples
from hypothesis import given, settings
from test_fuzz_engine import EAGER_IMPLS, _pinned, cases

from posenc import PositionScheme
from posenc.engine import pieces
from posenc.engine.backends import BY_NAME
from posenc.engine.backends import flex as flex_backend
from posenc.engine.dispatch import run_backend
from posenc.engine.simulate import device_pieces, flex_with_lse


def _check(case, outputs: dict) -> None:
    """``case.check`` outside a hypothesis test: every output within the dtype's tolerance of the fp32 reference."""
    from test_fuzz_engine import TOL

    from posenc._util import relative_error

    ref = case.reference32()
    for impl, out in outputs.items():
        assert out.shape == ref.shape and torch.isfinite(out).all(), impl
        err = relative_error(out, ref)
        assert err <= TOL[case.dtype], f"{impl}: relative error {err:.3e} ({case.drawn!r})"


# ====================================================================== the device kernel's layout
@pytest.mark.parametrize("H,Hk", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("Nq,Nk", [(1, 37), (5, 70), (70, 70), (33, 130)])
@pytest.mark.parametrize("mask", ["none", "shared", "per_head", "toeplitz_view"])
def test_device_layout_equals_the_cpu_kernel(H, Hk, Nq, Nk, mask):
    """Packed decode steps, repeated keys, and aligned copies of every bias shape the backends pass (None, one
    mask for all heads, one per head, a strided Hankel view with stride 0 over the batch) give the CPU flash
    kernel's output and log-sum-exp."""
    g = torch.Generator().manual_seed(Nq * 131 + Nk)
    B, D = 2, 16
    q = torch.randn(B, H, Nq, D, generator=g) / 4
    k, v = (torch.randn(B, Hk, Nk, D, generator=g) for _ in range(2))
    bias = None
    if mask == "shared":
        bias = torch.randn(1, 1, Nq, Nk, generator=g)
    elif mask == "per_head":
        bias = torch.randn(B, H, Nq, Nk, generator=g)
    elif mask == "toeplitz_view":
        vec = torch.randn(H, Nq + Nk, generator=g)
        bias = vec.as_strided((B, H, Nq, Nk), (0, Nq + Nk, 1, 1))
    want = pieces._flash(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, bias)
    got = pieces.device_lse(pieces.math_lse, q, k, v, bias)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_device_layout_aligns_the_bias_rows():
    """The kernel receives a bias whose every stride but the last is a multiple of 16 elements (what the
    memory-efficient CUDA kernel requires) for key counts that are not."""
    seen = []

    def kernel(q, k, v, bias):
        seen.append(bias.stride())
        return pieces.math_lse(q, k, v, bias)

    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 37, 8), torch.randn(1, 2, 37, 8)
    pieces.device_lse(kernel, q, k, v, torch.zeros(1, 2, 3, 37))
    assert all(s % 16 == 0 for s in seen[0][:-1]) and seen[0][-1] == 1, seen


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


def test_effective_regions_give_each_pair_to_the_last_branch_holding_it():
    """A pair in two branches' regions belongs to the later one (the reference's rule); a later branch without
    a region takes every pair (the earlier ones are dropped)."""
    from dataclasses import dataclass

    from posenc.parts.branches import Branch

    @dataclass
    class Parts:
        branches: list

    a, b = (lambda q, k: q - k < 5), (lambda q, k: q - k >= 3)
    qp, kp = torch.arange(10)[:, None], torch.arange(10)[None]
    regions = flex_backend.effective_regions(Parts([Branch(region=a), Branch(region=b)]))
    assert [i for i, _ in regions] == [0, 1]
    assert torch.equal(regions[0][1](qp, kp), (qp - kp < 3))
    assert torch.equal(regions[1][1](qp, kp), b(qp, kp))
    assert [i for i, _ in flex_backend.effective_regions(Parts([Branch(region=a), Branch()]))] == [1]


# ====================================================================== nothing off the input's device
STRICT = ["rope", "alibi", ("rope", "yarn", {"factor": 4.0}), ("rope", "dynamic_yarn", {}),
          ("rope", "rerope", {"window": 24}), ("rope", "selfextend", {"window": 24, "group": 4}),
          ("rope", "dca", {"chunk": 40, "local": 4}), ("rope", "string", {"shift": 30, "local": 8}),
          ("rope", "streaming_llm", {"window": 40}), ("rope", "sliding_window", {"window": 50}),
          ("rope", "retrieval", {"window": 32, "block": 8, "top_k": 2})]


@pytest.mark.parametrize("spec", STRICT, ids=lambda s: s if isinstance(s, str) else s[1])
@pytest.mark.parametrize("Nq", [150, 2])
def test_the_engine_makes_nothing_off_the_input_device(spec, Nq):
    """Every backend that runs the call, with tensor factories defaulting to ``meta``: the same output as the
    normal run (a factory call without ``device=`` would make a meta tensor and fail or differ)."""
    name, method = (spec, None) if isinstance(spec, str) else (spec[0], (spec[1], spec[2]))
    case = _pinned(name, Nq, 150, [0, 0], H=6, Hk=2, train_len=32, method=method)
    impls = [i for i in EAGER_IMPLS if i != "reference"]
    with torch.no_grad():
        want = {impl: case.run(impl) for impl in impls}
    for impl in impls:
        with torch.device("meta"):
            got = case.run(impl)
        assert got.device.type == "cpu" and torch.equal(got, want[impl]), impl
    if name != "rope" or method is None or method[0] not in ("selfextend", "dca", "sliding_window"):
        return  # CUDA's flex (eager here: seconds per call) on one two-branch, one three-branch, one window scheme
    with flex_with_lse():  # block masks built on the positions' device, one call per branch
        want = case.run("flex")
        with torch.device("meta"):
            got = case.run("flex")
    assert got.device.type == "cpu" and torch.equal(got, want), "flex"


def test_the_strict_mode_catches_a_factory_without_device():
    """The strict mode of the test above fails on a tensor made without ``device=`` (it can fail)."""
    x = torch.ones(3)
    with torch.device("meta"), pytest.raises((RuntimeError, NotImplementedError)):
        _ = x + torch.arange(3)
        bool((x + torch.arange(3)).all())


def test_a_preset_scheme_runs_under_the_strict_mode():
    """A whole preset scheme's attention (rope + yarn, GQA) end to end under the strict mode."""
    from posenc import attention

    scheme = PositionScheme.preset("rope", train_len=32).extend("yarn", factor=4.0)
    q, k, v = torch.randn(1, 4, 100, 16), torch.randn(1, 2, 100, 16), torch.randn(1, 2, 100, 16)
    want = attention(q, k, v, scheme)
    with torch.device("meta"):
        got = attention(q, k, v, scheme)
    assert torch.equal(got, want)
