"""Position-remap part: the relative position that RoPE (and any bias) sees.

A remap turns one attention into a few *branches*. Each branch owns a region of (query, key)
pairs and rotates queries and keys at its own positions (optionally with scaled frequencies);
the regions partition every query's keys. Plain RoPE is one branch covering everything.
The attention engine evaluates each branch only where its region is (the blockwise path computes
boundary tiles twice, nothing of size N x N is built) and the reference path selects per pair.

With d = qp - kp >= 0 (causal), the relative positions are:

=================  ================================================  ==============================
remap              relative position seen                            paper / reference
=================  ================================================  ==============================
ReRoPE(w)          d if d < w else w                                 Su 2023, kexue.fm/archives/9708
LeakyReRoPE(w, k)  d if d < w else w + (d - w) / k                   same
SelfExtend(G, W)   d if d < W else qp//G - kp//G + W - W//G          Jin et al. arXiv 2401.01325
DistanceCeiling(C) min(d, C)  (LM-Infinite's distance ceiling)       Han et al. arXiv 2308.16137
StreamingReindex   sinks at min(qp, n_sinks + window - 1) - kp       Xiao et al. arXiv 2309.17453
DualChunk(s, l)    three chunk branches, see :class:`DualChunk`      An et al. arXiv 2402.17463
STRING(S, W)       d if d < S else d - S + W                         An et al. arXiv 2410.18745
BlockRetrieval     ReRoPE(w) + sinks / remainder / top-k far blocks  Xiao et al. arXiv 2402.04617
DuoAttention           per-head sinks + window on streaming heads        Xiao et al. arXiv 2410.10819
=================  ================================================  ==============================

Two remaps choose keys from more than positions: :class:`~posenc.parts.retrieval.BlockRetrieval` (InfLLM:
top-k blocks by the query's inner product with a block representative) and
:class:`~posenc.parts.retrieval.DuoAttention` (DuoAttention: a mask per head). They declare
``reads_content`` and implement :meth:`Remap.select`; only the backends that finish on a score tile
(``reference``, ``blockwise``) run them.

ReRoPE's outside branch rotates the query at position w and leaves the key unrotated, exactly as
bojone/rerope does (so q.k depends on w only). Leaky ReRoPE rotates the query at qp + w(k - 1) and
the key at kp, both with inv_freq / k: (qp - kp + w(k - 1)) / k = w + (d - w) / k.
SelfExtend follows datamllab/LongLM: group query position qp // G + W - W // G (the reference uses
float ``W / G`` in one place and ``W // G`` in another; they agree when G divides W, which we use),
group key position kp // G, neighbour region d < W.

StreamingLLM keeps ``n_sinks`` first tokens and the ``window`` most recent ones and numbers them by
their slot in the cache. A recent key's distance is unchanged (d); a sink's distance becomes
(slot of the query) - kp = min(qp, n_sinks + window - 1) - kp. Writing it as a function of the
original positions makes the full forward equal to token-by-token decoding after eviction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._util import check_finite, check_positive_int
from posenc.parts.branches import Branch, Elementwise, Remap, far_band, near_band
from posenc.parts.retrieval import BlockRetrieval, DuoAttention

__all__ = ["REMAPS", "TEMPERATURES", "Branch", "Remap", "build_remap", "build_temperature", "logn_scale"]

@dataclass(frozen=True)
class NoRemap(Remap):
    name = "none"

    def exact_within(self) -> tuple[float, float]:
        return math.inf, math.inf


@dataclass(frozen=True)
class ReRoPE(Remap):
    """ReRoPE (Su 2023): relative position min(d, window). Requires window >= 1."""

    window: int = 512
    name = "rerope"
    remaps_distance = True

    def __post_init__(self):
        check_positive_int("rerope.window", self.window)

    def branches(self) -> list[Branch]:
        w = self.window
        return [
            Branch(region=near_band(w), kind="near", window=w),
            Branch(region=far_band(w), q_rot=lambda qp: torch.full_like(qp, w),
                   k_rot=lambda kp: torch.zeros_like(kp), kind="far", window=w),
        ]

    def relative(self, qp, kp):
        d = (qp - kp).double()
        return torch.where(d < self.window, d, torch.full_like(d, self.window))

    def exact_within(self) -> tuple[float, float]:
        return self.window, math.inf  # the near branch: d itself


@dataclass(frozen=True)
class LeakyReRoPE(Remap):
    """Leaky ReRoPE (Su 2023): d inside the window, w + (d - w)/k outside; k=1 is plain RoPE,
    k -> inf is ReRoPE."""

    window: int = 512
    factor: float = 16.0
    name = "leaky_rerope"
    remaps_distance = True

    def __post_init__(self):
        check_positive_int("leaky_rerope.window", self.window)
        check_finite("leaky_rerope.factor", self.factor, minimum=1.0)

    def branches(self) -> list[Branch]:
        w, k = self.window, float(self.factor)
        shift = round(w * (k - 1))
        if abs(shift - w * (k - 1)) > 1e-9:
            raise ValueError(f"leaky_rerope needs window * (factor - 1) to be an integer, got {w * (k - 1)}")
        return [
            Branch(region=near_band(w), kind="near", window=w),
            Branch(region=far_band(w), q_rot=lambda qp: qp + shift, freq_scale=1.0 / k, kind="far", window=w),
        ]

    def relative(self, qp, kp):
        d = (qp - kp).double()
        return torch.where(d < self.window, d, self.window + (d - self.window) / self.factor)

    def exact_within(self) -> tuple[float, float]:
        return self.window, math.inf


@dataclass(frozen=True)
class SelfExtend(Remap):
    """SelfExtend (Jin et al. 2024, arXiv 2401.01325): neighbour attention within ``window`` W,
    grouped attention (positions floor-divided by ``group`` G) beyond it."""

    group: int = 8
    window: int = 512
    name = "selfextend"
    remaps_distance = True

    def __post_init__(self):
        check_positive_int("selfextend.group", self.group)
        check_positive_int("selfextend.window", self.window)

    def branches(self) -> list[Branch]:
        g, w = self.group, self.window
        shift = w - w // g
        return [
            Branch(region=near_band(w), kind="near", window=w),
            Branch(region=far_band(w), q_rot=lambda qp: torch.div(qp, g, rounding_mode="floor") + shift,
                   k_rot=lambda kp: torch.div(kp, g, rounding_mode="floor"), kind="far", window=w),
        ]

    def relative(self, qp, kp):
        d = (qp - kp).double()
        g, w = self.group, self.window
        grouped = (torch.div(qp, g, rounding_mode="floor") - torch.div(kp, g, rounding_mode="floor")
                   + w - w // g).double()
        return torch.where(d < w, d, grouped)

    def exact_within(self) -> tuple[float, float]:
        return self.window, math.inf  # the neighbour branch


@dataclass(frozen=True)
class DistanceCeiling(Remap):
    """LM-Infinite's distance ceiling: relative position ``min(d, ceiling)`` (the paper's ``d' = min(d, L_pretrain)``).
    The same rotation as ReRoPE with window = ceiling."""

    ceiling: int = 512
    name = "ceiling"
    remaps_distance = True

    def __post_init__(self):
        check_positive_int("ceiling.ceiling", self.ceiling)

    def branches(self) -> list[Branch]:
        return ReRoPE(self.ceiling).branches()

    def relative(self, qp, kp):
        return ReRoPE(self.ceiling).relative(qp, kp)

    def exact_within(self) -> tuple[float, float]:
        return self.ceiling, math.inf


@dataclass(frozen=True)
class StreamingReindex(Remap):
    """StreamingLLM's cache re-indexing (see module docstring). Recent keys keep their distance,
    the ``n_sinks`` first keys are seen from the query's cache slot min(qp, n_sinks + window - 1)."""

    n_sinks: int = 4
    window: int = 512
    name = "streaming"
    remaps_distance = True

    def __post_init__(self):
        check_positive_int("streaming.n_sinks", self.n_sinks, minimum=0)
        check_positive_int("streaming.window", self.window)

    def branches(self) -> list[Branch]:
        s, cap = self.n_sinks, self.n_sinks + self.window - 1
        return [
            Branch(region=lambda qp, kp: kp >= s, kind="all"),
            Branch(region=lambda qp, kp: kp < s, q_rot=lambda qp: qp.clamp(max=cap), kind="all"),
        ]

    def relative(self, qp, kp):
        cap = self.n_sinks + self.window - 1
        return torch.where(kp >= self.n_sinks, (qp - kp).double(), (qp.clamp(max=cap) - kp).double())

    def exact_within(self) -> tuple[float, float]:
        return math.inf, self.n_sinks + self.window  # a sink is seen from min(qp, n_sinks + window - 1)


