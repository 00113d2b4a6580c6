"""``TinyLM``: a small Llama-style decoder-only LM built from a :class:`PositionScheme`.

Token embedding -> the scheme's embedding part -> n_layers x [RMSNorm -> PositionalAttention ->
residual -> RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> tied LM head. No biases anywhere: with the
``rope`` scheme this is exactly Hugging Face's ``LlamaForCausalLM`` (tied embeddings), and
:func:`posenc.hf.export.export` writes it as one.

``model.with_scheme(scheme)`` returns the same weights under another scheme: this is how the lab
applies training-free extension methods to a RoPE-trained model (``scheme.extend("yarn", ...)``)
and how a learned table is read through Su's hierarchical decomposition.

Per-layer schemes: a layer-pattern scheme (``PositionScheme.preset("irope" | "local_global" | "nope_every4")``,
or ``PositionScheme(layers=(s0, s1, ...))``) gives block i the scheme ``scheme.layer(i)`` (the pattern repeats
over the layers); ``LMConfig.layer_schemes`` lists them. ``model.with_scheme("yarn", factor=4)`` extends the
RoPE layers only; ``layers=[...]`` chooses model layers.

Transformer-XL's recurrence (scheme.memory ``xl_recurrence``): the sequence is processed in
segments of ``mem_len``; each layer sees the previous segment's (detached) inputs as extra keys.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from posenc._util import as_positions, check_finite, check_positive_int
from posenc.engine import PositionalAttention
from posenc.parts.absolute import build_embedding
from posenc.scheme.core import PositionScheme
from posenc.scheme.part import Part


@dataclass(frozen=True)
class LMConfig:
    """Shape of a :class:`TinyLM`: ``vocab_size``, width ``dim``, ``n_layers`` blocks of ``n_heads`` heads
    (``head_dim = dim / n_heads``; ``n_kv_heads`` < ``n_heads`` shares key/value heads as in GQA,
    Ainslie et al., arXiv 2305.13245), the positional ``scheme``, the training length ``train_len``,
    the MLP size ``mlp_ratio`` and ``dropout``. Checked on construction (``ValueError``);
    ``to_dict``/``from_dict`` round-trip it through a run's ``config.json``. ``scheme`` may be a layer
    pattern (:mod:`posenc.scheme.pattern`): block i then uses ``scheme.layer(i)`` (:attr:`layer_schemes`);
    the pattern's period must not exceed ``n_layers``.

    MLP width (:attr:`mlp_hidden`): the SwiGLU MLP has three ``dim x hidden`` matrices where a GELU MLP of
    width ``mlp_ratio * dim`` has two, so ``hidden = 2/3 * mlp_ratio * dim`` rounded *up* to a multiple of 8
    keeps the parameter count of the GELU MLP it replaces (Shazeer, arXiv 2002.05202; Llama's
    ``8/3 * dim`` for ``mlp_ratio=4``): ``dim=64`` gives 176, ``dim=256`` gives 688.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    scheme: PositionScheme
    train_len: int
    mlp_ratio: int = 4
    dropout: float = 0.0
    n_kv_heads: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "train_len", "mlp_ratio"):
            check_positive_int(f"LMConfig.{name}", getattr(self, name))
        check_finite("LMConfig.dropout", self.dropout, minimum=0.0, maximum=1.0)
        if self.dropout == 1.0:
            raise ValueError("LMConfig.dropout must be in [0, 1), got 1.0 (every activation dropped)")
        if self.n_kv_heads is not None:
            check_positive_int("LMConfig.n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"LMConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                                 f"({self.n_kv_heads})")
        if self.dim % self.n_heads:
            raise ValueError(f"LMConfig.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if not isinstance(self.scheme, PositionScheme):
            raise ValueError("LMConfig.scheme must be a PositionScheme")
        if self.scheme.layers is not None and len(self.scheme.layers) > self.n_layers:
            raise ValueError(f"LMConfig.scheme {self.scheme.name!r} is a pattern of {len(self.scheme.layers)} layers, "
                             f"more than n_layers={self.n_layers}: some of its layers would never be built; "
                             f"use a shorter pattern (the presets take every=...)")

    @property
    def layer_schemes(self) -> tuple[PositionScheme, ...]:
        """The scheme of each block, ``scheme.layer(i)`` for i < n_layers."""
        return tuple(self.scheme.layer(i) for i in range(self.n_layers))

    @property
    def mlp_hidden(self) -> int:
        """SwiGLU hidden width: ``ceil(2/3 * mlp_ratio * dim / 8) * 8`` (see the class docstring)."""
        return -(-2 * self.mlp_ratio * self.dim // 24) * 8

    def to_dict(self) -> dict:
        d = asdict(self)
        d["scheme"] = self.scheme.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LMConfig:
        if not isinstance(d, dict):
            raise ValueError(f"model config must be a dict, got {type(d).__name__}")
        known = [f.name for f in fields(cls)]
        unknown, missing = sorted(set(d) - set(known)), [f.name for f in fields(cls)
                                                         if f.name not in d and f.default is MISSING]
        if unknown or missing:
            raise ValueError(f"model config has unknown fields {unknown} / lacks fields {missing}; "
                             f"fields: {known}")
        d = dict(d)
        d["scheme"] = PositionScheme.from_dict(d["scheme"])
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    """Llama's gated MLP: ``down(silu(gate(x)) * up(x))``, no biases (Shazeer, "GLU Variants Improve
    Transformer", arXiv 2002.05202; ``silu(z) = z sigmoid(z)``). ``x [..., dim]`` -> ``[..., dim]``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LMConfig, scheme: PositionScheme | None = None):
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim)
        scheme = cfg.scheme if scheme is None else scheme
        self.attn = PositionalAttention(cfg.dim, cfg.n_heads, scheme, n_kv_heads=cfg.n_kv_heads)
        self.norm2 = RMSNorm(cfg.dim)
        self.mlp = SwiGLU(cfg.dim, cfg.mlp_hidden)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, positions, impl="auto", cache=None, layer=None, context=None, key_mask=None):
        x = x + self.drop(self.attn(self.norm1(x), positions, impl=impl, cache=cache, layer=layer,
                                    context=context, key_mask=key_mask))
        return x + self.drop(self.mlp(self.norm2(x)))


class TinyLM(nn.Module):
    """A small pre-norm decoder-only LM (Llama's block) with its positions from ``cfg.scheme``.

    ``h_0 = pos(tok(x))`` (the scheme's embedding part, :func:`posenc.parts.absolute.build_embedding`), then per
    block ``h = h + Attn(RMSNorm(h))``, ``h = h + SwiGLU(RMSNorm(h))`` (pre-norm RMSNorm, Zhang & Sennrich,
    arXiv 1910.07467; :class:`SwiGLU`; Llama, Touvron et al., arXiv 2302.13971), and
    ``logits = RMSNorm(h) E^T`` with the token table ``E`` tied (Press & Wolf, arXiv 1608.05859). No
    biases. ``forward``: ids ``[B, N]`` -> logits ``[B, N, vocab_size]``.
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        emb = cfg.scheme.embedding
        self.pos = build_embedding(emb.kind, dim=cfg.dim, vocab_size=cfg.vocab_size, **emb.params)
        self.blocks = nn.ModuleList(Block(cfg, s) for s in cfg.layer_schemes)
        self.norm = RMSNorm(cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    @property
    def scheme(self) -> PositionScheme:
        return self.cfg.scheme

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, positions=None, cache=None, impl: str = "auto",
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids [B,N]`` -> logits ``[B,N,V]``. With ``cache`` (see :mod:`posenc.models.cache`), the
        tokens are appended after what the cache holds and positions continue from it.
        ``attention_mask [B,N]`` (1 = token, 0 = padding) hides padding keys."""
        self._check_input_ids(input_ids)
        B, N = input_ids.shape
        if positions is None:
            start = cache.next_positions() if cache is not None else None
            positions = (torch.arange(N, device=input_ids.device)[None] if start is None
                         else start[:, None] + torch.arange(N, device=input_ids.device)[None])
        positions = as_positions(positions, B, N, input_ids.device)
        limit = self.scheme.max_positions
        if limit is not None and int(positions.max()) >= limit:
            raise ValueError(
                f"position {int(positions.max())} is beyond what the {self.scheme.embedding.kind!r} embedding "
                f"can address ({limit}); evaluate it with model.with_scheme(PositionScheme.preset('hierarchical', "
                f"train_len={self.cfg.train_len})) or keep sequences within {limit}")
        if cache is not None:
            cache.check_model(self, B)
        x = self.drop(self.pos(self.tok(input_ids), positions, input_ids=input_ids))
        mem = self.scheme.memory
        if mem is not None and mem.kind == "xl_recurrence" and cache is None:
            x = self._forward_xl(x, positions, int(mem.params.get("mem_len") or self.cfg.train_len), impl)
        else:
            key_mask = None if attention_mask is None else attention_mask.bool()
            for i, blk in enumerate(self.blocks):
                x = blk(x, positions, impl=impl, cache=cache, layer=i, key_mask=key_mask)
        if cache is not None:
            cache.advance(positions)
        return F.linear(self.norm(x), self.tok.weight)  # tied head

    def _check_input_ids(self, input_ids) -> None:
        """Token ids must be an integer ``[B, N]`` tensor with B, N >= 1 and every id in [0, vocab_size)."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point() \
                or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be an integer tensor [batch, seq], got "
                             f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                             f"{tuple(getattr(input_ids, 'shape', ()))}")
        if input_ids.numel() == 0:
            raise ValueError(f"input_ids must hold at least one row and one token, got shape {tuple(input_ids.shape)}")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.cfg.vocab_size:
            raise ValueError(f"input_ids must be in [0, vocab_size={self.cfg.vocab_size}), got ids from {lo} to {hi}")

    def _forward_xl(self, x, positions, seg: int, impl):
        """Segment-level recurrence: segments of ``seg`` tokens; layer l of segment s attends to
        its own segment and, gradient-stopped, to layer l's input of segment s-1."""
        outs, prev = [], None  # prev: per-layer inputs of the previous segment
        for s in range(0, x.shape[1], seg):
            h, pos = x[:, s:s + seg], positions[:, s:s + seg]
            cur = []
            for i, blk in enumerate(self.blocks):
                cur.append(h)
                context = None
                if prev is not None:
                    ph, ppos = prev[i]
                    ph = blk.norm1(ph.detach())
                    _, kc, vc = blk.attn.project(ph)
                    context = (kc, vc, ppos)
                h = blk(h, pos, impl=impl, context=context)
            prev = [(c, pos) for c in cur]
            outs.append(h)
        return torch.cat(outs, dim=1)

    # ------------------------------------------------------------------ schemes
    def with_scheme(self, scheme: PositionScheme | str, layers=None, **params) -> TinyLM:
        """The same weights under another scheme. ``scheme`` may be a method name applied to this
        model's scheme (``model.with_scheme("yarn", factor=4)``): for a layer pattern, to its RoPE layers.
        ``layers`` (model layer indices) applies the method to those layers only, turning the scheme into a
        pattern of ``n_layers`` layers (:func:`posenc.scheme.pattern.extend_pattern`). The new model is on this
        model's device with this model's dtype."""
        if isinstance(scheme, str):
            base = self.scheme if layers is None else self._per_layer_scheme()
            scheme = base.extend(scheme, layers=layers, **params)
        elif params or layers is not None:
            raise ValueError("params and layers are only accepted with a method name")
        p = next(self.parameters())
        with torch.device(p.device):  # built where this model is (no host copy first), then given its dtype
            new = TinyLM(replace(self.cfg, scheme=scheme)).to(p.dtype)
        missing, unexpected = new.load_state_dict(self.state_dict(), strict=False)
        if missing or unexpected:
            raise ValueError(f"scheme {scheme.name!r} does not fit these weights: missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]}; only schemes with the same learned parts apply")
        return new.train(self.training)

    def _per_layer_scheme(self) -> PositionScheme:
        """This model's scheme as a pattern with one entry per layer (so layers= indexes model layers)."""
        s = self.scheme
        if s.memory is not None:
            raise ValueError(f"scheme {s.name!r} carries memory ({s.memory.kind}); it has no per-layer form")
        layers = tuple(replace(x, embedding=Part("nope")) for x in self.cfg.layer_schemes)
        return PositionScheme(name=s.name, embedding=s.embedding, train_len=s.train_len, layers=layers)

    def new_cache(self, batch_size: int, **kw):
        from posenc.models.cache import KVCache

        return KVCache.for_model(self, batch_size, **kw)
