"""A method's position map: for every (query, key) pair of a sequence, the relative position the attention reads it
at, whether the query sees the key, and the frequency schedule those positions are rotated with.

Nothing here knows a method by name. :func:`method_scheme` builds the method's :class:`~posenc.scheme.PositionScheme`
through the registry (its record's ``base_preset`` and per-length defaults, :func:`posenc.methods.length_defaults`),
and :func:`position_map` reads that scheme through the engine's own objects, as the ``reference`` backend does:

- the relative position: :class:`~posenc.engine.AttentionParts` splits a layer into remap branches; each pair takes
  the branch whose region holds it, and is read at ``(q_rot(qp) - k_rot(kp)) * freq_scale`` (the branch rotates the
  query at ``q_rot``, the key at ``k_rot``, with ``inv_freq * freq_scale``);
- the mask: ``AttentionParts.allowed`` (the scheme's mask and the remap's own restriction), and for a remap that
  chooses keys by content or per head (InfLLM-style retrieval, DuoAttention) the choice the engine makes
  (:func:`posenc.engine.scores.content_mask`) for head 0 on seeded random queries and keys;
- the schedule: ``AttentionParts.frequencies`` at the map's length (a dynamic schedule at the last query's length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["PositionMap", "identity_at", "method_scheme", "position_map", "probe_positions", "read_positions"]


@dataclass(frozen=True)
class PositionMap:
    """What :func:`position_map` returns. ``relative [N, N]`` float64 (query rows, key columns; NaN where the query
    does not see the key), ``visible [N, N]`` bool, ``inv_freq`` the schedule at ``length`` and ``default_inv_freq``
    plain RoPE's (both None without a rotary part), ``content``: keys are also chosen by content or per head (the mask
    is head 0's on seeded random queries and keys)."""

    spec: str
    params: dict
    train_len: int
    length: int
    relative: torch.Tensor
    visible: torch.Tensor
    inv_freq: torch.Tensor | None
    default_inv_freq: torch.Tensor | None
    content: bool
    layer_pattern: bool = False

    @property
    def max_read(self) -> float:
        """The largest relative position any visible pair is read at."""
        seen = self.relative[self.visible]
        return float(seen.abs().max()) if seen.numel() else 0.0

    def turns(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(at_length, trained)`` per dimension pair: the turns (rotations / 2 pi) a dimension makes over the
        largest relative position read at ``length`` under the method's schedule, and over the trained range
        ``train_len - 1`` under plain RoPE's; None without a rotary part."""
        if self.inv_freq is None:
            return None
        two_pi = 2 * math.pi
        return (self.inv_freq * self.max_read / two_pi, self.default_inv_freq * (self.train_len - 1) / two_pi)


def method_scheme(spec: str, train_len: int, length: int, params: dict | None = None, *, head_dim: int = 64,
                  base: float = 10000.0):
    """``(scheme, params)``: method ``spec`` (``"a+b"`` composes; a trained-in method or preset name too) applied to
    its record's base preset trained at ``train_len``, with the parameters it reads ``length`` tokens with
    (:func:`posenc.methods.length_defaults`) overridden by ``params``."""
    from posenc.methods import TRAINED_METHODS, length_defaults
    from posenc.scheme.core import TRAINED, PositionScheme

    params = dict(params or {})
    if spec in TRAINED or spec in TRAINED_METHODS:  # a trained-in scheme: its own preset, nothing applied on top
        return PositionScheme.preset(spec, train_len=train_len, **params), params
    resolved = {**length_defaults(spec, train_len, length, head_dim=head_dim, base=base), **params}
    return _base_scheme(spec, train_len, base).extend(spec, **resolved), resolved


def _base_scheme(spec: str, train_len: int, base: float):
    """The trained scheme method ``spec`` applies to: its record's ``base_preset`` trained at ``train_len``."""
    from posenc.methods import parse_methods
    from posenc.scheme.core import PositionScheme

    preset = parse_methods(spec)[0].base_preset
    return PositionScheme.preset(preset, train_len=train_len, **({"base": base} if preset == "rope" else {}))


def probe_positions(length: int) -> torch.Tensor:
    """Positions in ``[0, length)`` that probe every distance scale: 0-3, the last four, 33 evenly spaced, and the
    last position minus each power of two and its neighbours (window, chunk and exact-range edges are round)."""
    last = length - 1
    pos = {0, 1, 2, 3, *range(max(0, last - 3), length)}
    pos |= {round(i * last / 32) for i in range(33)}
    p = 1
    while p <= last:
        pos |= {last - p - 1, last - p, last - p + 1}
        p *= 2
    return torch.tensor(sorted(x for x in pos if 0 <= x <= last), device="cpu")


def identity_at(spec: str, train_len: int, length: int, params: dict | None = None, *, head_dim: int = 64,
                base: float = 10000.0, seed: int = 0) -> bool:
    """Whether method ``spec`` with ``params`` reads a ``length``-token causal sequence exactly as the untouched
    trained scheme does: its attention weights equal the untouched scheme's (float64, to 1e-9) for random queries
    and keys at :func:`probe_positions`, every query against every key, under the schedule at each query's length
    (so a window no pair reaches, a remap whose exact range holds every pair, a scaling factor of 1 and a dynamic
    schedule below its threshold are the identity, and anything that binds on a pair of the probe is not).

    Conservative: False for a scheme with per-layer patterns or a remap that chooses keys by content (a probe of a
    few keys would not reach their budgets), and for parameters the scheme does not take (runtime options of the
    Hugging Face path such as a tuned factor file)."""
    from posenc.engine import AttentionParts, make_call
    from posenc.engine.dispatch import attention_weights
    from posenc.methods import is_identity

    if is_identity(spec):
        return True
    try:
        scheme, _ = method_scheme(spec, train_len, length, params, head_dim=head_dim, base=base)
        plain = _base_scheme(spec, train_len, base)
    except (ValueError, TypeError, KeyError):
        return False
    if scheme.layers is not None:
        return False
    parts, ref = (AttentionParts(s, 2, head_dim).double().eval() for s in (scheme, plain))
    if parts.remap.reads_content:
        return False
    pos = probe_positions(length)[None]
    gen = torch.Generator(device="cpu").manual_seed(seed)  # a probe of the scheme, on the CPU whatever the run's device
    q = torch.randn(1, 2, pos.shape[1], head_dim, generator=gen, dtype=torch.float64, device="cpu")
    k, v = (torch.randn(1, 1, pos.shape[1], head_dim, generator=gen, dtype=torch.float64, device="cpu")
            for _ in range(2))
    with torch.no_grad():
        got, want = (attention_weights(make_call(p, q, k, v, pos, pos)) for p in (parts, ref))
    return bool(torch.allclose(got, want, rtol=0.0, atol=1e-9))


def read_positions(parts, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
    """Per pair, ``(q_rot(qp) - k_rot(kp)) * freq_scale`` of the branch whose region holds it (the later branch wins
    where regions overlap, as in ``posenc.engine.scores.scores_tile``)."""
    rel = None
    for br in parts.branches:
        r = ((br.q_rot(qp) - br.k_rot(kp)).double() * br.freq_scale).expand(qp.shape[0], kp.shape[1])
        region = None if br.region is None else br.region(qp, kp).expand_as(r)
        rel = r if rel is None or region is None else torch.where(region, r, rel)
    return rel


def position_map(spec: str, train_len: int, length: int, params: dict | None = None, *, head_dim: int = 64,
                 base: float = 10000.0, seed: int = 0) -> PositionMap:
    """The position map of method ``spec`` read at ``length`` tokens by a model trained at ``train_len`` (see the
    module docstring); ``params`` override the method's per-length defaults; a layer pattern is drawn at layer 0."""
    from posenc._util import check_positive_int
    from posenc.engine import AttentionParts, make_call
    from posenc.engine.scores import content_mask
    from posenc.parts.frequencies import rope_frequencies

    train_len = check_positive_int("train_len", train_len)
    length = check_positive_int("length", length)
    scheme, resolved = method_scheme(spec, train_len, length, params, head_dim=head_dim, base=base)
    pattern = scheme.layers is not None
    layer = scheme.layer(0)
    parts = AttentionParts(layer, 1, head_dim)
    pos = torch.arange(length)
    qp, kp = pos[:, None], pos[None, :]
    visible = parts.allowed(qp, kp).expand(length, length).clone()
    content = bool(parts.remap.reads_content)
    if content:
        gen = torch.Generator().manual_seed(seed)
        q, k = (torch.randn(1, 1, length, head_dim, generator=gen, dtype=torch.float64) for _ in range(2))
        call = make_call(parts.double(), q, k, k)
        chosen = content_mask(call, call.q, call.q_pos)
        visible &= chosen[0, 0].expand(length, length)
    relative = read_positions(parts, qp, kp).masked_fill(~visible, float("nan"))
    inv = default = None
    if layer.rope is not None:
        inv = parts.frequencies(length if parts.dynamic else None).inv_freq.double()
        default = rope_frequencies(head_dim, base=layer.rope.base,
                                   partial_rotary_factor=layer.rope.partial_rotary_factor).inv_freq.double()
    return PositionMap(spec=spec, params=resolved, train_len=train_len, length=length, relative=relative,
                       visible=visible, inv_freq=inv, default_inv_freq=default, content=content,
                       layer_pattern=pattern)