@dataclass(frozen=True)
class ParallelContextWindows(Remap):
    """PCW (Ratner et al. 2023, arXiv 2212.10947): the first ``n_windows * window`` tokens form
    ``n_windows`` parallel context windows that attend only within themselves and all reuse
    positions 0..window-1; later (task) tokens attend to every window and to each other, at
    positions window, window + 1, ... (continuing after the longest window).

    Implemented as a remap of absolute positions (one branch) plus the mask ``allowed``.
    """

    window: int = 512
    n_windows: int = 2
    name = "pcw"
    remaps_distance = True
    restricts_keys = True

    def __post_init__(self):
        check_positive_int("pcw.window", self.window)
        check_positive_int("pcw.n_windows", self.n_windows)

    def _pos(self, p):
        ctx = self.window * self.n_windows
        return torch.where(p < ctx, torch.remainder(p, self.window), p - ctx + self.window)

    def branches(self) -> list[Branch]:
        return [Branch(q_rot=self._pos, k_rot=self._pos)]

    def allowed(self, qp, kp):
        ctx = self.window * self.n_windows
        same = torch.div(qp, self.window, rounding_mode="floor") == torch.div(kp, self.window,
                                                                               rounding_mode="floor")
        return (qp >= ctx) | same

    def relative(self, qp, kp):
        return (self._pos(qp) - self._pos(kp)).double()


