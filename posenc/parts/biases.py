"""Score-bias part: a per-head function of query/key positions ADDED to the attention logits.

Every bias is an ``nn.Module`` subclass of :class:`ScoreBias`. Its ``score(h, qp, kp)`` is an
*elementwise* torch function of the head index and the query/key positions (LongTensors that
broadcast), so the same code serves

- the reference path: ``forward(q_pos [B,Nq], k_pos [B,Nk]) -> [B,H,Nq,Nk]`` calls ``score`` on the
  grids ``h [1,H,1,1]``, ``qp [B,1,Nq,1]``, ``kp [B,1,1,Nk]``;
- FlexAttention's ``score_mod``: ``score + bias.score(h, q_pos[b, q_idx], k_pos[b, kv_idx])`` on 0-d
  tensors.

So ``score`` uses only arithmetic, comparisons, ``torch.where``, ``clamp``, ``log``/``log1p``/``cos``,
dtype casts and indexing a captured parameter/buffer with the tensor ``h`` (no Python control flow
on tensor values, no ``.item()``, no in-place ops). It returns float32. The value is added to the
logit *after* the 1/sqrt(head_dim) scaling of q.k (as in BLOOM/fairseq ALiBi, KERPLE's gpt-neox code
and Sandwich); T5 itself has no 1/sqrt(d) and folds it into the initialisation.

Sign/distance convention: ``qp - kp`` is the distance from the query back to the key (>= 0 under a
causal mask). T5 buckets take ``kp - qp`` (memory - query), as in the T5 code.

Papers:
- ALiBi: Press et al., "Train Short, Test Long" (arXiv 2108.12409).
- KERPLE: Chi et al., "Kernelized Relative Positional Embedding for Length Extrapolation"
  (arXiv 2205.09921), reference code github.com/chijames/KERPLE (``ParallelKerplePower/Log``).
- T5 relative buckets: Raffel et al. (arXiv 1910.10683), Mesh-TF/HF ``_relative_position_bucket``.
- Sandwich: Chi et al., "Dissecting Transformer Length Extrapolation via the Lens of Receptive Field
  Analysis" (arXiv 2212.10356); per-head scaling as in NeMo's ``SandwichRelativePositionEmbedding``.
- FIRE: Li et al., "Functional Interpolation for Relative Positions Improves Long Context Transformers"
  (arXiv 2310.04418): a learned MLP of the progressively normalised log distance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from posenc._util import as_positions, check_finite, check_positive_int

__all__ = [
    "BIASES",
    "ALiBiBias",
    "FireBias",
    "KerpleLogBias",
    "KerplePowerBias",
    "SandwichBias",
    "ScoreBias",
    "T5Bias",
    "alibi_slopes",
    "build_bias",
    "t5_relative_bucket",
]


# ---------------------------------------------------------------------------------------- functions
def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi head slopes, float32 ``[num_heads]`` (Press et al., arXiv 2108.12409).

    For ``n`` a power of two the slopes are the geometric sequence ``2^(-8/n * k)``, k = 1..n.
    Otherwise (rule of the ALiBi repo, also BLOOM's ``build_alibi_tensor``): take the closest power of
    two ``n < num_heads``, its ``n`` slopes, then append every other slope of ``2n``
    (``2^(-4/n * k)`` for k = 1, 3, 5, ...) until there are ``num_heads``.

    Computed in float64 as exact powers of two and rounded once to float32 (BLOOM raises a float32
    base to integer powers, so the two differ by a few ulp at most).
    """
    num_heads = check_positive_int("num_heads", num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    k = torch.arange(1, closest + 1, dtype=torch.float64)
    slopes = torch.exp2(-8.0 / closest * k)  # [closest]
    if closest != num_heads:
        extra = torch.arange(1, 2 * (num_heads - closest), 2, dtype=torch.float64)
        slopes = torch.cat([slopes, torch.exp2(-8.0 / (2 * closest) * extra)])  # [num_heads]
    return slopes.to(torch.float32)


def _check_buckets(num_buckets, max_distance, bidirectional) -> tuple[int, int]:
    if not isinstance(bidirectional, bool):
        raise ValueError(f"bidirectional must be a bool, got {bidirectional!r}")
    minimum = 4 if bidirectional else 2  # at least one exact bucket per direction
    num_buckets = check_positive_int("num_buckets", num_buckets, minimum=minimum)
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = check_positive_int("max_distance", max_distance, minimum=max_exact + 1)
    return num_buckets, max_distance


def t5_relative_bucket(relative_position, bidirectional: bool = True, num_buckets: int = 32,
                       max_distance: int = 128) -> torch.Tensor:
    """T5 relative-position bucket, LongTensor of the shape of ``relative_position``.

    ``relative_position = key position - query position`` (memory - query, as in T5; Raffel et al.,
    arXiv 1910.10683). With ``bidirectional`` half of the buckets hold keys after the query
    (``relative_position > 0``, offset ``num_buckets // 2``). Within a direction, with ``n = |distance|``
    (unidirectional: ``n = max(-relative_position, 0)``, so future keys share bucket 0) and
    ``B`` buckets, ``max_exact = B // 2``::

        bucket(n) = n                                                        if n < max_exact
                  = min(max_exact + int(log(n / max_exact) / log(max_distance / max_exact)
                                        * (B - max_exact)), B - 1)           otherwise

    Same float32 arithmetic as HF ``T5Attention._relative_position_bucket`` (so bucket boundaries agree
    bit for bit); ``n`` is clamped to >= 1 inside the log so the unused branch never sees log(0).
    Elementwise: works on 0-d tensors inside a FlexAttention ``score_mod``.
    """
    num_buckets, max_distance = _check_buckets(num_buckets, max_distance, bidirectional)
    relative_position = torch.as_tensor(relative_position)
    if relative_position.is_floating_point():
        raise ValueError("relative_position must be an integer tensor")
    relative_position = relative_position.long()
    if bidirectional:
        num_buckets //= 2
        offset = (relative_position > 0).to(torch.long) * num_buckets
        n = relative_position.abs()
    else:
        offset = torch.zeros_like(relative_position)
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # float32, same operation order as Mesh-TF / HF
    large = max_exact + (
        torch.log(n.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return offset + torch.where(is_small, n, large)


def _straight_through_clamp(x: torch.Tensor, lo: float, hi: float | None = None) -> torch.Tensor:
    """Value ``clamp(x, lo, hi)``; gradient as if no clamp (projected-gradient, like KERPLE's in-place
    ``param.data.clamp_`` in forward, but without an in-place op)."""
    return x.clamp(min=lo, max=hi) + (x - x.detach())  # x - x.detach() is exactly 0


# ---------------------------------------------------------------------------------------- modules
class ScoreBias(nn.Module):
    """Base class: ``score(h, qp, kp)`` elementwise, ``forward(q_pos, k_pos) -> [B,H,Nq,Nk]``.

    Subclasses set ``num_heads`` and implement ``score``. ``project_()`` (no-op here) restores
    parameter constraints in place; call it after an optimizer step when a subclass has any.
    """

    num_heads: int
    #: True when ``score`` depends on ``qp - kp`` only (a Toeplitz bias); the engine then runs it on the
    #: fused CPU flash kernel through :func:`posenc.engine.toeplitz.toeplitz_attention` in O(N) memory.
    translation_invariant: bool = False

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)

    def score(self, h: torch.Tensor, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def distance_profile(self, n: int, device=None) -> torch.Tensor:
        """``[H, n]`` float32: the bias at distances ``0..n-1`` (query after key). Only meaningful for
        translation-invariant biases, where it determines the whole (causal) bias."""
        if not self.translation_invariant:
            raise ValueError(f"{type(self).__name__} is not translation invariant; it has no distance profile")
        if device is None:
            state = next(iter(self.parameters()), None)
            state = next(iter(self.buffers()), None) if state is None else state
            device = state.device if state is not None else torch.device("cpu")
        h = torch.arange(self.num_heads, device=device)[:, None]  # [H,1]
        d = torch.arange(n, device=device)[None]  # [1,n]
        return self.score(h, d, torch.zeros_like(d)).expand(self.num_heads, n).to(torch.float32)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Materialise the bias: ``[B,H,Nq,Nk]`` float32. Positions ``[B,N]`` or ``[N]``."""
        q_pos = as_positions(q_pos)
        k_pos = as_positions(k_pos)
        batch = max(q_pos.shape[0], k_pos.shape[0])
        q_pos = as_positions(q_pos, batch)
        k_pos = as_positions(k_pos, batch)
        state = next(iter(self.parameters()), None)
        state = next(iter(self.buffers()), q_pos) if state is None else state
        device = state.device  # compute where the bias's parameters/buffers live
        h = torch.arange(self.num_heads, device=device).view(1, -1, 1, 1)  # [1,H,1,1]
        qp = q_pos.to(device)[:, None, :, None]  # [B,1,Nq,1]
        kp = k_pos.to(device)[:, None, None, :]  # [B,1,1,Nk]
        out = self.score(h, qp, kp)
        return out.expand(batch, self.num_heads, qp.shape[2], kp.shape[3])  # [B,H,Nq,Nk]

    @torch.no_grad()
    def project_(self) -> None:
        """Clamp constrained parameters back into their range in place (no-op by default)."""

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


class ALiBiBias(ScoreBias):
    """ALiBi (Press et al., arXiv 2108.12409): ``bias = -slope_h * |qp - kp|``.

    Slopes from :func:`alibi_slopes` (fixed buffer, not learned). The paper's causal bias is
    ``-slope * (qp - kp)`` for ``kp <= qp``; we take the absolute distance so that a key after the
    query (only reachable without a causal mask) is also penalised (``-slope * (kp - qp)``), the
    symmetric form used for encoders. Under the causal mask both are identical. BLOOM adds
    ``+slope * kp`` instead, which equals this up to a per-row constant (softmax-invariant) when the
    query sees keys 0..qp. The bias is not scaled by 1/sqrt(d) (as BLOOM and fairseq add it).
    """

    translation_invariant = True

    def __init__(self, num_heads: int):
        super().__init__(num_heads)
        self.register_buffer("slopes", alibi_slopes(self.num_heads), persistent=False)

    def score(self, h, qp, kp):
        return -self.slopes[h] * (qp - kp).abs().to(torch.float32)


class KerplePowerBias(ScoreBias):
    """KERPLE power kernel (Chi et al., arXiv 2205.09921): ``bias = -r1_h * |qp - kp|^r2_h``,
    ``r1 > 0``, ``0 < r2 <= 2``, both learned per head.

    As in the paper's code (``ParallelKerplePower``, parameters ``bias_a`` = r1, ``bias_p`` = r2):
    initialised ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``, positivity by clamping to ``r1 >= eps``,
    ``eps <= r2 <= 2`` with ``eps = 0.01``. The paper clamps ``param.data`` in place at every forward;
    here ``score`` uses the clamped value with a straight-through gradient (no in-place op, so it runs
    in ``score_mod``) and :meth:`project_` does the in-place clamp (call it after optimizer steps).
    ``r2 = 1`` with ``r1 = slope`` is ALiBi.
    """

    translation_invariant = True

    eps = 1e-2

    def __init__(self, num_heads: int):
        super().__init__(num_heads)
        self.r1 = nn.Parameter(torch.rand(self.num_heads))  # bias_a: U(0,1)
        self.r2 = nn.Parameter(torch.rand(self.num_heads) * 2)  # bias_p: U(0,2)

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The clamped ``(r1, r2)`` actually used, ``[H]`` each."""
        return (_straight_through_clamp(self.r1, self.eps),
                _straight_through_clamp(self.r2, self.eps, 2.0))

    def score(self, h, qp, kp):
        r1, r2 = self.coefficients()
        dist = (qp - kp).abs().to(torch.float32)
        # d/dr2 of 0**r2 is 0 in torch (pow backward special-cases base 0), so distance 0 is safe
        return -r1[h] * torch.pow(dist, r2[h])

    @torch.no_grad()
    def project_(self) -> None:
        self.r1.clamp_(min=self.eps)
        self.r2.clamp_(min=self.eps, max=2.0)


class KerpleLogBias(ScoreBias):
    """KERPLE logarithmic kernel (Chi et al., arXiv 2205.09921):
    ``bias = -r1_h * log(1 + r2_h * |qp - kp|)``, ``r1, r2 > 0`` learned per head.

    As in the paper's code (``ParallelKerpleLog``: ``-p*log(1+a*|m-n|)``, p = r1, a = r2): initialised
    ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``, positivity by clamping to ``>= eps = 0.01`` (straight-through
    in ``score``; :meth:`project_` clamps in place like the paper's forward).
    """

    translation_invariant = True

    eps = 1e-2

    def __init__(self, num_heads: int):
        super().__init__(num_heads)
        self.r1 = nn.Parameter(torch.rand(self.num_heads) * 2)  # bias_p: U(0,2)
        self.r2 = nn.Parameter(torch.rand(self.num_heads))  # bias_a: U(0,1)

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The clamped ``(r1, r2)`` actually used, ``[H]`` each."""
        return _straight_through_clamp(self.r1, self.eps), _straight_through_clamp(self.r2, self.eps)

    def score(self, h, qp, kp):
        r1, r2 = self.coefficients()
        dist = (qp - kp).abs().to(torch.float32)
        return -r1[h] * torch.log1p(r2[h] * dist)

    @torch.no_grad()
    def project_(self) -> None:
        self.r1.clamp_(min=self.eps)
        self.r2.clamp_(min=self.eps)


class T5Bias(ScoreBias):
    """T5 relative position bias (Raffel et al., arXiv 1910.10683): a learned table
    ``weight [num_buckets, num_heads]``; ``bias = weight[t5_relative_bucket(kp - qp), h]``.

    ``bidirectional=False`` (decoder / causal LM, the default here): every key after the query shares
    bucket 0 with distance 0. Initialised ``N(0, init_std^2)`` (HF T5 uses std = factor * d_model^-0.5;
    T5 does not scale q.k by 1/sqrt(d), we add the bias after that scaling like the other biases).
    """

    translation_invariant = True

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = False, init_std: float = 0.02):
        super().__init__(num_heads)
        self.num_buckets, self.max_distance = _check_buckets(num_buckets, max_distance, bidirectional)
        self.bidirectional = bidirectional
        init_std = check_finite("init_std", init_std, minimum=0.0)
        self.weight = nn.Parameter(torch.randn(self.num_buckets, self.num_heads) * init_std)

    def score(self, h, qp, kp):
        bucket = t5_relative_bucket(kp - qp, self.bidirectional, self.num_buckets, self.max_distance)
        return self.weight[bucket, h].to(torch.float32)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")


class SandwichBias(ScoreBias):
    """Sandwich (Chi et al., arXiv 2212.10356): the logit gets ``lambda * p_m . p_n`` with sinusoidal
    ``p`` of ``dim = d'`` dimensions. Since ``sin a sin b + cos a cos b = cos(a - b)``::

        bias = lam_h * ( sum_{i=1}^{d'/2} cos((qp - kp) / base^(2i/d')) - d'/2 )

    Subtracting ``d'/2`` makes the bias 0 at distance 0 and <= 0 elsewhere (a smooth ALiBi-like
    decay). Frequencies start at ``i = 1`` (as in the paper's sum and NeMo's implementation, unlike
    the Vaswani table's ``i = 0``). ``lam=None`` uses the per-head scaling of the reference code,
    ``lam_h = H / (8 h)`` for heads ``h = 1..H`` (NeMo divides by ``8h/H``, mimicking ALiBi's spread of
    slopes); a float gives one lambda for all heads (the paper's hyper-parameter form), a
    sequence one per head. Angles in float64, result float32; the sum is unrolled over the d'/2
    Python-float frequencies so ``score`` stays pointwise (no reduction) inside ``score_mod``.
    """

    translation_invariant = True

    def __init__(self, num_heads: int, dim: int = 128, base: float = 10000.0,
                 lam: float | Sequence[float] | None = None):
        super().__init__(num_heads)
        dim = check_positive_int("dim", dim, minimum=2)
        if dim % 2:
            raise ValueError(f"dim must be even (pairs of sin/cos), got {dim}")
        self.dim = dim
        self.base = check_finite("base", base, minimum=1.0, strict_min=True)
        i = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
        self.frequencies = [float(f) for f in self.base ** (-2.0 * i / dim)]  # d'/2 python floats
        if lam is None:
            heads = torch.arange(1, self.num_heads + 1, dtype=torch.float64)
            lam_t = self.num_heads / (8.0 * heads)
        elif isinstance(lam, Sequence) and not isinstance(lam, str):
            if len(lam) != self.num_heads:
                raise ValueError(f"lam must have num_heads={self.num_heads} entries, got {len(lam)}")
            lam_t = torch.tensor([check_finite("lam", v, minimum=0.0, strict_min=True) for v in lam],
                                 dtype=torch.float64)
        else:
            lam_t = torch.full((self.num_heads,), check_finite("lam", lam, minimum=0.0, strict_min=True),
                               dtype=torch.float64)
        self.register_buffer("lam", lam_t.to(torch.float32), persistent=False)

    def score(self, h, qp, kp):
        dist = (qp - kp).to(torch.float64)
        total = torch.zeros_like(dist)
        for w in self.frequencies:  # python loop over constants: pointwise graph, no reduction
            total = total + torch.cos(dist * w)
        return self.lam[h] * (total - self.dim / 2).to(torch.float32)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dim={self.dim}, base={self.base}"


class FireBias(ScoreBias):
    """FIRE (Li et al., arXiv 2310.04418, eq. 5-7): with ``i = qp`` and ``j = kp`` (0-based positions)::

        psi(x) = log(c x + 1)
        bias_h(i, j) = f_theta(psi(|i - j|) / psi(max(L_thr, i)))_h

    ``f_theta: R -> R^H`` is an MLP with one hidden ReLU layer of ``hidden`` units, one output per head:
    ``f(x)_h = b2_h + sum_k w2_hk relu(w1_k x + b1_k)``. ``c > 0`` and the threshold ``L_thr >= 1`` are
    learned scalars: the normaliser ``psi(max(L_thr, i))`` maps every query's distances into [0, 1]
    beyond ``L_thr`` (progressive interpolation), while shorter contexts keep the fixed scale
    ``psi(L_thr)``. The paper's causal bias reads ``i - j >= 0``; a key after the query (only without a
    causal mask) uses the same distance ``|i - j|``.

    Defaults (ours, all configurable): 32 hidden units, ``c = 0.1``; the threshold starts at the training
    length (the preset passes ``threshold = train_len``; 512 otherwise). MLP weights start like ``nn.Linear``
    (uniform +-1/sqrt(fan_in)); they are plain parameters, not ``nn.Linear`` modules, so a model's own
    re-initialisation of its linear layers leaves them alone. ``c`` and ``L_thr`` are kept in range by a
    straight-through clamp (``c >= 1e-4``, ``L_thr >= 1``; :meth:`project_` clamps in place).

    Not translation invariant (the normaliser depends on ``i``): runs on the materialised backends
    (``reference``, ``sdpa``, ``blockwise``) and compiled ``flex`` at inference. ``score`` unrolls the
    hidden units (a Python loop over constants) so it stays elementwise inside a flex ``score_mod``.
    """

    c_min = 1e-4

    def __init__(self, num_heads: int, hidden: int = 32, c: float = 0.1, threshold: float = 512.0):
        super().__init__(num_heads)
        self.hidden = check_positive_int("fire.hidden", hidden)
        self.c = nn.Parameter(torch.tensor(check_finite("fire.c", c, minimum=0.0, strict_min=True)))
        self.threshold = nn.Parameter(torch.tensor(check_finite("fire.threshold", threshold, minimum=1.0)))
        bound = 1.0 / math.sqrt(self.hidden)
        self.w1 = nn.Parameter(torch.empty(self.hidden).uniform_(-1.0, 1.0))  # fan_in 1
        self.b1 = nn.Parameter(torch.empty(self.hidden).uniform_(-1.0, 1.0))
        self.w2 = nn.Parameter(torch.empty(self.num_heads, self.hidden).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.empty(self.num_heads).uniform_(-bound, bound))

    def normalised_distance(self, qp, kp) -> torch.Tensor:
        """``psi(|i - j|) / psi(max(L_thr, i))``, float32, the MLP's input."""
        c = _straight_through_clamp(self.c, self.c_min)
        thr = _straight_through_clamp(self.threshold, 1.0)
        dist = (qp - kp).abs().to(torch.float32)
        return torch.log1p(c * dist) / torch.log1p(c * torch.maximum(qp.to(torch.float32), thr))

    def score(self, h, qp, kp):
        x = self.normalised_distance(qp, kp)
        out = self.b2[h]
        for u in range(self.hidden):  # python loop over constants: pointwise graph, no reduction
            out = out + self.w2[h, u] * torch.relu(self.w1[u] * x + self.b1[u])
        return out.to(torch.float32)

    @torch.no_grad()
    def project_(self) -> None:
        self.c.clamp_(min=self.c_min)
        self.threshold.clamp_(min=1.0)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, hidden={self.hidden}"


BIASES: dict[str, type[ScoreBias]] = {
    "alibi": ALiBiBias,
    "kerple_power": KerplePowerBias,
    "kerple_log": KerpleLogBias,
    "t5": T5Bias,
    "sandwich": SandwichBias,
    "fire": FireBias,
}


def build_bias(name: str, num_heads: int, **kwargs) -> ScoreBias:
    """Construct a registered bias by name: ``BIASES[name](num_heads, **kwargs)``."""
    if name not in BIASES:
        raise ValueError(f"bias must be one of {sorted(BIASES)}, got {name!r}")
    return BIASES[name](num_heads, **kwargs)
