"""The rotated-key store (``posenc.engine.keystore``): a sequence of calls that carries its rotated keys from one call
to the next gives exactly what rotating every key at every call gives, for any scheme, GQA, padding, prefill chunks
and decode steps; and it rotates only the keys it has not seen."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from posenc import PositionScheme
from posenc.engine import AttentionParts, KeyStore, run_attention
from tests.support.fuzz import Drawn, examples, schemes


def _calls(parts, q, k, v, k_pos, key_mask, cuts, impl, store):
    """Outputs of the calls ending at each of ``cuts`` (keys ``[0, end)``, queries ``[start, end)``), the store (if
    any) told before each call that the keys of the previous call are carried."""
    outs, start = [], 0
    for end in cuts:
        kp = k_pos[:, :end]
        if store is not None:
            store.begin(start, kp)
        with torch.no_grad():
            outs.append(run_attention(parts, q[:, :, start:end], k[:, :, :end], v[:, :, :end], kp[:, start:end], kp,
                                      impl=impl, key_mask=None if key_mask is None else key_mask[:, :end],
                                      key_store=store))
        start = end
    return outs


@st.composite
def sequences(draw):
    D = draw(st.sampled_from([8, 16, 32]))
    Hk = draw(st.integers(1, 3))
    H = Hk * draw(st.integers(1, 3))
    B = draw(st.integers(1, 2))
    N = draw(st.integers(2, 160))
    cuts = [draw(st.integers(1, N))]  # the prefill, then decode steps of 1-3 tokens, or a second chunk
    while cuts[-1] < N:
        cuts.append(min(N, cuts[-1] + draw(st.sampled_from([1, 1, 2, 3, 17]))))
    pads = [draw(st.integers(0, cuts[0] - 1)) if draw(st.booleans()) else 0 for _ in range(B)]
    return draw(schemes(D)), B, H, Hk, D, N, cuts, pads, draw(st.integers(0, 2 ** 16))


def _pinned(method, params, B=1, H=6, Hk=2, D=16, N=120, cuts=(70, 71, 72, 75, 76, 93, 94, 120), pads=(0,)):
    scheme = PositionScheme.preset("rope", train_len=16).extend(method, **params)
    return Drawn(scheme, f"rope.extend({method!r}, **{params!r})"), B, H, Hk, D, N, list(cuts), list(pads), 0


@example(seq=_pinned("selfextend", {"window": 8, "group": 4}))
@example(seq=_pinned("rerope", {"window": 8}, B=2, pads=(0, 13)))
@example(seq=_pinned("dca", {"chunk": 12, "local": 1}))
@example(seq=_pinned("streaming_llm", {"window": 20}))
@example(seq=_pinned("string", {"shift": 30, "local": 8}))
@example(seq=_pinned("dynamic_ntk", {"step": 8}))
@example(seq=_pinned("yarn", {"factor": 4.0}, B=2, Hk=3, pads=(5, 0)))
@settings(max_examples=examples(ci=14, fuzz=800))
@given(seq=sequences())
def test_carried_rotated_keys_give_what_rotating_every_key_gives(seq):
    drawn, B, H, Hk, D, N, cuts, pads, seed = seq
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(B, H, N, D, generator=g), torch.randn(B, Hk, N, D, generator=g), \
        torch.randn(B, Hk, N, D, generator=g)
    valid = torch.arange(N)[None] >= torch.tensor(pads)[:, None]
    k_pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    key_mask = valid if any(pads) else None
    parts = AttentionParts(drawn.scheme, H, D).eval()
    note(f"{drawn!r} B={B} H={H} Hk={Hk} D={D} cuts={cuts} pads={pads}")
    used = 0
    for impl in ("auto", "reference", "sdpa", "toeplitz", "band", "sinks", "blockwise"):  # (each passes on a
        store = KeyStore()                                                                # call it cannot run)
        got = _calls(parts, q, k, v, k_pos, key_mask, cuts, impl, store)
        want = _calls(parts, q, k, v, k_pos, key_mask, cuts, impl, None)
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), (impl, i, cuts[i], (a - b).abs().max().item())
        used += store.served_rows
    if parts.rope is not None and parts.multiaxis is None and H == Hk:
        assert used > 0  # the store took part (with GQA the paths that read keys per query head keep none)


def test_a_decode_step_rotates_only_its_new_key_per_rotation():
    """SelfExtend (a near and a far key rotation): after the prefill, each step rotates one row per rotation, and
    the near rotation keeps about a window of rows, not the whole context."""
    drawn, B, H, Hk, D, N, cuts, pads, _ = _pinned("selfextend", {"window": 8, "group": 4}, N=400,
                                                  cuts=[300] + list(range(301, 401)))
    parts = AttentionParts(drawn.scheme, H, D).eval()
    q, k, v = torch.randn(B, H, N, D), torch.randn(B, Hk, N, D), torch.randn(B, Hk, N, D)
    store = KeyStore()
    k_pos = torch.arange(N)[None]
    _calls(parts, q, k, v, k_pos, None, cuts[:1], "auto", store)
    after_prefill = store.rotated_rows
    assert after_prefill == 2 * 300  # a prefill rotates every key, once per rotation (near: n, far: n // 4)
    store.begin(300, k_pos[:, :300])
    start = 300
    for end in cuts[1:]:
        store.begin(start, k_pos[:, :end])
        with torch.no_grad():
            run_attention(parts, q[:, :, start:end], k[:, :, :end], v[:, :, :end], k_pos[:, start:end],
                          k_pos[:, :end], key_store=store)
        start = end
    # the near rotation: the step's own key; the far one: the key that reached distance 8 (none until 308: the
    # prefill rotated all 300 keys, and the far branch of a query at 300..307 reads keys below 293..300)
    assert store.rotated_rows - after_prefill == 100 + (400 - 8 - 300)
    near = max(store._entries.values(), key=lambda e: e.base)
    assert near.n - near.base < 8 + 64 + 1 and near.buf.shape[2] < 100  # a window's rows (and slack), not 400


def test_keys_not_carried_are_rotated_again():
    """``begin(0)`` (or positions that moved) forgets every row: a call after new keys gives the new keys' answer."""
    drawn, B, H, Hk, D, N, *_ = _pinned("selfextend", {"window": 8, "group": 4}, N=60)
    parts = AttentionParts(drawn.scheme, H, D).eval()
    q, k, v = torch.randn(B, H, N, D), torch.randn(B, Hk, N, D), torch.randn(B, Hk, N, D)
    k2 = torch.randn(B, Hk, N, D)
    pos = torch.arange(N)[None]
    store = KeyStore()

    def call(keys, carried, k_pos=pos):
        store.begin(carried, k_pos)
        with torch.no_grad():
            return run_attention(parts, q[:, :, -1:], keys, v, k_pos[:, -1:], k_pos, key_store=store)

    call(k, 0)
    with torch.no_grad():
        want = run_attention(parts, q[:, :, -1:], k2, v, pos[:, -1:], pos)
    assert torch.equal(call(k2, 0), want)
    shifted = pos + 1  # the same keys claimed carried, but at other positions: not carried
    with torch.no_grad():
        want = run_attention(parts, q[:, :, -1:], k2, v, shifted[:, -1:], shifted)
    assert torch.equal(call(k2, N - 1, shifted), want)