@dataclass(frozen=True)
class String(Remap):
    """STRING (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?", arXiv 2410.18745;
    HKUNLP/STRING ``string_for_llama.py``): the well-trained small positions overwrite the under-trained large
    ones *inside* the trained window. With ``shift`` S (the authors' ``shifted_offset``, 0.25-0.4 L) and
    ``local`` W (``small_local_value``, 128):

        relative position = d            if d < S   (the authors' diagonal piece: flash-attn window S)
                            d - S + W    if d >= S  (their shifted piece: query at qp - S + W, key at kp)

    so no relative position exceeds ``N - 1 - S + W``. ``attention_factor`` a multiplies the logits by a^2
    (the original multiplies cos and sin of q and k by ``0.1 ln 2 + 1``, as YaRN at s = 2, a hidden scale its
    README does not mention; ``attention_factor=1`` is the bare formula).

    Where the original differs (documented, not reproduced): its prefill (``string_flash_forward``) runs the
    diagonal piece with flash-attn ``window_size=[S, 0]``, which admits d <= S, and the shifted piece with
    d >= S, so the key at d = S enters the softmax twice (at distance S and at W); its decode path
    (``do_flash_decoding``, keys ``kv_len - S .. kv_len - 1`` and ``0 .. kv_len - S - 1``) counts it once,
    as posenc does everywhere. So the original's prefill and decode disagree at that one key per query."""

    shift: int = 512
    local: int = 128
    attention_factor: float = 1.0
    name = "string"
    remaps_distance = True

    def __post_init__(self):
        check_positive_int("string.shift", self.shift)
        check_positive_int("string.local", self.local, minimum=0)
        if self.local > self.shift:
            raise ValueError(f"string.shift must be >= local ({self.local}), got {self.shift}")
        check_finite("string.attention_factor", self.attention_factor, minimum=0.0, strict_min=True)

    def branches(self) -> list[Branch]:
        s, w = self.shift, self.local
        return [
            Branch(region=near_band(s), kind="near", window=s),
            # queries with a far key have qp >= S, so the clamp (for the others) changes no score
            Branch(region=far_band(s), q_rot=lambda qp: (qp - (s - w)).clamp(min=0), kind="far", window=s),
        ]

    def relative(self, qp, kp):
        d = (qp - kp).double()
        return torch.where(d < self.shift, d, d - self.shift + self.local)

    @property
    def logit_scale(self) -> float:
        """``attention_factor ** 2``: the original scales cos and sin of both q and k."""
        return float(self.attention_factor) ** 2


def _chunk_of(c: int) -> Elementwise:
    return lambda p: torch.div(p, c, rounding_mode="floor")


