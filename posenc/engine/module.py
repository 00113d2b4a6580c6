"""The module API: :class:`PositionalAttention`, multi-head attention that owns a scheme's learned parts."""

from __future__ import annotations

import torch
import torch.nn as nn

from posenc._util import as_positions, check_positive_int
from posenc.engine.dispatch import run_attention
from posenc.engine.parts import AttentionParts
from posenc.parts.multiaxis import is_axis_positions
from posenc.scheme.core import PositionScheme


class PositionalAttention(nn.Module):
    """Multi-head attention (q/k/v/o projections) that executes any :class:`PositionScheme`,
    including its learned parts (T5 table, KERPLE r1/r2, FIRE MLP, Shaw/XL/DeBERTa tables, CoPE
    embeddings, Infini gate, FoX forget gate: ``gate``, which reads the layer input ``x``).

    ``forward(x [B,N,dim], positions=None, impl="auto", cache=None, layer=None, memory=None)``.
    """

    def __init__(self, dim: int, n_heads: int, scheme: PositionScheme, n_kv_heads: int | None = None,
                 bias: bool = False):
        super().__init__()
        dim, n_heads = check_positive_int("dim", dim), check_positive_int("n_heads", n_heads)
        if dim % n_heads:
            raise ValueError(f"dim ({dim}) must be divisible by n_heads ({n_heads})")
        n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
        self.dim, self.n_heads = dim, n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = dim // n_heads
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=bias)
        self.parts = AttentionParts(scheme, n_heads, self.head_dim)
        self.memory = None
        if scheme.memory is not None:
            from posenc.parts.memory import MEMORIES

            if scheme.memory.kind not in MEMORIES:
                raise ValueError(f"unknown memory {scheme.memory.kind!r}; known: {sorted(MEMORIES)}")
            memory_cls = MEMORIES[scheme.memory.kind]  # None: the memory lives in the model (XL recurrence)
            if memory_cls is not None:
                self.memory = memory_cls(n_heads, self.head_dim, **scheme.memory.params)
        self.gate = None
        if scheme.gate is not None:
            from posenc.parts.gates import GATES

            if scheme.gate.kind not in GATES:
                raise ValueError(f"unknown gate {scheme.gate.kind!r}; known: {sorted(GATES)}")
            self.gate = GATES[scheme.gate.kind](dim, n_heads, **scheme.gate.params)

    @property
    def scheme(self) -> PositionScheme:
        return self.parts.scheme

    def project(self, x):
        B, N, _ = x.shape
        q = self.q_proj(x).view(B, N, self.n_heads, self.head_dim).transpose(1, 2)  # [B,H,N,D]
        k = self.k_proj(x).view(B, N, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B,Hk,N,D]
        v = self.v_proj(x).view(B, N, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def _check_memory_inputs(self, cache, context, key_mask):
        """The compressive memory reads every token of every segment: it has no padding, cache or context form."""
        kind = self.scheme.memory.kind
        if cache is not None or context is not None:
            raise ValueError(f"scheme {self.scheme.name!r} carries a {kind} memory: it takes no KV cache or context "
                             "(its state is the memory itself); run the whole sequence in one call")
        if key_mask is not None and not bool(torch.as_tensor(key_mask).all()):
            raise ValueError(f"scheme {self.scheme.name!r} carries a {kind} memory, which would fold padding tokens "
                             "into its state; pass unpadded sequences (key_mask all True)")

    def forward(self, x, positions=None, impl: str = "auto", cache=None, layer: int | None = None,
                context=None, key_mask=None):
        """``context``: optional ``(k_ctx, v_ctx, pos_ctx)`` extra keys placed before x's keys
        (Transformer-XL's gradient-stopped memory); ``cache``/``layer``: a posenc KV cache whose
        ``update`` returns all keys, values, positions and validity; ``key_mask [B,N]``: False for
        padding tokens of x."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be a [batch, tokens, {self.dim}] tensor, got {getattr(x, 'shape', type(x))}")
        own = self.q_proj.weight.dtype
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor of the layer's dtype {own} (hidden states, not "
                            f"token ids), got {x.dtype}")
        if x.dtype != own:
            raise TypeError(f"x must have the layer's dtype {own}, got {x.dtype}: convert the input (x.to({own})) "
                            f"or the layer (layer.to({x.dtype}))")
        B, N, _ = x.shape
        axes = None  # multi-axis coordinates [B,N,A]: attention reads them, the mask reads token order
        if self.parts.multiaxis is not None and positions is not None and is_axis_positions(
                positions, self.parts.multiaxis.n_axes, B, N):  # [B,N,A], or [N,A] as grid_positions gives
            if cache is not None or context is not None:
                raise ValueError("[batch, seq, n_axes] positions work without a cache or context; decode with "
                                 "[batch, seq] positions (the same coordinate on every axis)")
            axes, positions = positions, None
        positions = as_positions(positions, B, N, x.device)
        q, k, v = self.project(x)
        if self.memory is not None:
            self._check_memory_inputs(cache, context, key_mask)
            out = self.memory(q, k, v, positions, lambda *a, **kw: run_attention(self.parts, *a, impl=impl, **kw))
        else:
            k_pos = positions
            if context is not None:
                kc, vc, pc = context
                k, v = torch.cat([kc, k], dim=2), torch.cat([vc, v], dim=2)  # [B,Hk,Nctx+N,D]
                k_pos = torch.cat([pc, positions], dim=1)
            gates = None
            if self.gate is not None:
                if context is not None:
                    raise ValueError("a forget gate needs the gates of the context keys too; it takes no context")
                log_f = self.gate(x, key_mask)  # [B,H,N] log forget gates, 0 at padding
            store = None
            if cache is not None:
                k, v, k_pos, key_mask = cache.update(layer, k, v, positions, key_mask, self.parts)
                store = cache.key_store(layer, k_pos) if hasattr(cache, "key_store") else None
                if self.gate is not None:
                    k_gate = cache.update_gate(layer, log_f)  # [B,H,Nk]: the cached sums continue
                    gates = (k_gate[:, :, -N:], k_gate)
            elif self.gate is not None:
                k_gate = log_f.cumsum(dim=-1)  # [B,H,N] c_t = sum_{s <= t} log f_s
                gates = (k_gate, k_gate)
            q_in, k_in = (positions, k_pos) if axes is None else (axes, axes)
            out = run_attention(self.parts, q, k, v, q_in, k_in, impl=impl, key_mask=key_mask, gates=gates,
                                key_store=store if axes is None else None)
        out = out.transpose(1, 2).reshape(B, N, self.dim)  # [B,H,N,D] -> [B,N,H*D]
        return self.o_proj(out)
