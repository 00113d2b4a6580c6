"""KV cache of *un-rotated* keys and values with their *original* positions.

Why un-rotated: Hugging Face caches keys after RoPE, so a dynamic schedule (dynamic NTK, dynamic
YaRN) rotates old keys with a stale base (transformers issue 25104), attention sinks need keys
rotated at a new slot (HF removed ``SinkCache``), and remaps (ReRoPE, SelfExtend) rotate the same
key differently for near and far queries. posenc stores the projections ``k, v`` exactly as
``PositionalAttention.project`` returns them plus each key's original position; the attention
engine rotates, remaps, biases and masks at read time, so decoding with the cache computes the same
function as one full forward over the same tokens, for every scheme (biases such as ALiBi, T5 and
KERPLE included: they are evaluated on the stored positions at every step).

Layout, per layer ``l``: ``k[l], v[l]`` are ``[B, Hk, capacity, D]``; shared by all
layers: ``positions [B, capacity]`` (long) and ``valid [B, capacity]`` (bool, False for padding and
empty slots). Slots ``0 .. length-1`` are live. The buffers start empty, are sized to the first chunk
and grow by doubling (amortised O(1) per token, never an O(N^2) chain of ``torch.cat``), capped at
what the mask can keep: a huge window costs memory only for the tokens actually cached.

A forget-gate scheme (FoX, :mod:`posenc.parts.gates`) also keeps, per layer, ``gate[l] [B, H, capacity]``:
the cumulative log forget gate ``c_t`` of each cached key (float32), and the running ``c`` of each row's
latest token, so a new chunk continues the sum (:meth:`KVCache.update_gate`) and eviction moves ``c``
with its key (the bias ``c_i - c_j`` needs the gates of the evicted tokens between them, which ``c``
already holds).

Positions must increase: every real (non-padding) token of a row must come after the ones the row
already holds and after the earlier tokens of its chunk; a position that goes backwards or repeats
raises ``ValueError`` (the cache would otherwise hold two keys at one position).

Eviction: after all layers have read a chunk, :meth:`KVCache.advance` asks the scheme's mask which
keys no future query can see (``MaskSpec.never_visible_again``: sliding window, LM-Infinite's
Lambda mask, StreamingLLM's sinks + window, BCA) and compacts the survivors to the front, so a
bounded scheme's cache never holds more than ``mask.bounded_size()`` keys between calls (plus the
tokens of the chunk being processed during a call). Because StreamingLLM's re-indexing is written on
original positions (:class:`posenc.parts.remap.StreamingReindex`), nothing has to be re-rotated on
eviction.

Protocol used by :meth:`posenc.models.tinylm.TinyLM.forward`::

    cache.check_model(model, B)         # refuse another model / batch size
    cache.next_positions()              # [B] next position per row, None while empty
    cache.update(layer, k, v, pos, key_mask, parts) -> (k_all, v_all, k_pos_all, key_mask_all)
    cache.update_gate(layer, log_f) -> c_all   # forget-gate schemes only, after update
    cache.advance(pos)                  # after the last layer: commit the chunk and evict
    cache.key_store(layer, k_pos_all)   # the layer's rotated keys for this call (None: rotate every key)

Rotated keys: each layer of an unbounded cache also has a :class:`~posenc.engine.keystore.KeyStore`
(``rotated_keys=True``, the default), so a decode step rotates only its new key: the slots before a chunk are the
keys of the previous call, unchanged. A bounded cache (window, sinks, BCA) compacts its slots after every chunk once
full, so it would carry nothing, and keeps none.
"""

from __future__ import annotations

import hashlib

import torch

from posenc._util import check_positive_int
from posenc.engine.keystore import KeyStore
from posenc.parts.masks import MaskSpec

_MIN_CAPACITY = 16  # first allocation for token-by-token decoding (then doubling)


