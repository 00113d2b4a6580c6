"""Rotated keys kept across the forward calls of an extended Hugging Face model, and when they may be.

transformers caches what the attention layer hands it; under posenc that is the *un-rotated* keys (posenc's identity
rotation, :mod:`posenc.hf.attention`), since a method may place one key differently for different queries. So a
decode step would rotate every cached key again in every layer. Each extended attention module therefore gets a
:class:`~posenc.engine.keystore.KeyStore` (the keys as each of the method's key rotations turns them) and a forward
pre-hook that proves, step by step, that the keys the store holds are still the cache's. Rows are carried into a call
only when all of these hold:

- the cache passed to the module (``cache=``, ``past_key_values=`` or ``past_key_value=``) holds, at the module's
  ``layer_idx``, exactly transformers' ``DynamicLayer``, whose ``update`` returns ``cat(keys, new)``: the old keys
  unchanged, then the new ones;
- that layer's keys before this forward are the very tensor this module's attention read last time (a weak
  reference: a cache that was replaced, cropped, reordered for beam search or reset holds another tensor) and its
  version counter has not moved since (nothing wrote into it);
- the attention function receives the layer's keys after the update, longer by exactly its queries;
- the carried keys sit at the same positions (:meth:`KeyStore.begin <posenc.engine.keystore.KeyStore.begin>`).

Anything else carries nothing and the call rotates every key it reads, as the lean form
(``extend(..., rotated_keys=False)``) always does: no cache, a static, sliding, quantised or offloaded cache layer,
a layer that reads another layer's cache (shared KV), a chunked or sparse-attention layer.
"""

from __future__ import annotations

import weakref

import torch

from posenc.engine.keystore import KeyStore

CACHE_ARGS = ("cache", "past_key_values", "past_key_value")


class LayerKeys:
    """One attention module's store and what its last call read (module docstring)."""

    def __init__(self):
        self.store = KeyStore()
        self._read: weakref.ref | None = None  # the key tensor the last call read
        self._version = -1
        self._rows = 0
        self._pending: tuple | None = None  # (cache layer, rows carried) from the pre-hook of this forward

    def before(self, layer) -> None:
        """The pre-hook's part: ``layer`` is the module's ``DynamicLayer`` of this forward's cache, or None."""
        if layer is None:
            self._pending = None
            return
        keys = layer.keys if getattr(layer, "is_initialized", False) else None
        version = None if keys is None else _version(keys)
        same = version is not None and self._read is not None and self._read() is keys and version == self._version
        self._pending = (layer, self._rows if same else 0)

    def for_call(self, key: torch.Tensor, n_new: int, k_pos: torch.Tensor) -> KeyStore | None:
        """The store for this call (``begin`` done), or None when nothing is proven about ``key``; remembers
        ``key`` as what this call reads."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0].keys is not key:
            self.forget()
            return None
        carried = pending[1] if key.shape[2] == pending[1] + n_new else 0
        self.store.begin(carried, k_pos)
        self._read, self._version, self._rows = weakref.ref(key), _version(key), key.shape[2]
        return self.store

    def forget(self) -> None:
        self.store.clear()
        self._read, self._version, self._rows = None, -1, 0


def _version(t: torch.Tensor) -> int | None:
    """The tensor's version counter, or None for an inference-mode tensor, which keeps none: without it an in-place
    write cannot be ruled out, so :meth:`LayerKeys.before` carries nothing (under ``torch.inference_mode`` every
    step rotates every key, as the lean form does; under ``torch.no_grad``, what ``generate`` uses, keys carry)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _dynamic_layer(module, kwargs):
    """The module's ``DynamicLayer`` of the cache this forward was given, or None."""
    from transformers.cache_utils import DynamicLayer

    cache = next((kwargs[n] for n in CACHE_ARGS if kwargs.get(n) is not None), None)
    layers = getattr(cache, "layers", None)
    idx = getattr(module, "layer_idx", None)
    if not isinstance(layers, list | tuple) or not isinstance(idx, int) or not 0 <= idx < len(layers):
        return None
    layer = layers[idx]
    return layer if type(layer) is DynamicLayer else None


def _before_forward(module, args, kwargs):
    module._posenc_keys.before(_dynamic_layer(module, kwargs))


def install(attention_modules) -> list:
    """A :class:`LayerKeys` and its pre-hook on every module; returns the hook handles."""
    handles = []
    for m in attention_modules:
        m._posenc_keys = LayerKeys()
        handles.append(m.register_forward_pre_hook(_before_forward, with_kwargs=True))
    return handles


def store_for(module, key: torch.Tensor, n_new: int, k_pos: torch.Tensor) -> KeyStore | None:
    """The store the attention function passes the engine for this call of ``module`` (None: rotate all)."""
    keys = getattr(module, "_posenc_keys", None)
    return None if keys is None else keys.for_call(key, n_new, k_pos)


def stored_bytes(model) -> int:
    """Bytes the rotated keys of every extended layer hold now (the memory the lean form does not use)."""
    return sum(m._posenc_keys.store.nbytes() for m in model.modules() if hasattr(m, "_posenc_keys"))
