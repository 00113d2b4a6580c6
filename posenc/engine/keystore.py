"""Rotated keys kept from one attention call of a layer to the next: :class:`KeyStore`.

posenc's caches hold keys *un-rotated* (``posenc.models.cache``; on Hugging Face models, transformers' own cache after
posenc's identity rotation), because a method may rotate one key differently for different queries. But for every
method the engine runs, the rotation of a cached key depends on the key alone: each branch rotates key ``n`` at
``k_rot(n)`` with the schedule's frequencies (SelfExtend's near branch at ``n`` and far branch at ``floor(n / g)``,
ReRoPE's far branch not at all, DCA's branches at ``n mod c``, StreamingLLM's window at ``n``); only the query side
moves with the query. So a decode step need not rotate the whole cache again: a store keeps, per distinct key
rotation (the branch's ``k_rot`` and the frequencies), the keys rotated so far, and a call rotates only the rows it
has not seen (one new key per decode step).

What is kept: for each key rotation a buffer of rows ``[base, n)`` of the call's keys, rotated. A rotation that is
the identity on the rows asked for (ReRoPE's far keys, all at position 0) keeps nothing: the keys are read as they
are. When the frequencies change (a dynamic schedule at its step boundary) the rows are rotated again, all of them:
every key's angle ``n * theta`` changes with ``theta``. A piece that reads only recent keys (a near branch, a window)
asks for rows ``[lo, hi)`` with ``lo`` rising from step to step; when its buffer grows, or when more of its rows
lie below ``lo`` than above (after a prefill, which read them all), rows below ``lo`` are dropped, so such a rotation
holds about a window of rows, not the whole context.

Memory, the trade (measured per method in ``benchmarks/bench_real_model.py``): one copy of the keys (not the
values) per distinct key rotation that reads the whole context (SelfExtend's far branch, DCA, YaRN on the engine),
about a window for one that reads recent keys (SelfExtend's near branch, the windows), none for an identity rotation
(ReRoPE's far branch). ``posenc.hf.extend(..., rotated_keys=False)`` keeps none: the lean form, which rotates every
key it reads at every step as before.

Validity is the owner's to state: before each call, :meth:`KeyStore.begin` says how many leading keys of this call
are the very keys (same values, same positions) the store saw last time; the rest is forgotten. The owner on Hugging
Face models is :mod:`posenc.hf.keys` (it proves it from transformers' ``DynamicLayer``, which appends by
concatenation). A store is used only at inference (no autograd) and for 1-D positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

MIN_SLACK = 64  # rows of room a grown buffer gets beyond what it holds (then 1/8 of its rows): amortised O(1)


@dataclass
class _Rows:
    """Rows ``[base, n)`` of the keys rotated with ``values``; ``buf`` holds row ``i`` at ``buf[:, :, i - base]``
    (None: the rotation was the identity on every row, read from the keys themselves)."""

    values: tuple
    base: int
    n: int
    buf: torch.Tensor | None
    low: int = 1 << 62  # the lowest row asked for in this call
    low_before: int = 0  # ... and in the call before (rows below both may be dropped when the buffer grows)

    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.numel() * self.buf.element_size()


class KeyStore:
    """A layer's rotated keys, kept across its attention calls (module docstring). ``rows(...)`` is called by
    :func:`posenc.engine.rotation.rotate_keys`; ``begin`` by the cache's owner before each call."""

    def __init__(self):
        self._entries: dict = {}  # key rotation -> _Rows
        self._k_pos: torch.Tensor | None = None  # the positions of the last call's keys (None: at their indices)
        self._indices = False  # the last call's keys sat at 0..Nk-1
        self._rows = self._batch = 0  # its key count and batch size
        self._calls = 0  # calls begun
        self._last: dict = {}  # key rotation -> (frequencies, call) of the last time it was rotated afresh
        self.rotated_rows = 0  # rows rotated through this store (counts the work it did; tests read it)
        self.served_rows = 0  # rows it returned

    def begin(self, carried: int, k_pos: torch.Tensor) -> None:
        """Start a call whose first ``carried`` keys are the very keys of the previous call's first ``carried``
        (the owner's word), at positions ``k_pos [B, Nk]``; rows the positions do not confirm are forgotten too."""
        if isinstance(carried, bool) or not isinstance(carried, int) or carried < 0:
            raise ValueError(f"carried must be a number of keys >= 0, got {carried!r}")
        self._calls += 1
        from posenc.engine.call import keys_at_indices

        prev, indices = self._k_pos, keys_at_indices(k_pos)  # (remembered for the forward's shared positions)
        if carried and (self._rows < carried or self._batch != k_pos.shape[0] or not (
                (indices and self._indices) or (prev is not None and torch.equal(prev[:, :carried],
                                                                                  k_pos[:, :carried])))):
            carried = 0
        for key, e in list(self._entries.items()):
            if e.base >= carried or carried == 0:
                del self._entries[key]
            else:
                e.n = min(e.n, carried)
                e.low_before, e.low = min(e.low, 1 << 62), 1 << 62
        # keys at 0..Nk-1 need no copy to compare; other positions are copied (an owner's position buffer may
        # change in place before the next call)
        self._k_pos, self._indices = (None if indices else k_pos.clone()), indices
        self._rows, self._batch = k_pos.shape[1], k_pos.shape[0]

    def clear(self) -> None:
        self._entries.clear()
        self._k_pos, self._indices, self._rows, self._batch = None, False, 0, 0
        self._last.clear()

    def nbytes(self) -> int:
        """Bytes the rotated rows hold now (buffers, room included)."""
        return sum(e.nbytes() for e in self._entries.values())

    def rows(self, key, values: tuple, k: torch.Tensor, lo: int, hi: int,
             rotate: Callable[[int, int], tuple[torch.Tensor, bool]]) -> torch.Tensor:
        """Keys ``[lo, hi)`` rotated by the rotation ``key`` with frequencies ``values``: ``[B,Hk,hi-lo,D]``.
        ``rotate(a, b)`` rotates rows ``[a, b)`` of ``k`` and says whether it did (False: the identity, the
        rows returned as they are); only the rows not kept are rotated."""
        e = self._entries.get(key)
        if e is not None and (e.values != values or (e.buf is not None and (e.buf.shape[0], e.buf.shape[1],
                                                                           e.buf.shape[3])
                                                     != (k.shape[0], k.shape[1], k.shape[3]))):
            del self._entries[key]  # other frequencies or another layout: start again from lo (old rows freed first)
            e = None
        if e is None:
            # frequencies that changed in this call or the one before and change again (the exact per-token dynamic
            # schedule, or the groups of one stepped prefill) are not kept: they would never be read again
            last = self._last.get(key)
            churn = last is not None and last[0] != values and last[1] >= self._calls - 1
            self._last[key] = (values, self._calls)
            out, did = rotate(lo, hi)
            self.rotated_rows += hi - lo
            if not churn:
                self._entries[key] = _Rows(values, lo, hi, out if did else None, low=lo, low_before=lo)
            self.served_rows += hi - lo
            return out
        e.low = min(e.low, lo)
        if lo < e.base:  # rows below the kept ones (a second piece reading from further back): rotate, prepend
            self._prepend(e, k, lo, rotate)
        if hi > e.n:  # rows after them (a gap up to lo included: the rows stay contiguous)
            new, did = rotate(e.n, hi)
            self.rotated_rows += hi - e.n
            if e.buf is None and not did:
                e.n = hi
            else:
                self._append(e, k, new, did, lo, hi)
        self.served_rows += hi - lo
        if e.buf is None:
            return k[:, :, lo:hi]
        return e.buf[:, :, lo - e.base:hi - e.base]

    def _prepend(self, e: _Rows, k: torch.Tensor, lo: int, rotate) -> None:
        """Rows ``[lo, e.base)`` rotated and placed before the kept ones."""
        new, did = rotate(lo, e.base)
        self.rotated_rows += e.base - lo
        if e.buf is None and not did:
            e.base = lo
            return
        held = e.n - lo
        buf = k.new_empty(k.shape[0], k.shape[1], held + max(MIN_SLACK, held // 8), k.shape[3])
        buf[:, :, :e.base - lo] = new if did else k[:, :, lo:e.base]
        buf[:, :, e.base - lo:held] = k[:, :, e.base:e.n] if e.buf is None else e.buf[:, :, :e.n - e.base]
        e.buf, e.base = buf, lo

    @staticmethod
    def _append(e: _Rows, k: torch.Tensor, new: torch.Tensor, did: bool, lo: int, hi: int) -> None:
        """Write rows ``[e.n, hi)`` (``new``) after the kept ones, moving them to a new buffer when it is full or when
        more of its rows lie below every row asked for in this call and the one before than above: those are
        dropped (the rising reads of a near branch or a window no longer ask for them: after a prefill, whose
        calls read every key, the second decode step keeps about a window, not the whole context; two pieces
        sharing one rotation, STRING's near and far, keep theirs)."""
        if e.buf is None:  # identity rows so far, a rotated one now: keep the rows from lo as they are
            base = min(lo, e.n)
            e.buf, e.base = k[:, :, base:e.n].clone(), base
        floor = min(e.n, max(e.base, min(e.low, e.low_before)))  # rows below it: read by neither call
        if hi - e.base > e.buf.shape[2] or floor - e.base > max(MIN_SLACK, hi - floor):
            base = floor
            held = hi - base
            buf = e.buf.new_empty(e.buf.shape[0], e.buf.shape[1], held + max(MIN_SLACK, held // 8), e.buf.shape[3])
            buf[:, :, :e.n - base] = e.buf[:, :, base - e.base:e.n - e.base]
            e.buf, e.base = buf, base
        e.buf[:, :, e.n - e.base:hi - e.base] = new if did else k[:, :, e.n:hi]
        e.n = hi
