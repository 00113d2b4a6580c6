"""The engine's backend registry: every backend is named in IMPLS and selectable, says why it cannot run
a call it cannot compute exactly, ``auto`` walks the documented order, and the remap capability
attributes the backends read agree with the methods each remap overrides."""

import logging

import pytest
import torch

from posenc import PositionScheme, attention
from posenc.engine import AUTO_ORDER, BACKENDS, FALLBACKS, IMPLS, choose_backend, make_call
from posenc.engine.backends import BY_NAME
from posenc.engine.parts import parts_for
from posenc.parts.remap import REMAPS, Remap


def _call(scheme, N=80, Nq=None, B=1, H=2, D=8, grad=False, key_mask=None):
    g = torch.Generator().manual_seed(0)
    Nq = N if Nq is None else Nq
    q = torch.randn(B, H, Nq, D, generator=g).requires_grad_(grad)
    k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(2))
    return make_call(parts_for(scheme.to_json(), H, D), q, k, v, key_mask=key_mask)


def _preset(name, **params):
    return PositionScheme.preset(name, train_len=64, **params)


def test_every_backend_is_in_impls_and_selectable_by_name():
    assert IMPLS == ("auto",) + tuple(b.name for b in BACKENDS)
    assert len({b.name for b in BACKENDS}) == len(BACKENDS) and set(FALLBACKS) == set(BY_NAME)
    q, k, v = (torch.randn(1, 2, 70, 8) for _ in range(3))
    ref = attention(q, k, v, _preset("rope"), impl="reference")
    for name in IMPLS:
        if name != "flex":  # (compiled: tested in test_attention)
            torch.testing.assert_close(attention(q, k, v, _preset("rope"), impl=name), ref, rtol=1e-5, atol=1e-6)


# (backend, a scheme/call it runs, one it cannot run exactly)
CASES = {
    "reference": (dict(scheme=_preset("rope")), None),
    "blockwise": (dict(scheme=_preset("rope")), None),
    "sdpa": (dict(scheme=_preset("alibi")), dict(scheme=_preset("rerope", window=16))),
    "flex": (dict(scheme=_preset("alibi")), dict(scheme=_preset("rope"), grad=True)),
    "band": (dict(scheme=_preset("rerope", window=16)), dict(scheme=_preset("rope"))),
    "toeplitz": (dict(scheme=_preset("alibi")),
                 dict(scheme=_preset("alibi"), key_mask=torch.ones(1, 80, dtype=torch.bool))),
    "sinks": (dict(scheme=_preset("streaming_llm", window=20, n_sinks=2)), dict(scheme=_preset("rope"))),
    "chunks": (dict(scheme=_preset("dca", chunk=24, local=4)), dict(scheme=_preset("rerope", window=16))),
    "retrieved": (dict(scheme=_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2)),
                  dict(scheme=_preset("rerope", window=16))),
}


@pytest.mark.parametrize("name", [b.name for b in BACKENDS])
def test_why_not_says_why(name):
    can, cannot = CASES[name]
    assert BY_NAME[name].why_not(_call(**can)) is None
    if cannot is None:  # reference and blockwise run every call
        return
    why = BY_NAME[name].why_not(_call(**cannot))
    assert isinstance(why, str) and why, (name, why)


def test_auto_order_is_the_documented_one():
    assert [(r.backend, r.prefer is None) for r in AUTO_ORDER] == [
        ("toeplitz", False), ("sinks", False), ("sdpa", False), ("flex", False), ("band", False),
        ("sinks", False), ("chunks", False), ("retrieved", False), ("blockwise", False), ("band", False),
        ("chunks", False), ("retrieved", False), ("reference", True)]
    assert [r.backend for r in FALLBACKS["flex"]] == ["band", "sinks", "chunks", "retrieved", "blockwise"]
    assert [r.backend for r in FALLBACKS["sdpa"]] == ["blockwise"]
    assert FALLBACKS["toeplitz"] == AUTO_ORDER[2:]


@pytest.mark.parametrize("scheme,kw,impl,expected", [
    (_preset("rope"), {}, "auto", "sdpa"),
    (_preset("alibi"), {}, "auto", "toeplitz"),
    (_preset("alibi"), dict(N=40), "auto", "sdpa"),  # below TOEPLITZ_MIN_QUERIES
    (_preset("streaming_llm", window=20, n_sinks=2), dict(N=300), "auto", "sinks"),
    (_preset("rerope", window=16), {}, "auto", "reference"),  # small: materialised
    (_preset("rerope", window=16), dict(N=300), "auto", "band"),  # Nq * Nk > 256^2: flex's stand-in
    (_preset("rerope", window=16), dict(N=300, grad=True), "auto", "reference"),
    (_preset("rerope", window=16), {}, "flex", "band"),
    (_preset("rerope", window=16), dict(grad=True), "flex", "blockwise"),
    (_preset("rerope", window=16), {}, "sdpa", "blockwise"),
    (_preset("rope"), {}, "toeplitz", "sdpa"),
    (_preset("rope"), {}, "band", "blockwise"),
    (_preset("dca", chunk=24, local=4), dict(N=300), "auto", "chunks"),
    (_preset("dca", chunk=24, local=4), {}, "flex", "chunks"),
    (_preset("dca", chunk=24, local=4), dict(grad=True), "chunks", "blockwise"),
    (_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2), dict(N=300), "auto", "retrieved"),
    (_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2), dict(N=300, Nq=1), "auto", "retrieved"),
    (_preset("retrieval", window=16, n_sinks=2, block=4, top_k=2), dict(grad=True), "retrieved", "blockwise"),
    (_preset("duo", streaming=[1]), dict(N=300), "auto", "blockwise"),
])
def test_choice(scheme, kw, impl, expected):
    backend, declined = choose_backend(_call(scheme, **kw), impl)
    assert backend.name == expected, declined
    assert all(isinstance(why, str) and why for _, why in declined)


def test_debug_log_names_the_backend_and_the_reasons(caplog):
    q, k, v = (torch.randn(1, 2, 80, 8) for _ in range(3))
    with caplog.at_level(logging.DEBUG, logger="posenc"):
        attention(q, k, v, _preset("alibi").extend("pcw", window=20, n_windows=2))
    msg = [r.getMessage() for r in caplog.records if "ran" in r.getMessage()]
    assert msg and "ran sdpa" in msg[-1] and "toeplitz: the remap adds a mask" in msg[-1], msg


@pytest.mark.parametrize("cls", sorted(set(REMAPS.values()), key=lambda c: c.__name__))
def test_remap_capabilities_agree_with_the_methods(cls):
    """``restricts_keys`` / ``remaps_distance`` are declared, not inferred: they must say whether the class
    overrides ``allowed`` / ``relative``."""
    assert cls.restricts_keys == (cls.allowed is not Remap.allowed), cls
    assert cls.remaps_distance == (cls.relative is not Remap.relative), cls
