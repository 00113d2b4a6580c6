"""Multi-axis RoPE part: positions ``[B, N, A]`` (one integer coordinate per axis: a patch's row and
column, or Qwen2-VL's temporal / height / width ids), one rotation angle per frequency pair

    angle[b, h, n, i] = sum_a pos[b, n, a] * W[h, a, i] + phase[i]

with ``W [1 or H, A, R/2]`` (R the rotary dim) and, for normalised pixel coordinates, a constant
``phase``. Then pairs rotate exactly as in :mod:`posenc.parts.rotary` (``layout`` half or interleaved), so
``q.k`` depends on the coordinate differences only (the phase cancels). The kinds:

==========  =====================================================  ====================================
kind        W                                                      paper / reference
==========  =====================================================  ====================================
axial       axis a owns pairs [a R/(2A), (a+1) R/(2A)); per axis    rotary-embedding-torch
            the RoPE frequencies of dim R/A (``freqs="lang"``) or    ``get_axial_freqs`` (Heo et al. 2024,
            ``pi * linspace(1, max_freq/2, R/(2A))`` on coordinates  arXiv 2403.13298: "RoPE-Axial")
            normalised to [-1, 1] over ``grid`` (``"pixel"``)
mrope       pair i belongs to the axis whose section holds it        Qwen2-VL M-RoPE, Wang et al. 2024,
            (``sections`` t, h, w in pairs); W = the scheme's        arXiv 2409.12191 (transformers
            inv_freq (so frequency schedules compose)                ``Qwen2VLRotaryEmbedding``)
mixed       learned per head ``(theta_x, theta_y)`` vectors,         RoPE-Mixed, Heo et al. 2024,
            initialised at magnitudes ``theta^(-4j/R)`` turned by a  arXiv 2403.13298 (naver-ai/rope-vit
            random angle per head (pairs j and j + R/4 at +90deg)    ``init_2d_freqs``)
==========  =====================================================  ====================================

Positions given as ``[B, N]`` (or ``[N]``) are the same coordinate on every axis (a text token of
Qwen2-VL: then M-RoPE is plain RoPE).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from posenc._util import batch_choices, check_finite, check_positive_int

__all__ = ["MULTIAXIS", "AxialRope", "MixedRope", "MRope", "MultiAxisRope", "apply_multiaxis_rope", "as_axis_positions",
           "build_multiaxis", "check_multiaxis", "grid_positions", "is_axis_positions"]


def grid_positions(*sizes: int, device=None) -> torch.Tensor:
    """Row-major coordinates of a grid: ``grid_positions(h, w)`` is ``[h * w, 2]`` with token ``r * w + c`` at
    ``(r, c)`` (the order of ``x.flatten(1, 2)`` for an image ``[B, h, w, C]``)."""
    if not sizes:
        raise ValueError("grid_positions needs at least one size")
    for i, s in enumerate(sizes):
        check_positive_int(f"sizes[{i}]", s)
    axes = torch.meshgrid(*(torch.arange(s, device=device) for s in sizes), indexing="ij")
    return torch.stack([a.reshape(-1) for a in axes], dim=-1)  # [prod(sizes), A]


def as_axis_positions(positions, n_axes: int, batch: int, seq: int, device=None) -> torch.Tensor:
    """Positions as a LongTensor ``[B or 1, N, n_axes]``: ``[N, A]`` / ``[B, N, A]`` as given, ``[N]`` /
    ``[B, N]`` repeated on every axis (a 2-D tensor that fits both ``[B, N]`` and ``[N, A]`` is ``[B, N]``).
    Integers >= 0 only (``ValueError`` otherwise)."""
    p = torch.as_tensor(positions, device=device)
    if p.dtype == torch.bool or p.is_floating_point():
        raise ValueError(f"positions must be integers, got {p.dtype}")
    p, given = p.long(), tuple(p.shape)
    if is_axis_positions(p, n_axes, batch, seq):
        p = p if p.dim() == 3 else p[None]
    elif p.dim() in (1, 2):
        p = (p if p.dim() == 2 else p[None])[..., None].expand(-1, -1, n_axes)
    else:
        raise ValueError(f"positions must be [seq], [batch, seq] or [batch, seq, {n_axes}], got {given}")
    if p.shape[-1] != n_axes or p.shape[1] != seq or p.shape[0] not in (1, batch):
        raise ValueError(f"positions of this multi-axis scheme ({n_axes} axes) must be [seq, {n_axes}] or "
                         f"[batch, seq, {n_axes}] with batch {batch_choices(batch)} and seq {seq}, "
                         f"got shape {given}")
    if p.numel() and int(p.min()) < 0:
        raise ValueError(f"positions must be >= 0, got min {int(p.min())}")
    return p


def is_axis_positions(positions, n_axes: int, batch: int, seq: int) -> bool:
    """True when ``positions`` are per-axis coordinates: ``[B, N, A]``, or ``[N, A]`` (as
    :func:`grid_positions` gives them) where that shape is not also ``[B, N]``. An ``[N, A']`` that cannot be
    ``[B, N]`` (``A' != N``) counts too, whatever ``A'``: :func:`as_axis_positions` then refuses a wrong number of
    axes by name instead of the shape being read as a batch of ``N`` rows."""
    shape = tuple(torch.as_tensor(positions).shape)
    return len(shape) == 3 or (len(shape) == 2 and shape[0] == seq and shape != (batch, seq)
                               and (shape[1] == n_axes or shape[1] != seq))


class MultiAxisRope(nn.Module):
    """Base class: ``W`` and ``phase`` (see the module docstring); subclasses define :meth:`weights`.
    ``supplied``: the constructor arguments the layer gives besides ``rotary_dim``."""

    n_axes: int = 2
    supplied: tuple[str, ...] = ()

    @staticmethod
    def check_params(**params) -> dict:
        """Validate the parameters that do not depend on the layer's dims, when the scheme is built
        (:func:`check_multiaxis`); subclasses override it."""
        return params

    def weights(self, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(W [1 or H, A, R/2], phase [R/2] or None)``, float64. ``inv_freq``: the scheme's frequencies."""
        raise NotImplementedError

    def cos_sin(self, pos: torch.Tensor, inv_freq: torch.Tensor, dtype=torch.float32):
        """``cos, sin [B, 1 or H, N, R/2]`` of the angles at ``pos [B, N, A]``; angles in float64."""
        W, phase = self.weights(inv_freq.to(pos.device))
        angles = torch.einsum("bna,hai->bhni", pos.to(torch.float64), W.to(pos.device))
        if phase is not None:
            angles = angles + phase.to(pos.device)
        return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def _check_dims(rotary_dim: int, n_axes: int, per_axis_multiple: int, kind: str) -> int:
    if rotary_dim % (n_axes * per_axis_multiple):
        raise ValueError(f"{kind} needs a rotary dim divisible by {n_axes * per_axis_multiple} "
                         f"({n_axes} axes), got {rotary_dim}")
    return rotary_dim // n_axes


class AxialRope(MultiAxisRope):
    """Axial RoPE (rotary-embedding-torch ``get_axial_freqs``): the rotary dim split evenly between ``n_axes``
    axes; axis a rotates its pairs by its own coordinate. ``freqs="lang"``: frequencies
    ``base^(-2j / d_a)`` (``d_a = R / n_axes``), integer coordinates; ``"pixel"``: frequencies
    ``pi * linspace(1, max_freq / 2, d_a / 2)`` on the coordinate ``-1 + 2 p / (grid[a] - 1)``
    (``linspace(-1, 1, grid[a])`` at integer p; a grid size of 1 gives coordinate -1)."""

    supplied = ("base",)

    @staticmethod
    def check_params(n_axes=2, freqs="lang", max_freq=10.0, grid=None) -> dict:
        """Validate the parameters that do not depend on the layer (``ValueError`` naming the bad one);
        returns them normalised. Called when the scheme is built and again by the constructor."""
        n_axes = check_positive_int("axial.n_axes", n_axes)
        if freqs not in ("lang", "pixel"):
            raise ValueError(f"axial.freqs must be 'lang' or 'pixel', got {freqs!r}")
        max_freq = check_finite("axial.max_freq", max_freq, minimum=0.0, strict_min=True)
        if grid is not None or freqs == "pixel":
            if not isinstance(grid, (list, tuple)) or len(grid) != n_axes:
                raise ValueError(f"axial.grid must give the grid size of each of the {n_axes} axes (a list of "
                                 f"{n_axes} integers >= 1; freqs='pixel' normalises coordinates to [-1, 1] over "
                                 f"it), got {grid!r}")
            grid = [check_positive_int(f"axial.grid[{i}]", g) for i, g in enumerate(grid)]
        return {"n_axes": n_axes, "freqs": freqs, "max_freq": max_freq, "grid": grid}

    def __init__(self, rotary_dim: int, base: float = 10000.0, n_axes: int = 2, freqs: str = "lang",
                 max_freq: float = 10.0, grid: list | tuple | None = None):
        super().__init__()
        self.n_axes = self.check_params(n_axes=n_axes, freqs=freqs, max_freq=max_freq, grid=grid)["n_axes"]
        d_axis = _check_dims(rotary_dim, self.n_axes, 2, "axial RoPE")
        self.freqs, self.d_axis = freqs, d_axis
        if freqs == "lang":
            f = 1.0 / (float(base) ** (torch.arange(0, d_axis, 2, dtype=torch.float64) / d_axis))
        else:
            f = torch.linspace(1.0, max_freq / 2, d_axis // 2, dtype=torch.float32).double() * math.pi
        self.grid = None if grid is None else tuple(int(g) for g in grid)
        self.register_buffer("axis_freqs", f, persistent=False)  # [d_a / 2]

    def weights(self, inv_freq):
        A, half = self.n_axes, self.d_axis // 2
        W = torch.zeros(1, A, A * half, dtype=torch.float64)
        phase = None
        for a in range(A):
            scale = 1.0
            if self.freqs == "pixel":
                scale = 2.0 / (self.grid[a] - 1) if self.grid[a] > 1 else 0.0
            W[0, a, a * half:(a + 1) * half] = self.axis_freqs * scale
        if self.freqs == "pixel":
            phase = -self.axis_freqs.repeat(A)  # coordinate -1 at p = 0 on every axis
        return W, phase


class MRope(MultiAxisRope):
    """Qwen2-VL's M-RoPE: ``sections`` (pairs per axis, summing to R/2; default about 1/4 temporal and 3/8
    each for height and width, Qwen2-VL's [16, 24, 24] at R = 128) assign pair i to the axis of the section
    that holds it; the frequency is the scheme's own ``inv_freq[i]``."""

    @staticmethod
    def check_params(sections=None) -> dict:
        """Validate ``sections`` (a non-empty list of integers >= 1, or None) when the scheme is built; its
        sum is checked against the rotary dim when the layer builds the part."""
        if sections is None:
            return {"sections": None}
        if not isinstance(sections, (list, tuple)) or not sections:
            raise ValueError(f"mrope.sections must be a non-empty list of pair counts per axis (integers >= 1), "
                             f"got {sections!r}")
        return {"sections": [check_positive_int(f"mrope.sections[{i}]", s) for i, s in enumerate(sections)]}

    def __init__(self, rotary_dim: int, sections: list | tuple | None = None):
        super().__init__()
        half = rotary_dim // 2
        sections = self.check_params(sections)["sections"]
        if sections is None:
            t = half // 4
            hw = (half - t) // 2
            sections = (half - 2 * hw, hw, hw)
        if sum(sections) != half:
            raise ValueError(f"mrope.sections must sum to rotary_dim // 2 = {half}, got {list(sections)}")
        self.sections = tuple(int(s) for s in sections)
        self.n_axes = len(self.sections)

    def weights(self, inv_freq):
        W = torch.zeros(1, self.n_axes, inv_freq.numel(), dtype=torch.float64)
        start = 0
        for a, s in enumerate(self.sections):
            W[0, a, start:start + s] = inv_freq[start:start + s].double()
            start += s
        return W, None


class MixedRope(MultiAxisRope):
    """RoPE-Mixed (Heo et al. 2024, arXiv 2403.13298): learned per-head frequency vectors for x and y,
    ``angle = p_x theta_x[h, i] + p_y theta_y[h, i]``. Initialisation (their ``init_2d_freqs``): magnitudes
    ``m_j = theta^(-4j / R)`` for ``j < R/4``, a random angle ``phi_h`` per head, ``theta_x = [m cos(phi_h),
    m cos(phi_h + pi/2)]``, ``theta_y = [m sin(phi_h), m sin(phi_h + pi/2)]``. Positions ``(x, y)``."""

    supplied = ("n_heads",)

    @staticmethod
    def check_params(theta=10.0, rotate=True) -> dict:
        """Validate ``theta`` (finite, > 0) and ``rotate`` (a bool) when the scheme is built."""
        if not isinstance(rotate, bool):
            raise ValueError(f"mixed.rotate must be true or false, got {rotate!r}")
        return {"theta": check_finite("mixed.theta", theta, minimum=0.0, strict_min=True), "rotate": rotate}

    def __init__(self, rotary_dim: int, n_heads: int, theta: float = 10.0, rotate: bool = True):
        super().__init__()
        _check_dims(rotary_dim, 2, 2, "RoPE-Mixed")
        self.check_params(theta, rotate)
        mag = 1.0 / (float(theta) ** (torch.arange(0, rotary_dim, 4, dtype=torch.float32)[:rotary_dim // 4]
                                      / rotary_dim))
        phi = torch.rand(n_heads, 1) * 2 * math.pi if rotate else torch.zeros(n_heads, 1)
        fx = torch.cat([mag * torch.cos(phi), mag * torch.cos(phi + math.pi / 2)], dim=-1)  # [H, R/2]
        fy = torch.cat([mag * torch.sin(phi), mag * torch.sin(phi + math.pi / 2)], dim=-1)
        self.freqs = nn.Parameter(torch.stack([fx, fy], dim=1))  # [H, 2, R/2]
        self.n_axes = 2

    def weights(self, inv_freq):
        return self.freqs.double(), None


#: kind -> class (``supplied`` names what the layer gives when it builds the part)
MULTIAXIS: dict[str, type[MultiAxisRope]] = {"axial": AxialRope, "mrope": MRope, "mixed": MixedRope}


def build_multiaxis(kind: str, rotary_dim: int, n_heads: int, base: float, **params) -> MultiAxisRope:
    """The part of ``kind`` for a layer (``rotary_dim``, ``n_heads`` and the RoPE ``base`` supplied)."""
    if kind not in MULTIAXIS:
        raise ValueError(f"multiaxis kind must be one of {sorted(MULTIAXIS)}, got {kind!r}")
    cls = MULTIAXIS[kind]
    given = {"base": base, "n_heads": n_heads}
    supplied = {"rotary_dim": rotary_dim, **{k: given[k] for k in cls.supplied}}
    try:
        return cls(**supplied, **params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for multiaxis {kind!r}: {exc}") from None


def check_multiaxis(kind: str, params: dict) -> None:
    """Refuse bad parameters of a multi-axis part when its scheme is built, not at the first forward
    (``ValueError`` naming the parameter and the allowed values; unknown names are refused by the scheme)."""
    if kind not in MULTIAXIS:
        raise ValueError(f"multiaxis kind must be one of {sorted(MULTIAXIS)}, got {kind!r}")
    import inspect

    cls = MULTIAXIS[kind]
    accepted = set(inspect.signature(cls.check_params).parameters)
    cls.check_params(**{k: v for k, v in params.items() if k in accepted})


def apply_multiaxis_rope(x: torch.Tensor, positions, part: MultiAxisRope, inv_freq: torch.Tensor | None = None,
                         layout: str = "interleaved", rotary_dim: int | None = None) -> torch.Tensor:
    """``x [B, H, N, D]`` rotated at multi-axis ``positions`` (see :func:`as_axis_positions`) by ``part``;
    ``inv_freq``: the RoPE frequencies (M-RoPE reads them; axial and mixed parts carry their own)."""
    from posenc.parts.rotary import apply_rope_cos_sin

    B, _, N, D = x.shape
    rd = D if rotary_dim is None else rotary_dim
    if inv_freq is None:
        inv_freq = torch.zeros(rd // 2, dtype=torch.float64)
    cos, sin = part.cos_sin(as_axis_positions(positions, part.n_axes, B, N, x.device), inv_freq)
    return apply_rope_cos_sin(x, cos, sin, layout, rotary_dim)