@dataclass(frozen=True)
class DualChunk(Remap):
    """Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; HKUNLP/ChunkLlama, and Qwen2.5-1M with
    YaRN). With ``chunk`` s, ``local`` window l, positions are cut into chunks of ``c = s - l`` tokens
    and every key is rotated at ``kp mod c``. A query at qp (chunk ``i = qp // c``) sees

    - its own chunk (intra, ``kp // c == i``) from position ``qp mod c``: the true distance d;
    - the previous chunk (successive, ``kp // c == i - 1``) from ``min(qp mod c + c, s)``: the true
      distance while it is at most s, the query capped at s beyond (the l most recent keys of the
      previous chunk keep exact distances, which is what ``local`` buys);
    - every earlier chunk (inter, ``kp // c <= i - 2``) from the constant ``min(2c - 1, s)``.

    So no relative position exceeds s. Branch order and regions are exactly those of ChunkLlama's
    ``chunkllama_attn_replace.py`` (its ``q_t``, ``qc_t`` and ``qc_t[c - 1]`` tables; vLLM's
    ``DualChunkRotaryEmbedding`` builds the same three). The pieces merge by log-sum-exp like the
    reference's ``merge_attn_outputs``: a softmax over the union of the three regions."""

    chunk: int = 3072
    local: int = 256
    name = "dca"
    remaps_distance = True

    def __post_init__(self):
        check_positive_int("dca.chunk", self.chunk)
        check_positive_int("dca.local", self.local, minimum=0)
        if self.local >= self.chunk:
            raise ValueError(f"dca.chunk must be > local ({self.local}), got {self.chunk}")

    @property
    def chunk_len(self) -> int:
        """``c = chunk - local``: the length of the chunks positions are cut into."""
        return self.chunk - self.local

    def _rot(self, p):
        """(chunk index, intra, successive, inter) rotation positions of ``p``."""
        c, s = self.chunk_len, self.chunk
        r = torch.remainder(p, c)
        return _chunk_of(c)(p), r, (r + c).clamp(max=s), torch.full_like(p, min(2 * c - 1, s))

    def branches(self) -> list[Branch]:
        c, s = self.chunk_len, self.chunk
        ch = _chunk_of(c)
        mod = lambda p: torch.remainder(p, c)  # noqa: E731
        return [
            Branch(region=lambda qp, kp: ch(kp) == ch(qp), q_rot=mod, k_rot=mod, kind="same_chunk", window=c),
            Branch(region=lambda qp, kp: ch(kp) == ch(qp) - 1, q_rot=lambda qp: (mod(qp) + c).clamp(max=s),
                   k_rot=mod, kind="previous_chunk", window=c),
            Branch(region=lambda qp, kp: ch(kp) < ch(qp) - 1, q_rot=lambda qp: torch.full_like(qp, min(2 * c - 1, s)),
                   k_rot=mod, kind="earlier_chunks", window=c),
        ]

    def relative(self, qp, kp):
        qc, q_intra, q_succ, q_inter = self._rot(qp)
        kc, k_r = _chunk_of(self.chunk_len)(kp), torch.remainder(kp, self.chunk_len)
        q = torch.where(kc == qc, q_intra, torch.where(kc == qc - 1, q_succ, q_inter))
        return (q - k_r).double()


REMAPS: dict[str, type[Remap]] = {
    "none": NoRemap,
    "rerope": ReRoPE,
    "leaky_rerope": LeakyReRoPE,
    "selfextend": SelfExtend,
    "ceiling": DistanceCeiling,
    "streaming": StreamingReindex,
    "pcw": ParallelContextWindows,
    "dca": DualChunk,
    "string": String,
    "retrieval": BlockRetrieval,
    "duo": DuoAttention,
}