def test_no_store_is_kept_for_an_identity_rotation_or_under_autograd():
    drawn, B, H, Hk, D, N, *_ = _pinned("rerope", {"window": 8}, H=4, Hk=4, N=50)  # (the reference path reads
    # keys per query head: with GQA it repeats them and keeps no store)
    parts = AttentionParts(drawn.scheme, H, D).eval()
    q, k, v = torch.randn(B, H, N, D), torch.randn(B, Hk, N, D), torch.randn(B, Hk, N, D)
    pos = torch.arange(N)[None]
    store = KeyStore()
    store.begin(0, pos)
    with torch.no_grad():
        run_attention(parts, q, k, v, pos, pos, impl="reference", key_store=store)
    assert len(store._entries) == 2 and store.nbytes() == k.numel() * 4  # near keys kept; far ones at 0: none
    train = KeyStore()
    train.begin(0, pos)
    qg = q.clone().requires_grad_()
    run_attention(parts, qg, k, v, pos, pos, impl="reference", key_store=train).sum().backward()
    assert train.nbytes() == 0 and train.rotated_rows == 0


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_begin_takes_a_row_count(bad):
    with pytest.raises((ValueError, TypeError)):
        KeyStore().begin(bad, torch.arange(4)[None])


def _decoded(method, params, N, prefill):
    """A prefill of ``prefill`` keys then one-token decode steps up to ``N`` with a store, checked equal to the same
    calls without one; returns the store."""
    drawn, B, H, Hk, D, N, *_ = _pinned(method, params, N=N)
    parts = AttentionParts(drawn.scheme, H, D).eval()
    q, k, v = torch.randn(B, H, N, D), torch.randn(B, Hk, N, D), torch.randn(B, Hk, N, D)
    pos = torch.arange(N)[None]
    store = KeyStore()
    cuts = [prefill] + list(range(prefill + 1, N + 1))
    got = _calls(parts, q, k, v, pos, None, cuts, "auto", store)
    want = _calls(parts, q, k, v, pos, None, cuts, "auto", None)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    return store


def test_two_pieces_sharing_one_rotation_keep_their_rows():
    """STRING's near piece (recent keys) and far piece (keys from 0) rotate keys the same way and share one
    entry: growing it for the near piece must not drop the far piece's rows (which made every step rotate the
    whole context again)."""
    N = 500
    store = _decoded("string", {"shift": 30, "local": 8}, N, 200)
    assert store.rotated_rows == 200 + (N - 200)  # every key once: the prefill's, then one per step


def test_a_schedule_that_changes_at_every_step_keeps_nothing():
    """The exact per-token dynamic schedule (step 1) past the trained length has new frequencies at every decode
    step: after the second change in a row the store stops keeping them (they would only hold memory); a stepped
    schedule, whose frequencies hold for many steps, keeps its rows."""
    for step, kept in ((1, False), (64, True)):
        store = _decoded("dynamic_ntk", {"step": step}, 120, 100)
        assert (store.nbytes() > 0) == kept, (step, store.nbytes())


@pytest.mark.parametrize("method,params", [("sliding_window", {"window": 16}),
                                           ("selfextend", {"window": 16, "group": 4})])
def test_after_a_prefill_a_window_keeps_a_window_of_rows_by_the_second_step(method, params):
    """A prefill reads (and keeps) every key; from the second decode step a rotation read only over a window holds
    about that window, not the prefill's rows until its buffer next grows (a whole-model 16k prefill of SmolLM2
    otherwise kept 405 MB of rotated keys for StreamingLLM, a full copy of its cache). Answers equal no store."""
    store = _decoded(method, params, 402, 400)
    near = max(store._entries.values(), key=lambda e: e.base)
    assert near.base >= 400 - 16 - 2 and near.buf.shape[2] < 16 + 64 + 4, (near.base, near.buf.shape)
