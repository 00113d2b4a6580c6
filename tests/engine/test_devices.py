"""Nothing the engine makes lands off the input's device: the engine run with every default-device tensor factory
pointed at ``meta`` (``with torch.device("meta")``): a tensor made without ``device=`` then lands on ``meta`` and
mixing it with the CPU inputs raises, so every tensor the engine makes follows its inputs (on CUDA: no silent copy
from the CPU, no CPU tensor mixed into a CUDA kernel). The layers above the engine: tests/repo/test_devices.py."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionScheme
from posenc.engine.simulate import flex_with_lse
from tests.engine.test_dispatch_fuzz import EAGER_IMPLS, _pinned

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
