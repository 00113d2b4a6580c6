"""``retrieved``: the near/far split whose far branch sees only the keys the remap retrieves, against the
reference at every length around the window, and ``auto`` sending content selection to a tiled path when long."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import relative_error
from tests.support.attention import _qkv_typed


@pytest.mark.parametrize("spec, kw, long, decode", [("retrieval", {}, "retrieved", "retrieved"),
                                                     ("duo", dict(streaming=[1]), "blockwise", "reference")])
def test_auto_runs_content_selection_in_linear_memory_when_long(spec, kw, long, decode):
    """Long calls of the remaps that choose keys by content or head go to a tiled path (no N x N scores): InfLLM's
    to the near band + retrieved far keys, DuoAttention's to blockwise; a decode step of DuoAttention may
    materialise its one row."""
    from posenc.engine import choose_backend, make_call
    from posenc.engine.parts import parts_for

    parts = parts_for(PositionScheme.preset(spec, train_len=64, **kw).to_json(), 4, 16)
    q, k, v = (torch.randn(1, 4, 700, 16) for _ in range(3))
    assert choose_backend(make_call(parts, q, k, v), "auto")[0].name == long
    assert choose_backend(make_call(parts, q[:, :, -1:], k, v), "auto")[0].name == decode


@pytest.mark.parametrize("per_head", [False, True])
def test_retrieved_backend_equals_reference_at_every_length_around_the_window(per_head):
    """The retrieved-keys backend against the materialised reference for lengths from below the window to several
    tiles past it (a tile whose far keys are all chosen, a first far query at w, the far tiles' key prefixes), for
    full calls, a decode step and a prefill continuation, GQA keys (9 query heads on 3)."""
    from posenc.engine import choose_backend, make_call
    from posenc.engine.backends.retrieved import Retrieved
    from posenc.engine.parts import parts_for

    s = PositionScheme.preset("retrieval", train_len=64, window=12, n_sinks=2, block=4, top_k=2, per_head=per_head)
    q, k, v = _qkv_typed(300, B=2, H=9, seed=3, dtype=torch.float32)
    k, v = k[:, :3], v[:, :3]
    for n in (5, 12, 13, 14, 40, 299):
        for nq in (n, 1, min(n, 37)):
            args = q[:, :, n - nq:n], k[:, :, :n], v[:, :, :n]
            assert choose_backend(make_call(parts_for(s.to_json(), 9, 16), *args), "retrieved")[0].name == "retrieved"
            ref = attention(*args, s, impl="reference")
            assert relative_error(attention(*args, s, impl="retrieved"), ref) <= 1e-5, (n, nq)
    assert Retrieved.tile < 299 - 12  # the longest call has more than one far tile
