"""The scheme's runtime parts for one attention layer (:class:`AttentionParts`), built once per layer."""

from __future__ import annotations

import copy
from functools import lru_cache

import torch
import torch.nn as nn

from posenc.parts.masks import MaskSpec
from posenc.parts.remap import Branch, Remap
from posenc.scheme.core import PositionScheme


class AttentionParts(nn.Module):
    """The scheme's parts for one attention layer, built once: learned tables live here."""

    def __init__(self, scheme: PositionScheme, n_heads: int, head_dim: int):
        super().__init__()
        if scheme.layers is not None:
            raise ValueError(f"scheme {scheme.name!r} is a layer pattern ({len(scheme.layers)} layer schemes); an "
                             f"attention layer takes one of them: scheme.layer(i)")
        self.scheme = scheme
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.bias = None
        if scheme.bias is not None:
            from posenc.parts.biases import BIASES

            if scheme.bias.kind not in BIASES:
                raise ValueError(f"unknown bias {scheme.bias.kind!r}; known: {sorted(BIASES)}")
            self.bias = BIASES[scheme.bias.kind](num_heads=n_heads, **scheme.bias.params)
        self.relative = None
        if scheme.relative is not None:
            from posenc.parts.relative import RELATIVE

            if scheme.relative.kind not in RELATIVE:
                raise ValueError(f"unknown relative part {scheme.relative.kind!r}; known: {sorted(RELATIVE)}")
            self.relative = RELATIVE[scheme.relative.kind](n_heads=n_heads, head_dim=head_dim,
                                                           **scheme.relative.params)
        self.remap: Remap = scheme.build_remap()
        self.branches: list[Branch] = self.remap.branches()
        self.mask: MaskSpec = scheme.mask
        self.rope = scheme.rope
        self.rotary_dim = None
        if self.rope is not None:
            rd = int(head_dim * self.rope.partial_rotary_factor)
            if rd % 2 or rd <= 0:
                raise ValueError(f"RoPE needs an even rotary dim; head_dim {head_dim} x partial_rotary_factor "
                                 f"{self.rope.partial_rotary_factor} = {rd}")
            self.rotary_dim = rd
        self._freq_cache: dict = {}
        self._inv_cache: dict = {}  # (id(freqs), freq_scale, device) -> (freqs, float64 inv_freq, its values)
        self._scale_cache: dict = {}  # constant query scales: (shape, dtype, device, value) -> [B,1,Nq,1]
        self.dynamic = self.rope is not None and scheme.is_dynamic  # a per-query schedule (read every call)
        self.temperature = None if scheme.temperature is None else scheme.build_temperature()
        self.multiaxis = None  # a multi-axis RoPE part: positions [B, N, n_axes] (posenc.parts.multiaxis)
        if scheme.multiaxis is not None:
            from posenc.parts.multiaxis import build_multiaxis

            self.multiaxis = build_multiaxis(scheme.multiaxis.kind, self.rotary_dim, n_heads, self.rope.base,
                                             **scheme.multiaxis.params)

    # ------------------------------------------------------------------ frequencies
    def frequencies(self, length: int | None):
        """RopeFrequencies for a schedule length (None: static schedule)."""
        key = length
        if key not in self._freq_cache:
            from posenc.parts.frequencies import rope_frequencies

            self._freq_cache[key] = rope_frequencies(self.head_dim, base=self.rope.base,
                                                     scaling=self.rope.scaling, seq_len=length,
                                                     partial_rotary_factor=self.rope.partial_rotary_factor)
        return self._freq_cache[key]

    def inv_freq64(self, freqs, freq_scale: float, device) -> tuple[torch.Tensor, tuple]:
        """``(inv_freq * freq_scale`` as float64 on ``device``, its values as a tuple``)`` of a schedule's
        frequencies ``freqs``, built once per schedule and branch scale (every call reads them)."""
        key = (id(freqs), freq_scale, str(device))
        hit = self._inv_cache.get(key)
        if hit is None or hit[0] is not freqs:
            inv = freqs.inv_freq.to(device=device, dtype=torch.float64)
            inv = inv * freq_scale if freq_scale != 1.0 else inv
            if len(self._inv_cache) >= 64:
                self._inv_cache.clear()
            hit = self._inv_cache[key] = (freqs, inv, tuple(inv.tolist()))
        return hit[1], hit[2]

    def schedule_lengths(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Per query, the length its dynamic schedule sees ([B,Nq] long), or None if static."""
        if not self.dynamic:
            return None
        scaling = self.rope.scaling
        floor = int(scaling.get("original_max_position_embeddings") or self.scheme.train_len or 1)
        if self.rope.dynamic == "sequence":
            n = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
            ell = torch.full_like(q_pos, n)
        else:
            step = self.rope.dynamic_step
            ell = torch.div(q_pos + step, step, rounding_mode="floor") * step  # ceil((qp+1)/step)*step
        return ell.clamp(min=floor)

    # ------------------------------------------------------------------ elementwise helpers
    def allowed(self, qp, kp):
        """The scheme's mask conjoined with the remap's own restriction (PCW), elementwise."""
        ok = self.mask.allowed(qp, kp)
        extra = self.remap.allowed(qp, kp)
        return ok if extra is None else ok & extra

    def bias_query_pos(self, qp, kp):
        """Positions the bias sees: the remapped relative distance re-expressed as a query position."""
        if not self.remap.remaps_distance:
            return qp
        return kp + torch.floor(self.remap.relative(qp, kp)).long()

    @property
    def single_branch(self) -> bool:
        return len(self.branches) == 1

    def plain_view(self) -> AttentionParts:
        """These parts with a plain causal mask and no remap, sharing every table, bias and cache (a shallow
        copy, made once): what a call runs where neither the window nor the remap binds
        (:mod:`posenc.engine.exact`). Its scheme says so too (compiled kernels are keyed by the scheme)."""
        view = self.__dict__.get("_plain_view")
        if view is None:
            from dataclasses import replace

            view = copy.copy(self)
            view.__dict__["scheme"] = replace(self.scheme, mask=MaskSpec(causal=True), remap=None)
            view.__dict__["mask"] = view.scheme.mask
            view.__dict__["remap"] = view.scheme.build_remap()
            view.__dict__["branches"] = view.remap.branches()
            self.__dict__["_plain_view"] = view  # not a submodule: no second copy of the tables in state_dict
        return view


@lru_cache(maxsize=64)
def parts_for(scheme_json: str, n_heads: int, head_dim: int, device: str = "cpu") -> AttentionParts:
    """Parts of a parameter-free scheme on ``device`` (their tables: ALiBi slopes, frequencies), shared by every
    functional call with that scheme, shape and device."""
    parts = AttentionParts(PositionScheme.from_json(scheme_json), n_heads, head_dim)
    if any(p.requires_grad for p in parts.parameters()):
        raise ValueError("this scheme has learned parameters (bias/relative tables); use "
                         "posenc.PositionalAttention, which owns them, instead of posenc.attention")
    return parts.to(torch.device(device))


def expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[B,Hk,Nk,D]`` key/value heads repeated to the ``n_heads`` query heads (GQA)."""
    if x.shape[1] == n_heads:
        return x
    if n_heads % x.shape[1]:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of key/value heads ({x.shape[1]})")
    return x.repeat_interleave(n_heads // x.shape[1], dim=1)  # [B,H,Nk,D]
