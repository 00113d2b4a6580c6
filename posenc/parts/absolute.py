"""Absolute position embeddings: the "embedding" part of a positional scheme.

Each embedding is an ``nn.Module`` with ``forward(x [B, N, dim], positions [B, N] or [N], input_ids=None)
-> [B, N, dim]`` that returns the token embeddings with position applied (added for most, multiplied in
for complex-order), and an attribute ``max_positions`` (``None`` when any position works).
``EMBEDDINGS`` maps a scheme's embedding name to its class; :func:`build_embedding` builds one from the
common kwargs ``dim``, ``max_positions``, ``vocab_size`` (passing each only to classes that take it).

Shape legend: ``B`` batch, ``N`` sequence, ``dim`` model width.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn
from torchdiffeq import odeint

from posenc._util import as_positions, check_even_int, check_finite, check_positive_int

__all__ = [
    "EMBEDDINGS",
    "has_table",
    "table_reach",
    "ComplexOrderEmbedding",
    "FloaterEmbedding",
    "HierarchicalEmbedding",
    "LearnedEmbedding",
    "NoPositionEmbedding",
    "PositionEmbedding",
    "SinusoidalEmbedding",
    "build_embedding",
    "sinusoidal_encoding",
    "sinusoidal_table",
]


def _check_even_dim(dim) -> int:
    return check_even_int("dim", dim, "features come in sin/cos or Re/Im pairs")


# ----------------------------------------------------------------------------------------------------------
# sinusoidal (Vaswani et al.)


def sinusoidal_encoding(positions: torch.Tensor, dim: int, base: float = 10000.0,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sinusoidal encoding of any (integer or real) ``positions [...]`` -> ``[..., dim]``.

    Vaswani et al., arXiv 1706.03762, interleaved:
    ``PE(t, 2i) = sin(t / base^(2i/d))``, ``PE(t, 2i+1) = cos(t / base^(2i/d))``.
    Angles in float64, result cast to ``dtype``.
    """
    dim = _check_even_dim(dim)
    base = check_finite("base", base, minimum=1.0, strict_min=True)
    t = torch.as_tensor(positions).to(torch.float64)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64, device=t.device)  # [dim/2]: 2i
    inv_freq = base ** (-two_i / dim)  # [dim/2]
    angles = t.unsqueeze(-1) * inv_freq  # [..., dim/2]
    # [..., dim/2, 2] (sin, cos) -> [..., dim]: sin at even, cos at odd features
    return torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1).flatten(-2).to(dtype)


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Float32 table ``[num_positions, dim]``: :func:`sinusoidal_encoding` of ``0 .. num_positions-1``.

    ``PE[t, 2i] = sin(t / base^(2i/dim))``, ``PE[t, 2i+1] = cos(t / base^(2i/dim))`` (arXiv 1706.03762).
    """
    num_positions = check_positive_int("num_positions", num_positions, minimum=0)
    return sinusoidal_encoding(torch.arange(num_positions), dim, base)


# ----------------------------------------------------------------------------------------------------------
# modules


class PositionEmbedding(nn.Module):
    """Base class: input checks shared by every embedding. Subclasses set ``dim`` and ``max_positions``."""

    dim: int | None = None
    max_positions: int | None = None

    def _positions(self, x: torch.Tensor, positions) -> torch.Tensor:
        """Check ``x [B, N, dim]`` and return positions as LongTensor ``[B, N]`` on ``x.device``."""
        if x.dim() != 3:
            raise ValueError(f"x must be [batch, seq, dim], got shape {tuple(x.shape)}")
        if self.dim is not None and x.shape[-1] != self.dim:
            raise ValueError(f"x has width {x.shape[-1]} but the embedding has dim={self.dim}")
        return as_positions(positions, batch=x.shape[0], seq=x.shape[1], device=x.device)

    def _check_max(self, pos: torch.Tensor, hint: str) -> None:
        if self.max_positions is not None and pos.numel() and int(pos.max()) >= self.max_positions:
            raise ValueError(f"position {int(pos.max())} is beyond {hint}")


class NoPositionEmbedding(PositionEmbedding):
    """NoPE: no positional information in the embeddings (Kazemnejad et al., arXiv 2305.19466).

    ``forward`` returns ``x`` unchanged; a causal mask alone lets the model infer order.
    """

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = None if dim is None else check_positive_int("dim", dim)

    def forward(self, x: torch.Tensor, positions=None, input_ids=None) -> torch.Tensor:
        self._positions(x, positions)
        return x


class SinusoidalEmbedding(PositionEmbedding):
    """``x + PE(positions)``, the fixed sinusoidal encoding (arXiv 1706.03762), computed on the fly.

    Interleaved sin/cos as in :func:`sinusoidal_encoding`; float64 angles, so any position is exact.
    """

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.dim = _check_even_dim(dim)
        self.base = check_finite("base", base, minimum=1.0, strict_min=True)

    def forward(self, x: torch.Tensor, positions=None, input_ids=None) -> torch.Tensor:
        pos = self._positions(x, positions)  # [B, N]
        return x + sinusoidal_encoding(pos, self.dim, self.base, dtype=x.dtype)  # [B, N, dim]


class LearnedEmbedding(PositionEmbedding):
    """``x + table[positions]``: a trained absolute table (BERT, GPT-2), ``table [max_positions, dim]``.

    It cannot extrapolate: a position ``>= max_positions`` raises ``ValueError``. To go beyond the trained
    table, load the checkpoint into :class:`HierarchicalEmbedding` (scheme ``"hierarchical"``), which
    shares the parameter name ``table`` and extends to ``max_positions ** 2``.
    """

    @staticmethod
    def reach(table_size: int) -> int:
        """Positions a table of ``table_size`` rows addresses."""
        return table_size

    def __init__(self, dim: int, max_positions: int, init_std: float = 0.02):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.max_positions = check_positive_int("max_positions", max_positions)
        init_std = check_finite("init_std", init_std, minimum=0.0)
        self.table = nn.Parameter(torch.randn(self.max_positions, self.dim) * init_std)  # [n, dim]

    def forward(self, x: torch.Tensor, positions=None, input_ids=None) -> torch.Tensor:
        pos = self._positions(x, positions)
        self._check_max(pos, f"the learned table ({self.max_positions}); use scheme 'hierarchical' "
                             f"(HierarchicalEmbedding, Su's hierarchical decomposition, extends the trained "
                             f"table to {self.max_positions}^2 positions) to go beyond it")
        return x + self.table[pos].to(x.dtype)  # [B, N, dim]


class HierarchicalEmbedding(PositionEmbedding):
    """Hierarchical decomposition of a learned table (Su, kexue.fm/archives/7947).

    From the trained ``table`` ``p_0 .. p_{n-1}`` (``n`` = ``table_size``):
    ``u_i = (p_i - alpha p_0) / (1 - alpha)`` and ``q_{i n + j} = alpha u_i + (1 - alpha) u_j`` for
    ``0 <= i, j < n``, so ``n^2`` positions are encoded and ``q_j = p_j`` for ``j < n`` (``u_0 = p_0``).
    Positions ``< n`` return the table rows themselves (bit-exact with :class:`LearnedEmbedding`).
    The parameter is named ``table`` (``[n, dim]``) like LearnedEmbedding's, so a learned checkpoint loads
    unchanged. The constructor's ``max_positions`` is the table size ``n``; the attribute ``max_positions``
    is the extended range ``n^2``. The blog uses ``alpha = 0.4``.
    """

    @staticmethod
    def reach(table_size: int) -> int:
        """Positions a table of ``table_size`` rows addresses: its square."""
        return table_size ** 2

    def __init__(self, dim: int, max_positions: int, alpha: float = 0.4, init_std: float = 0.02):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.table_size = check_positive_int("max_positions", max_positions)
        self.max_positions = self.table_size ** 2
        self.alpha = check_finite("alpha", alpha, minimum=0.0, strict_min=True, maximum=1.0)
        if self.alpha >= 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        init_std = check_finite("init_std", init_std, minimum=0.0)
        self.table = nn.Parameter(torch.randn(self.table_size, self.dim) * init_std)  # [n, dim]

    def encode(self, pos: torch.Tensor) -> torch.Tensor:
        """Position vectors ``q_pos`` for a LongTensor ``pos [...]`` (all ``< n^2``) -> ``[..., dim]``."""
        n, a = self.table_size, self.alpha
        u = (self.table - a * self.table[:1]) / (1.0 - a)  # [n, dim]
        i, j = pos // n, pos % n  # [...]
        q = a * u[i] + (1.0 - a) * u[j]  # [..., dim]
        inside = (pos < n).unsqueeze(-1)  # [..., 1]
        return torch.where(inside, self.table[pos.clamp(max=n - 1)], q)

    def forward(self, x: torch.Tensor, positions=None, input_ids=None) -> torch.Tensor:
        pos = self._positions(x, positions)
        self._check_max(pos, f"the hierarchical extension ({self.table_size}^2 = {self.max_positions}) "
                             f"of the learned table")
        return x + self.encode(pos).to(x.dtype)


class _FloaterDynamics(nn.Module):
    """``h(t, p; theta)``: a small MLP on ``[p, t]`` -> ``dp/dt`` (``[dim]``)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 1, hidden), nn.Tanh(), nn.Linear(hidden, dim))

    def forward(self, t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        tt = t.to(p.dtype).reshape(1)  # [1]
        return self.net(torch.cat((p, tt)))  # [dim + 1] -> [dim]


class FloaterEmbedding(PositionEmbedding):
    """FLOATER (Liu et al., "Learning to Encode Position for Transformer with Continuous Dynamical Model",
    arXiv 2003.09229): ``x + p(positions * delta)`` where ``p(t)`` solves ``dp/dt = h(t, p; theta)``.

    ``h`` is a one-hidden-layer tanh MLP of ``[p, t]`` and ``p(0) = p0`` is learned. Solved with
    ``torchdiffeq.odeint`` (not the adjoint: gradients flow through the solver's steps):

    * ``method="rk4"`` (default): one fixed fourth-order Runge-Kutta step per position on the grid ``0, delta,
      2 delta, ...`` up to the largest requested position (4 MLP evaluations per position). torchdiffeq's
      ``rk4`` is the 3/8-rule variant (``rk4_alt_step_func``), not the classical 1/6-1/3-1/3-1/6 tableau.
      Deterministic, so the values at positions ``[0, N)`` are identical whatever longer range is solved.
    * ``method="dopri5"``: adaptive Dormand-Prince on the sorted unique requested positions only, with
      ``rtol``/``atol`` (default 1e-5 / 1e-7); cheaper for sparse far positions; prefix-stable within
      that tolerance.

    Extends to any length (the ODE is simply integrated further), so ``max_positions`` is ``None``; the
    constructor's ``max_positions`` (the training length) is only recorded as ``train_positions``.
    The paper injects FLOATER in every layer; here it is the input embedding only.
    """

    METHODS = ("rk4", "dopri5")

    def __init__(self, dim: int, max_positions: int | None = None, hidden: int = 32, delta: float = 0.1,
                 method: str = "rk4", rtol: float = 1e-5, atol: float = 1e-7, init_std: float = 0.02):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.train_positions = None if max_positions is None else check_positive_int("max_positions",
                                                                                     max_positions)
        self.max_positions = None
        self.hidden = check_positive_int("hidden", hidden)
        self.delta = check_finite("delta", delta, minimum=0.0, strict_min=True)
        if method not in self.METHODS:
            raise ValueError(f"method must be one of {self.METHODS}, got {method!r}")
        self.method = method
        self.rtol = check_finite("rtol", rtol, minimum=0.0, strict_min=True)
        self.atol = check_finite("atol", atol, minimum=0.0, strict_min=True)
        init_std = check_finite("init_std", init_std, minimum=0.0)
        self.p0 = nn.Parameter(torch.randn(self.dim) * init_std)  # [dim]
        self.dynamics = _FloaterDynamics(self.dim, self.hidden)

    def encode(self, sorted_positions: torch.Tensor) -> torch.Tensor:
        """``p(pos * delta)`` for sorted unique non-negative ``sorted_positions [U]`` -> ``[U, dim]``."""
        if sorted_positions.numel() == 0:
            return self.p0.new_zeros(0, self.dim)
        dtype, dev = self.p0.dtype, self.p0.device
        if self.method == "rk4":
            last = int(sorted_positions[-1])
            if last == 0:
                return self.p0.unsqueeze(0).expand(sorted_positions.numel(), -1)
            t = torch.arange(last + 1, device=dev, dtype=torch.float64).mul(self.delta).to(dtype)  # [last+1]
            path = odeint(self.dynamics, self.p0, t, method="rk4")  # [last+1, dim]
            return path[sorted_positions.to(dev)]
        # dopri5: integrate only to the requested times (with t=0 prepended for the initial value)
        grid = torch.unique(torch.cat((sorted_positions.new_zeros(1), sorted_positions)))  # [G] sorted
        if grid.numel() == 1:
            return self.p0.unsqueeze(0).expand(sorted_positions.numel(), -1)
        t = grid.to(dev, torch.float64).mul(self.delta).to(dtype)
        path = odeint(self.dynamics, self.p0, t, method="dopri5", rtol=self.rtol, atol=self.atol)  # [G, dim]
        return path[torch.searchsorted(grid, sorted_positions).to(dev)]

    def forward(self, x: torch.Tensor, positions=None, input_ids=None) -> torch.Tensor:
        pos = self._positions(x, positions)  # [B, N]
        uniq, inverse = torch.unique(pos, sorted=True, return_inverse=True)  # [U], [B, N]
        return x + self.encode(uniq)[inverse].to(x.dtype)  # [B, N, dim]


class ComplexOrderEmbedding(PositionEmbedding):
    """Complex word-order embedding (Wang et al., "Encoding word order in complex embeddings", ICLR 2020,
    arXiv 1912.12333): ``f(w, p)_k = r_{w,k} exp(i (omega_{w,k} p + theta_{w,k}))``.

    Real-valued realisation (Re and Im parts concatenated), ``K = dim / 2`` complex features:
    amplitude ``r = x[..., :K]`` (the first half of the token embedding ``x``; its second half is unused),
    per-word frequency ``omega`` and initial phase ``theta`` tables ``[vocab_size, K]`` indexed by
    ``input_ids`` (required), ``phi = omega_w * p + theta_w`` in float64, output
    ``cat(r * cos(phi), r * sin(phi))`` = ``cat(Re f, Im f)`` of shape ``[B, N, dim]``. A negative amplitude
    is a phase shift by pi, so a real ``r`` loses nothing. Init: ``omega`` is the sinusoidal frequency
    ladder ``base^(-2k/dim)`` for every word, ``theta`` uniform in ``[0, 2 pi)``.
    """

    def __init__(self, dim: int, vocab_size: int, base: float = 10000.0):
        super().__init__()
        self.dim = _check_even_dim(dim)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        base = check_finite("base", base, minimum=1.0, strict_min=True)
        half = self.dim // 2
        ladder = base ** (-torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim)  # [K]
        self.omega = nn.Parameter(ladder.float().expand(self.vocab_size, half).clone())  # [V, K]
        self.theta = nn.Parameter(torch.rand(self.vocab_size, half) * (2 * math.pi))  # [V, K]

    def forward(self, x: torch.Tensor, positions=None, input_ids=None) -> torch.Tensor:
        pos = self._positions(x, positions)  # [B, N]
        if input_ids is None:
            raise ValueError("input_ids is required by ComplexOrderEmbedding (per-word frequency and phase)")
        input_ids = torch.as_tensor(input_ids, device=x.device)
        if input_ids.shape != pos.shape or input_ids.is_floating_point():
            raise ValueError(f"input_ids must be an integer tensor [batch, seq] = {tuple(pos.shape)}, got "
                             f"{input_ids.dtype} {tuple(input_ids.shape)}")
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.vocab_size):
            raise ValueError(f"input_ids must be in [0, {self.vocab_size}), got range "
                             f"[{int(input_ids.min())}, {int(input_ids.max())}]")
        ids = input_ids.long()
        # [B, N, K] float64: phi = omega_w * p + theta_w
        phi = self.omega[ids].double() * pos.double().unsqueeze(-1) + self.theta[ids].double()
        work = torch.promote_types(x.dtype, torch.float32)
        cos, sin = torch.cos(phi).to(work), torch.sin(phi).to(work)
        r = x[..., : self.dim // 2].to(work)  # [B, N, K]
        return torch.cat((r * cos, r * sin), dim=-1).to(x.dtype)  # [B, N, dim]


# ----------------------------------------------------------------------------------------------------------
# registry


EMBEDDINGS: dict[str, type[PositionEmbedding]] = {
    "nope": NoPositionEmbedding,
    "sinusoidal": SinusoidalEmbedding,
    "learned": LearnedEmbedding,
    "hierarchical": HierarchicalEmbedding,
    "floater": FloaterEmbedding,
    "complex_order": ComplexOrderEmbedding,
}

_COMMON_KWARGS = ("dim", "max_positions", "vocab_size")


def has_table(name: str) -> bool:
    """Whether embedding ``name`` reads a learned table (its size is the scheme's ``max_positions`` or train_len)."""
    return hasattr(EMBEDDINGS.get(name), "reach")


def table_reach(name: str, table_size: int) -> int | None:
    """Positions embedding ``name`` addresses with a table of ``table_size`` rows (None: no table, or any position)."""
    return EMBEDDINGS[name].reach(table_size) if has_table(name) and table_size else None


def build_embedding(name: str, *, dim: int | None = None, max_positions: int | None = None,
                    vocab_size: int | None = None, **options) -> PositionEmbedding:
    """Build ``EMBEDDINGS[name]``. ``dim``, ``max_positions``, ``vocab_size`` are passed only to classes whose
    constructor takes them (so a scheme may always supply all three); ``options`` are passed as given."""
    if name not in EMBEDDINGS:
        raise ValueError(f"embedding must be one of {sorted(EMBEDDINGS)}, got {name!r}")
    cls = EMBEDDINGS[name]
    accepted = inspect.signature(cls.__init__).parameters
    common = {"dim": dim, "max_positions": max_positions, "vocab_size": vocab_size}
    kwargs = {k: v for k, v in common.items() if k in accepted and v is not None}
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"embedding {name!r} does not take option(s) {unknown}; it takes "
                         f"{sorted(p for p in accepted if p != 'self')}")
    missing = [p.name for p in accepted.values() if p.name != "self" and p.default is inspect.Parameter.empty
               and p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in kwargs and p.name not in options]
    if missing:
        raise ValueError(f"embedding {name!r} needs {missing}")
    return cls(**kwargs, **options)