def build_remap(kind: str | None, **params) -> Remap:
    kind = kind or "none"
    if kind not in REMAPS:
        raise ValueError(f"remap kind must be one of {sorted(REMAPS)}, got {kind!r}")
    try:
        return REMAPS[kind](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for remap {kind!r}: {exc}") from None


def logn_scale(qp: torch.Tensor, train_len: int) -> torch.Tensor:
    """log-n attention scaling (Su 2021, kexue.fm/archives/8823; as used in bojone/rerope and
    SelfExtend): queries multiplied by max(1, log(qp + 1) / log(train_len)). Position qp is
    0-based, so the factor is 1 for every query inside the trained length."""
    return (torch.log((qp + 1).double()) / torch.log(torch.tensor(float(train_len), dtype=torch.float64))
            ).clamp(min=1.0)


@dataclass(frozen=True)
class Llama4Temperature:
    """Llama 4's attention temperature tuning of its NoPE layers (transformers ``Llama4TextAttention``,
    ``attn_temperature_tuning``; after Scalable-Softmax, Nakanishi, arXiv 2501.19399): queries multiplied by

        1 + attn_scale * log(floor((qp + 1) / floor_scale) + 1)

    (qp 0-based), so the factor is 1 for the first ``floor_scale - 1`` positions and grows like
    log(n) by steps of ``floor_scale`` after them. Llama 4 uses ``attn_scale=0.1``, ``floor_scale=8192``."""

    attn_scale: float = 0.1
    floor_scale: float = 8192.0

    def __post_init__(self):
        check_finite("temperature.attn_scale", self.attn_scale, minimum=0.0)
        check_finite("temperature.floor_scale", self.floor_scale, minimum=0.0, strict_min=True)

    def scale(self, qp: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:  # noqa: ARG002 - per query
        """float64 factor per query position (same shape as ``qp``)."""
        steps = torch.floor((qp.double() + 1.0) / float(self.floor_scale))
        return 1.0 + float(self.attn_scale) * torch.log1p(steps)


LENGTHS = ("query", "sequence")


@dataclass(frozen=True)
class LengthTemperature:
    """A logit temperature that grows with the length n once it passes the trained length L:

        logits x m(n) ** power,   m(n) = 1 + coef ln(n / L) for n > L, else 1

    - ChunkLlama's (An et al. 2024, arXiv 2402.17463; HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``,
      ``get_mscale``): ``coef = 0.05``, ``power = 2`` (its rotary class multiplies cos and sin of q *and* k by
      m, so the logits get m^2);
    - Qwen2.5-1M's (Yang et al. 2025, arXiv 2501.15383, with DCA): ``coef = 0.1``, ``power = 1`` (the query).

    ``length`` says what n is. ``"query"`` (default): n = qp + 1 for the query at qp, so a full forward equals
    cached decoding (as posenc's dynamic schedules). ``"sequence"``: n = the largest key position of the
    call + 1 for every query, ChunkLlama's prefill (its rotary cache is rebuilt with ``seq_len = kv_seq_len``
    of the call). Both agree on the last query of a prefill and on every decode step's query. Where the
    originals depart from both, and why they cannot be reproduced by a function of positions: ChunkLlama
    rotates keys *before* caching them, with the m of the call that wrote them, so during its decoding a
    logit is ``m(n_write(k)) m(n_now)`` (its prefill and decode disagree, which the issue that asked for this
    measured); vLLM's Qwen2.5-1M kernel (``dual_chunk_flash_attn.py``) multiplies the *keys* by m of the
    length when they were written (``orig_seq_lens`` at prefill, the current length at each decode step)."""

    coef: float = 0.05
    power: float = 2.0
    train_len: int = 4096
    length: str = "query"

    def __post_init__(self):
        check_finite("temperature.coef", self.coef, minimum=0.0)
        check_finite("temperature.power", self.power, minimum=0.0)
        check_positive_int("temperature.train_len", self.train_len)
        if self.length not in LENGTHS:
            raise ValueError(f"temperature.length must be one of {LENGTHS}, got {self.length!r}")

    def scale(self, qp: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        """float64 factor per query position; ``seq_len`` (the call's length) is read for ``"sequence"``."""
        if self.length == "sequence":
            if seq_len is None:
                raise ValueError("temperature.length='sequence' needs the call's key positions")
            n = torch.full_like(qp, seq_len, dtype=torch.float64)
        else:
            n = qp.double() + 1.0
        m = 1.0 + float(self.coef) * torch.log(n / float(self.train_len))
        return torch.where(n > self.train_len, m, torch.ones_like(m)) ** float(self.power)


# query-temperature kind -> class (PositionScheme.temperature)
TEMPERATURES: dict[str, type] = {"llama4": Llama4Temperature, "log_length": LengthTemperature}


def build_temperature(kind: str, **params):
    if kind not in TEMPERATURES:
        raise ValueError(f"temperature kind must be one of {sorted(TEMPERATURES)}, got {kind!r}")
    try:
        return TEMPERATURES[kind](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for temperature {kind!r}: {exc}") from None
