"""posenc.engine.exact: a window or remap that binds on no pair of a call is dropped for that call (plain causal
attention), with the same result as the general path on both sides of every limit."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import relative_error
from posenc.engine import choose_backend, make_call
from posenc.engine.exact import exact_call
from posenc.engine.parts import parts_for

L = 32  # train_len; every method's window below is set so its limit is LIMIT
LIMIT = 24
H, HK, D = 4, 2, 16

#: (preset, parameters, the largest distance + 1 / position + 1 at which the method is still the identity)
CASES = [
    ("streaming_llm", {"n_sinks": 4, "window": LIMIT - 4}, "position"),
    ("lm_infinite", {"window": LIMIT - 4, "n_global": 4, "ceiling": LIMIT + 4}, "distance"),  # sinks always seen
    ("sliding_window", {"window": LIMIT}, "distance"),
    ("rerope", {"window": LIMIT}, "distance"),
    ("leaky_rerope", {"window": LIMIT, "factor": 2.0}, "distance"),
    ("selfextend", {"window": LIMIT, "group": 4}, "distance"),
    ("rerope+logn", {"window": LIMIT}, "distance"),
]


def _scheme(name, params):
    return PositionScheme.preset(name, train_len=L, **params)


def _qkv(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, n, D, generator=g), torch.randn(1, HK, n, D, generator=g),
            torch.randn(1, HK, n, D, generator=g))


@pytest.mark.parametrize("name,params,kind", CASES, ids=[c[0] for c in CASES])
def test_inside_the_limit_the_call_is_plain_and_equal_outside_it_general(name, params, kind):
    scheme = _scheme(name, params)
    parts = parts_for(scheme.to_json(), H, D)
    for n in (LIMIT, LIMIT + 1, LIMIT + 8):  # the largest distance and position: n - 1
        q, k, v = _qkv(n)
        call = make_call(parts, q, k, v)
        plain = exact_call(call).parts is parts.plain_view()
        assert plain == (n <= LIMIT), (name, n)
        if plain:
            assert choose_backend(exact_call(call))[0].name in ("sdpa", "reference")
        ref = attention(q, k, v, scheme, impl="reference")  # the general path: no view for a named backend
        assert relative_error(attention(q, k, v, scheme), ref) <= 1e-5, (name, n)
        step = attention(q[:, :, -1:], k, v, scheme)  # a decode step at the last position
        assert relative_error(step, ref[:, :, -1:]) <= 1e-5, (name, n)


def test_a_cache_that_kept_only_late_keys_is_judged_by_its_own_positions():
    """After eviction the keys start late: the distance is max(q) - min(k), so a window call on keys 40..63
    is plain when 63 - 40 < window, whatever the absolute positions (sliding window: no position limit)."""
    scheme = _scheme("sliding_window", {"window": LIMIT})
    parts = parts_for(scheme.to_json(), H, D)
    q, k, v = _qkv(LIMIT)
    pos = torch.arange(40, 40 + LIMIT)[None]
    assert exact_call(make_call(parts, q[:, :, -1:], k, v, pos[:, -1:], pos)).parts is parts.plain_view()
    s = _scheme("streaming_llm", {"n_sinks": 4, "window": LIMIT - 4})  # a sink seen from a capped slot: not plain
    sp = parts_for(s.to_json(), H, D)
    assert exact_call(make_call(sp, q[:, :, -1:], k, v, pos[:, -1:], pos)).parts is sp


def test_remaps_that_are_never_plain_and_the_view_shares_the_tables():
    for name, params in (("dca", {}), ("string", {}), ("yarn", {"factor": 2.0})):
        parts = parts_for(PositionScheme.preset(name, train_len=L, **params).to_json(), H, D)
        q, k, v = _qkv(8)
        call = make_call(parts, q, k, v)
        # yarn has no window and no remap (nothing to drop); DCA and STRING do not state an exact range
        assert exact_call(call) is call, name
    parts = parts_for(_scheme("rerope", {"window": LIMIT}).to_json(), H, D)
    view = parts.plain_view()
    assert view is parts.plain_view() and view.scheme.remap is None and view.mask.is_plain_causal
    assert view._freq_cache is parts._freq_cache and parts.scheme.remap.kind == "rerope"
    assert list(parts.state_dict()) == list(view.state_dict())  # the view is not a submodule