def _fingerprint(model) -> str:
    """Hash of the model's config and layer count, memoised on the model for as long as its ``cfg``
    object stays the same (checked on every cached forward, so it must not re-serialise the config)."""
    cfg = getattr(model, "cfg", None)
    memo = getattr(model, "_posenc_cache_fingerprint", None)
    if memo is not None and memo[0] is cfg and memo[1] == len(model.blocks):
        return memo[2]
    text = cfg.to_json() if cfg is not None and hasattr(cfg, "to_json") else repr(cfg)
    fp = hashlib.sha1(f"{text}|layers={len(model.blocks)}".encode()).hexdigest()[:16]
    try:
        model._posenc_cache_fingerprint = (cfg, len(model.blocks), fp)
    except (AttributeError, TypeError):  # a model that refuses new attributes: recompute each time
        pass
    return fp


def cache_mask(model) -> MaskSpec:
    """The mask a cache for ``model`` evicts by: its scheme's, or for a layer pattern the mask all its layers
    share; layers with different masks give the plain causal mask (nothing is evicted, every layer's keys stay)."""
    masks = {s.mask for s in model.cfg.layer_schemes}
    return masks.pop() if len(masks) == 1 else MaskSpec()


class KVCache:
    """Per-layer cache of un-rotated keys/values and original positions (see module docstring).

    Build with :meth:`for_model`. ``max_len`` (optional) is a hard cap on the slots: an unbounded
    scheme that needs more raises ``ValueError``; a bounded scheme (window/sinks/BCA) needs
    ``max_len >= mask.bounded_size()`` and chunks small enough to fit.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, mask, *,
                 max_len: int | None = None, dtype=torch.float32, device=None, fingerprint: str = "",
                 model_id: int | None = None, initial_capacity: int | None = None, gate_heads: int | None = None,
                 rotated_keys: bool = True):
        check_positive_int("n_layers", n_layers)
        check_positive_int("batch_size", batch_size)
        self.n_layers, self.batch_size = n_layers, batch_size
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.mask = mask
        self.bound = mask.bounded_size() if mask is not None else None
        if max_len is not None:
            check_positive_int("max_len", max_len)
            if self.bound is not None and max_len < self.bound:
                raise ValueError(f"max_len ({max_len}) is smaller than the {self.bound} keys this scheme's mask "
                                 f"keeps visible (window + sinks / 2 x block); use max_len >= {self.bound}")
        self.max_len = max_len
        # every buffer goes on one device, named on each factory call (None: torch's default device, as a plain
        # factory call would use, but stated)
        device = torch.get_default_device() if device is None else torch.device(device)
        self.dtype, self.device = dtype, device
        self.fingerprint, self.model_id = fingerprint, model_id
        cap = 0 if initial_capacity is None else check_positive_int("initial_capacity", initial_capacity)
        if max_len is not None:
            cap = min(cap, max_len)
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.gate_heads = None if gate_heads is None else check_positive_int("gate_heads", gate_heads)
        self.gate: list[torch.Tensor] = []  # [B, gate_heads, capacity] cumulative log forget gates per layer
        self._gate_last = [torch.zeros(batch_size, gate_heads, device=device) for _ in range(n_layers)] \
            if gate_heads else []  # c of each row's latest committed token
        self._gate_next: list[torch.Tensor | None] = [None] * n_layers  # the same after the pending chunk
        self.positions = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self._alloc(cap)
        self.length = 0  # live slots (committed)
        self._pending = 0  # tokens of the chunk being processed (written by update, committed by advance)
        self._next: torch.Tensor | None = None  # [B] next position per row
        self.tokens_seen = 0
        self.evicted = 0
        self.peak_length = 0  # most slots ever used during a call (committed + chunk)
        # an evicting (bounded) cache compacts its slots after every chunk once full, so nothing would be carried:
        # it keeps no rotated keys
        self.stores = [KeyStore() for _ in range(n_layers)] if rotated_keys and self.bound is None else None
        self._moved = [False] * n_layers  # slots compacted since the layer's store last read them

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int | None = None, dtype=None,
                  rotated_keys: bool = True) -> KVCache:
        """Empty cache sized for ``model`` (a :class:`posenc.TinyLM`) and ``batch_size`` rows; ``rotated_keys``:
        keep each layer's rotated keys across calls (module docstring; False: the lean form)."""
        scheme = model.scheme
        if scheme.memory is not None:
            raise ValueError(f"scheme {scheme.name!r} carries memory ({scheme.memory.kind}); its state is not a "
                             f"KV cache: generate with use_cache=False")
        mask = cache_mask(model)
        attn = model.blocks[0].attn
        p = next(model.parameters())
        gated = any(s.gate is not None for s in model.cfg.layer_schemes)
        return cls(len(model.blocks), batch_size, attn.n_kv_heads, attn.head_dim, mask, max_len=max_len,
                   dtype=dtype or p.dtype, device=p.device, fingerprint=_fingerprint(model), model_id=id(model),
                   gate_heads=attn.n_heads if gated else None, rotated_keys=rotated_keys)

    def _alloc(self, cap: int) -> None:
        """Grow every buffer to ``cap`` slots, copying the live ones (called O(log N) times)."""
        B, Hk, D = self.batch_size, self.n_kv_heads, self.head_dim
        used = self.capacity and (self.length + self._pending)
        new_k, new_v = [], []
        for layer in range(self.n_layers):
            nk = torch.zeros(B, Hk, cap, D, dtype=self.dtype, device=self.device)
            nv = torch.zeros(B, Hk, cap, D, dtype=self.dtype, device=self.device)
            if used:
                nk[:, :, :used] = self.k[layer][:, :, :used]
                nv[:, :, :used] = self.v[layer][:, :, :used]
            new_k.append(nk)
            new_v.append(nv)
        pos = torch.zeros(B, cap, dtype=torch.long, device=self.device)
        val = torch.zeros(B, cap, dtype=torch.bool, device=self.device)
        if used:
            pos[:, :used] = self.positions[:, :used]
            val[:, :used] = self.valid[:, :used]
        if self.gate_heads:
            gates = [torch.zeros(B, self.gate_heads, cap, device=self.device) for _ in range(self.n_layers)]
            for layer in range(self.n_layers) if used else ():
                gates[layer][:, :, :used] = self.gate[layer][:, :, :used]
            self.gate = gates
        self.k, self.v, self.positions, self.valid, self.capacity = new_k, new_v, pos, val, cap

    def _reserve(self, n_new: int) -> None:
        needed = self.length + n_new
        if self.max_len is not None and needed > self.max_len:
            what = ("the scheme keeps every key" if self.bound is None else
                    f"the scheme keeps up to {self.bound - 1} keys between calls")
            raise ValueError(f"KV cache max_len={self.max_len} is too small: {self.length} cached + {n_new} new "
                             f"tokens = {needed} slots ({what}); raise max_len or feed shorter chunks "
                             f"(prefill_chunk)")
        if needed <= self.capacity:
            return
        cap = max(needed, 2 * self.capacity, _MIN_CAPACITY)
        if self.bound is not None:
            cap = max(needed, min(cap, self.bound + n_new))
        if self.max_len is not None:
            cap = min(cap, self.max_len)
        self._alloc(cap)

    # ------------------------------------------------------------------ protocol
    def check_model(self, model, batch_size: int) -> None:
        """``ValueError`` if this cache was built for another model or another batch size."""
        if batch_size != self.batch_size:
            raise ValueError(f"batch size {batch_size} does not match the KV cache's batch size {self.batch_size}; "
                             f"build a new cache with KVCache.for_model(model, {batch_size})")
        if len(model.blocks) != self.n_layers or (self.model_id is not None and id(model) != self.model_id) or (
                self.fingerprint and _fingerprint(model) != self.fingerprint):
            raise ValueError("this KV cache was built for another model (config / layer count / instance differ); "
                             "build a new cache with KVCache.for_model(model, batch_size)")

    def next_positions(self) -> torch.Tensor | None:
        """``[B]`` position of the next token per row; None while nothing has been cached."""
        return None if self._next is None else self._next.clone()

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               key_mask: torch.Tensor | None, parts=None):
        """Append this chunk's un-rotated ``k, v [B,Hk,N,D]`` at ``positions [B,N]`` for ``layer`` and
        return views ``(k_all, v_all, k_pos_all, key_mask_all)`` of every live slot plus the chunk."""
        if layer is None or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer!r}")
        B, Hk, N, D = k.shape
        if B != self.batch_size or Hk != self.n_kv_heads or D != self.head_dim:
            raise ValueError(f"k has shape {tuple(k.shape)}; the cache holds [B={self.batch_size}, "
                             f"Hk={self.n_kv_heads}, *, D={self.head_dim}]")
        if layer == 0:
            self._pending = 0  # a chunk never committed (its forward raised) is overwritten
            self._gate_next = [None] * self.n_layers
            self._check_increasing(positions, key_mask)
            self._reserve(N)
            s = self.length
            self.positions[:, s:s + N] = positions
            self.valid[:, s:s + N] = True if key_mask is None else key_mask.bool()
            self._pending = N
        elif N != self._pending:
            raise ValueError(f"layer {layer} got {N} tokens but layer 0 got {self._pending}")
        s, e = self.length, self.length + N
        self.k[layer][:, :, s:e] = k.to(self.dtype)
        self.v[layer][:, :, s:e] = v.to(self.dtype)
        self.peak_length = max(self.peak_length, e)
        return self.k[layer][:, :, :e], self.v[layer][:, :, :e], self.positions[:, :e], self.valid[:, :e]

    def key_store(self, layer: int, k_pos: torch.Tensor) -> KeyStore | None:
        """The layer's :class:`~posenc.engine.keystore.KeyStore` for the chunk :meth:`update` just appended (keys at
        ``k_pos``, what ``update`` returned), told which keys it may carry; None without rotated keys."""
        if self.stores is None:
            return None
        store = self.stores[layer]
        store.begin(0 if self._moved[layer] else self.length, k_pos)
        self._moved[layer] = False
        return store

    def update_gate(self, layer: int, log_f: torch.Tensor) -> torch.Tensor:
        """Store the cumulative log forget gates of the chunk ``update`` just appended for ``layer``
        (``log_f [B,H,N]``, 0 at padding) and return ``c`` of every live slot plus the chunk, ``[B,H,Nk]``:
        ``c_t = c_latest + sum_{s <= t in the chunk} log f_s``."""
        if not self.gate_heads:
            raise ValueError("this KV cache keeps no forget gates: build it with KVCache.for_model for a "
                             "forget-gate scheme")
        B, H, N = log_f.shape
        if (B, H) != (self.batch_size, self.gate_heads) or N != self._pending:
            raise ValueError(f"log_f must be [B={self.batch_size}, H={self.gate_heads}, N={self._pending}] "
                             f"(the chunk update appended), got {tuple(log_f.shape)}")
        s, e = self.length, self.length + N
        c = self._gate_last[layer][:, :, None] + log_f.float().cumsum(dim=-1)  # [B,H,N]
        self.gate[layer][:, :, s:e] = c
        self._gate_next[layer] = c[:, :, -1]
        return self.gate[layer][:, :, :e]

    def _check_increasing(self, positions: torch.Tensor, key_mask: torch.Tensor | None) -> None:
        """``ValueError`` if a real token's position is not after every earlier real token of its row."""
        positions = torch.as_tensor(positions, device=self.device).long().expand(self.batch_size, -1)  # [B, N]
        ok = torch.ones_like(positions, dtype=torch.bool) if key_mask is None else key_mask.bool()
        before = torch.full_like(positions[:, :1], -1) if self._next is None else self._next[:, None] - 1
        seen = torch.where(ok, positions, torch.full_like(positions, -1)).cummax(dim=1).values  # [B, N]
        previous = torch.cat((before, seen[:, :-1].maximum(before)), dim=1)  # latest real position before
        bad = ok & (positions <= previous)
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"positions must increase in a KV cache: row {row} got position "
                             f"{int(positions[row, col])} after position {int(previous[row, col])}; "
                             "call cache.reset() (or build a new cache) to start a new sequence")

    def advance(self, positions: torch.Tensor) -> None:
        """Commit the chunk every layer has appended, then evict keys no later query can see."""
        n = self._pending
        if n == 0:
            return
        e = self.length + n
        chunk_pos, chunk_ok = self.positions[:, self.length:e], self.valid[:, self.length:e]
        last = torch.where(chunk_ok, chunk_pos, torch.full_like(chunk_pos, -1)).max(dim=1).values  # [B]
        self._next = last + 1 if self._next is None else torch.maximum(self._next, last + 1)
        self.length, self._pending = e, 0
        self.tokens_seen += n
        for layer, c in enumerate(self._gate_next):
            if c is not None:
                self._gate_last[layer], self._gate_next[layer] = c, None
        if self.bound is None:
            return
        latest = self._next - 1  # latest real query position per row
        live_pos, live_ok = self.positions[:, :e], self.valid[:, :e]
        keep = live_ok & ~self.mask.never_visible_again(live_pos, latest[:, None])
        if bool(keep.all()):
            return
        self._compact(keep)

    def _compact(self, keep: torch.Tensor) -> None:
        """Move the kept slots of each row to the front (order preserved); drop the rest."""
        e = self.length
        counts = keep.sum(dim=1)
        new_len = int(counts.max())
        self.evicted += int((self.valid[:, :e] & ~keep).sum())
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :new_len]  # [B,new_len]
        kept_ok = keep.gather(1, order)
        self.positions[:, :new_len] = self.positions[:, :e].gather(1, order)
        self.valid[:, :new_len] = kept_ok
        self.valid[:, new_len:e] = False
        idx = order[:, None, :, None].expand(-1, self.n_kv_heads, -1, self.head_dim)  # [B,Hk,new_len,D]
        for layer in range(self.n_layers):
            self.k[layer][:, :, :new_len] = self.k[layer][:, :, :e].gather(2, idx)
            self.v[layer][:, :, :new_len] = self.v[layer][:, :, :e].gather(2, idx)
        gidx = order[:, None, :].expand(-1, self.gate_heads or 0, -1)  # [B,H,new_len]
        for layer in range(self.n_layers) if self.gate_heads else ():
            self.gate[layer][:, :, :new_len] = self.gate[layer][:, :, :e].gather(2, gidx)
        self.length = new_len
        self._moved = [True] * self.n_layers

    # ------------------------------------------------------------------ introspection
    def live_positions(self) -> torch.Tensor:
        """``[B, length]`` original positions of the cached keys (invalid slots included)."""
        return self.positions[:, :self.length]

    def live_valid(self) -> torch.Tensor:
        return self.valid[:, :self.length]

    def nbytes(self) -> int:
        """Bytes held by the buffers (capacity, not just live slots)."""
        t = sum(x.numel() * x.element_size() for x in self.k + self.v + self.gate)
        return t + self.positions.numel() * 8 + self.valid.numel() + sum(s.nbytes() for s in self.stores or ())

    def reset(self) -> None:
        self.length, self._pending, self._next = 0, 0, None
        self.valid.zero_()
        self._gate_last = [torch.zeros_like(c) for c in self._gate_last]
        self._gate_next = [None] * self.n_layers
        self.tokens_seen = self.evicted = self.peak_length = 0
        for store in self.stores or ():
            store.clear()

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.n_layers}, batch={self.batch_size}, length={self.length}, "
                f"capacity={self.capacity}, bound={self.bound}, max_len={self.max_len})")
