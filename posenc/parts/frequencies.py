"""RoPE frequency schedules: one pure function per ``rope_type``, in the registry ``ROPE_SCALINGS``.

Every schedule maps ``(head_dim, rotary_dim, base, params, seq_len)`` to a :class:`RopeFrequencies`:
the inverse frequencies ``theta_i`` (RoPE rotates pair ``i`` of a vector at position ``m`` by
``m * theta_i``) and the attention scale that multiplies cos and sin (Hugging Face convention, so
``q . k`` is scaled by its square).

``scaling`` is a dict in Hugging Face's ``rope_scaling`` / ``rope_parameters`` convention (plus posenc's
``resonance: true``, :mod:`posenc.parts.resonance`, on any rope_type), so a ``config.json`` block works::

    rope_frequencies(128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})

Conventions (all schedules):

- ``rotary_dim = int(head_dim * partial_rotary_factor)``; ``inv_freq`` has ``rotary_dim // 2``
  entries (``RopeFrequencies.rotary_dim`` gives it back). ``proportional`` is the one exception:
  it rotates the whole head and returns ``head_dim // 2`` entries, the last ones zero, as HF does.
- ``rope_theta`` / ``partial_rotary_factor`` inside ``scaling`` override the function arguments.
- Computed in float64, returned as float32.
- Where HF only warns about a bad config (factor < 1, missing keys, unknown keys, high <= low
  frequency factor, a NaN) we raise ``ValueError`` naming the key and its allowed range.
- ``seq_len`` is the number of positions the frequencies must serve (HF: ``max(position_ids) + 1``).
  Schedules whose result depends on it (``is_dynamic``) refuse ``seq_len=None``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Real

import torch

from posenc._util import check_finite, check_positive_int
from posenc.parts.resonance import resonance

__all__ = ["ROPE_SCALINGS", "RopeFrequencies", "default_inv_freq", "is_dynamic", "rope_frequencies", "scaling_factor",
           "validate_rope_scaling", "yarn_correction_range"]


@dataclass(frozen=True)
class RopeFrequencies:
    """Inverse frequencies ``inv_freq`` (float32 ``[rotary_dim // 2]``) and ``attention_scale``.

    ``attention_scale`` multiplies cos and sin (HF's ``attention_scaling``), so the logits q.k are
    multiplied by ``attention_scale ** 2``; it is 1.0 except for YaRN and LongRoPE.
    """

    inv_freq: torch.Tensor
    attention_scale: float = 1.0

    @property
    def rotary_dim(self) -> int:
        """Number of head dims rotated with these frequencies (``2 * len(inv_freq)``)."""
        return 2 * int(self.inv_freq.numel())


# fn(head_dim, rotary_dim, base, params, seq_len): params validated by _parse, base already rope_theta
Schedule = Callable[[int, int, float, dict, "int | None"], RopeFrequencies]
ROPE_SCALINGS: dict[str, Schedule] = {}
_KEYS: dict[str, frozenset[str]] = {}  # keys each rope_type reads (others are refused)
_DYNAMIC: set[str] = set()  # rope types whose result depends on seq_len

# Keys every rope_type accepts. mrope_* only choose which position axis drives which frequency band
# (Qwen2-VL), so they do not change inv_freq.
_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor",
                          "max_position_embeddings", "original_max_position_embeddings",
                          "mrope_section", "mrope_interleaved", "resonance"})
_LENGTH_KEYS = ("original_max_position_embeddings", "max_position_embeddings")


def _register(name: str, keys: tuple[str, ...] = (), dynamic: bool = False):
    def wrap(fn: Schedule) -> Schedule:
        ROPE_SCALINGS[name] = fn
        _KEYS[name] = _COMMON_KEYS | frozenset(keys)
        if dynamic:
            _DYNAMIC.add(name)
        return fn
    return wrap


# ----------------------------------------------------------------------------------------------------------
# shared pieces (float64)

def _exponents(dim: int, denominator: int | None = None) -> torch.Tensor:
    """``2i / denominator`` for i = 0 .. dim/2 - 1, float64 ``[dim // 2]``."""
    return torch.arange(0, dim, 2, dtype=torch.float64) / (denominator or dim)


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    """``base ** (-2i / dim)``, float64 ``[dim // 2]``."""
    return 1.0 / (base ** _exponents(dim))


def _ntk_base(base: float, scale: float, dim: int) -> float:
    """NTK-aware base ``base * scale ** (d/(d-2))``: divides the lowest frequency by exactly ``scale``."""
    if dim < 4:
        raise ValueError(f"rotary_dim must be >= 4 for NTK-style base scaling (exponent d/(d-2)), got {dim}")
    log_base = math.log(base) + math.log(scale) * dim / (dim - 2)  # in logs: scale=1e300 must not overflow
    new_base = math.exp(log_base) if log_base < 700 else math.inf
    if not math.isfinite(new_base):
        raise ValueError(f"NTK-scaled base {base} * {scale} ** (d/(d-2)) overflows; use a smaller base/scale")
    return new_base


def _factor(params: dict, rope_type: str) -> float:
    if "factor" not in params:
        raise ValueError(f"scaling['factor'] is required for rope_type {rope_type!r} (a finite number >= 1)")
    return params["factor"]


def _trained_len(params: dict, rope_type: str) -> int:
    """The pretraining length L: ``original_max_position_embeddings``, else ``max_position_embeddings``."""
    for key in _LENGTH_KEYS:
        if key in params:
            return params[key]
    raise ValueError(f"scaling['original_max_position_embeddings'] (an integer >= 1, the trained length) "
                     f"is required for rope_type {rope_type!r}")


def _plain(dim: int, base: float) -> RopeFrequencies:
    return RopeFrequencies(default_inv_freq(dim, base), 1.0)


# ----------------------------------------------------------------------------------------------------------
# schedules

@_register("default")
def _default(head_dim, dim, base, params, seq_len):
    """Original RoPE: ``theta_i = base ** (-2i/d)`` (RoFormer, arXiv 2104.09864). Equals HF's default."""
    return _plain(dim, base)


@_register("linear", ("factor",))
def _linear(head_dim, dim, base, params, seq_len):
    """Position Interpolation: ``theta_i = base ** (-2i/d) / factor`` (arXiv 2306.15595). Equals HF linear.

    The seeds write the interpolation factor as ``lambda = L_train / L_test < 1`` multiplying
    positions; here ``factor = 1 / lambda >= 1`` divides the frequencies (HF convention, same angles).
    The seed's "reverse" use (反向外推) is a choice of ``factor``, not another formula: to map a test
    length into a range *shorter* than the trained one (trained 4k but well covered only to 3k,
    test 8k), pass ``factor = 8k / 3k`` rather than ``8k / 4k``.
    """
    return RopeFrequencies(default_inv_freq(dim, base) / _factor(params, "linear"), 1.0)


@_register("ntk", ("factor", "alpha"))
def _ntk(head_dim, dim, base, params, seq_len):
    """Fixed NTK-aware scaling: ``base' = base * s ** (d/(d-2))`` (bloc97, reddit r/LocalLLaMA 14lz7j5, 2023).

    ``s`` is ``factor`` (length ratio L_test / L_train; the lowest frequency is then divided by exactly
    ``factor``) or, instead, ``alpha``: the "NTK alpha" of bloc97's post, Qwen's ``ntk_alpha`` and
    CodeLlama-era scripts, used in the same formula (alpha is a tuning knob, usually set larger than
    the length ratio). Seed 001 writes ``(10000 * alpha) ** (-2n/d)``, multiplying the base by alpha
    without the ``d/(d-2)`` exponent; we follow bloc97/Qwen and seed 003 (``k = (L_test/L_train) **
    (d/(d-2))``). For a plain base multiplier use ``rope_type='base'``.
    """
    if "alpha" in params and "factor" in params:
        raise ValueError("scaling for rope_type 'ntk' takes either 'factor' or 'alpha', not both")
    scale = params["alpha"] if "alpha" in params else _factor(params, "ntk")
    return _plain(dim, _ntk_base(base, scale, dim))


@_register("ntk_mixed", ("factor", "b"))
def _ntk_mixed(head_dim, dim, base, params, seq_len):
    """NTK-RoPE-mixed: ``theta_i = base ** (-2i/d) * exp(-a (i+1) ** b)``, ``a = ln(factor) / (d/2) ** b``.

    Su Jianlin, kexue.fm/archives/9706; reference ``ntk_patch.py`` in github.com/bojone/rerope
    (``b = 0.75`` there, key ``b`` here). The lowest frequency (i = d/2 - 1) is divided by exactly
    ``factor``; the highest (i = 0) by only ``exp(a)``. Not in the seeds' formulas; not in HF.
    """
    factor = _factor(params, "ntk_mixed")
    b = params.get("b", 0.75)
    a = math.log(factor) / (dim / 2) ** b
    i1 = torch.arange(1, dim // 2 + 1, dtype=torch.float64)  # i + 1
    return RopeFrequencies(default_inv_freq(dim, base) * torch.exp(-a * i1 ** b), 1.0)


@_register("dynamic", ("factor",), dynamic=True)
def _dynamic(head_dim, dim, base, params, seq_len):
    """Dynamic NTK: ``base' = base * (factor * t / L - (factor - 1)) ** (d/(d-2))`` for t > L, else default.

    emozilla, reddit r/LocalLLaMA 14mrgpr (2023). Matches HF ``_compute_dynamic_ntk_parameters``
    with ``t = max(seq_len, L)``. HF takes L from ``config.max_position_embeddings``; we read
    ``original_max_position_embeddings`` first, then ``max_position_embeddings`` from ``scaling``.
    Inside the trained length the result is exactly the default schedule.
    """
    factor, L = _factor(params, "dynamic"), _trained_len(params, "dynamic")
    if seq_len <= L:
        return _plain(dim, base)
    return _plain(dim, _ntk_base(base, factor * seq_len / L - (factor - 1), dim))


def _qwen_alpha(seq_len: int, trained: int) -> int:
    """``max(1, 2 ** (ceil(log2(t / T)) + 1) - 1)``, computed exactly with integers.

    ``ceil(log2(t/T))`` is the smallest k with ``2**k >= t/T``, i.e. ``ceil(log2(ceil(t/T)))``.
    """
    if seq_len <= trained:
        return 1
    k = (-(-seq_len // trained) - 1).bit_length()
    return 2 ** (k + 1) - 1


@_register("dynamic_qwen", dynamic=True)
def _dynamic_qwen(head_dim, dim, base, params, seq_len):
    """Qwen dynamic NTK: ``base' = base * a_t ** (d/(d-2))``, ``a_t = max(1, 2**(ceil(log2(t/T)) + 1) - 1)``.

    Qwen-7B ``modeling_qwen.py`` (``context_value = log2(t/T) + 1; ntk_alpha = max(2**ceil(.) - 1, 1)``),
    the seed 001 formula. The seed writes the bracket ``[log2(t/T)]`` without saying floor or ceil;
    we follow Qwen's code (ceil), evaluated exactly in integers (Qwen's float ``log`` could round at
    exact powers of two). ``t = seq_len``, ``T = original_max_position_embeddings``. Not in HF.
    """
    alpha = _qwen_alpha(seq_len, _trained_len(params, "dynamic_qwen"))
    return _plain(dim, base if alpha == 1 else _ntk_base(base, alpha, dim))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(dim: int, base: float, trained: int, beta_fast: float, beta_slow: float,
                          truncate: bool = True) -> tuple[float, float]:
    """YaRN's ramp ends ``(low, high)`` as pair indices (HF's ``find_correction_range``):
    ``d_c(n) = dim * ln(trained / (2 pi n)) / (2 ln base)`` is the pair whose wavelength fits ``n`` times in
    ``trained``; ``low = d_c(beta_fast)``, ``high = d_c(beta_slow)`` (floor/ceil with ``truncate``), clipped to
    ``[0, dim - 1]``, ``high + 0.001`` when they meet (no zero-width ramp)."""

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(trained / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent a zero-width ramp
    return low, high


def _yarn_core(dim: int, base: float, factor: float, trained: int, params: dict) -> RopeFrequencies:
    """YaRN "NTK-by-parts" frequencies and attention factor, step for step as HF's yarn function."""
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:  # HF's truthiness test: 0 means "not given"
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32  # HF's `or`: we refuse 0 earlier, so only None -> default
    beta_slow = params.get("beta_slow") or 1
    if beta_fast <= beta_slow:
        raise ValueError(f"scaling['beta_fast'] must be > beta_slow ({beta_slow}), got {beta_fast}")

    low, high = yarn_correction_range(dim, base, trained, beta_fast, beta_slow, params.get("truncate", True))
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = default_inv_freq(dim, base)  # [dim/2]
    extrapolation_weight = 1 - ramp  # 1 for fast (high-frequency) pairs: left alone
    inv_freq = extrapolation / factor * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return RopeFrequencies(inv_freq, float(attention))


_YARN_KEYS = ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")


@_register("yarn", _YARN_KEYS)
def _yarn(head_dim, dim, base, params, seq_len):
    """YaRN: ``theta_i' = ((1 - g_i) / s + g_i) theta_i``, ``g_i`` a ramp over pair index; scale 0.1 ln s + 1.

    arXiv 2309.00071. Equals HF ``_compute_yarn_parameters``: ramp between the pairs that turn
    ``beta_fast`` (32) and ``beta_slow`` (1) times over L (``truncate`` floors/ceils the bounds),
    ``attention_factor`` if given, else ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` when both are
    non-zero (DeepSeek), else ``0.1 ln s + 1``. Missing ``factor`` is inferred as
    ``max_position_embeddings / original_max_position_embeddings`` like HF. Seed 003 writes the ramp
    on ``r_i`` rotations with threshold ``tau`` and omits the attention factor; we follow the paper/HF.
    """
    trained = _trained_len(params, "yarn")
    if "factor" in params:
        factor = params["factor"]
    elif all(k in params for k in _LENGTH_KEYS):
        factor = params["max_position_embeddings"] / params["original_max_position_embeddings"]
    else:
        factor = _factor(params, "yarn")
    return _yarn_core(dim, base, factor, trained, params)


@_register("dynamic_yarn", tuple(k for k in _YARN_KEYS if k != "factor"), dynamic=True)
def _dynamic_yarn(head_dim, dim, base, params, seq_len):
    """Dynamic YaRN: YaRN with ``s = max(1, seq_len / L)``; exactly default (scale 1) for seq_len <= L.

    arXiv 2309.00071 section 3.3 (and the authors' ``LlamaDynamicYaRNScaledRotaryEmbedding``).
    Seed 003 defines ``s(pos) = max(L, pos + 1) / L`` per token; we use one ``s`` per call from
    ``seq_len`` (the seed's value for the last token), since per-token frequencies would break
    relative positions inside the KV cache. ``attention_factor``, if given, replaces the mscale
    beyond L (HF's yarn semantics; the YaRN repo multiplies instead). Not in HF.
    """
    trained = _trained_len(params, "dynamic_yarn")
    if seq_len <= trained:
        return _plain(dim, base)
    return _yarn_core(dim, base, seq_len / trained, trained, params)


@_register("llama3", ("factor", "low_freq_factor", "high_freq_factor"))
def _llama3(head_dim, dim, base, params, seq_len):
    """Llama 3.1: ``theta/factor`` if wavelength > L/low, ``theta`` if < L/high, linear in L/wavelen between.

    Meta Llama 3 herd paper, arXiv 2407.21783 (code: meta-llama ``apply_scaling``). Equals HF
    ``_compute_llama3_parameters``; we refuse ``high_freq_factor <= low_freq_factor`` (HF warns, then
    divides by zero).
    """
    factor, L = _factor(params, "llama3"), _trained_len(params, "llama3")
    for key in ("low_freq_factor", "high_freq_factor"):
        if key not in params:
            raise ValueError(f"scaling[{key!r}] is required for rope_type 'llama3' (a finite number > 0)")
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    if high <= low:
        raise ValueError(f"scaling['high_freq_factor'] must be > low_freq_factor ({low}), got {high}")
    inv_freq = default_inv_freq(dim, base)
    wavelen = 2 * math.pi / inv_freq
    smooth = (L / wavelen - low) / (high - low)  # 0 at wavelen = L/low, 1 at wavelen = L/high
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen < L / high, inv_freq, blended)  # high frequencies untouched
    out = torch.where(wavelen > L / low, inv_freq / factor, out)  # low frequencies interpolated
    return RopeFrequencies(out, 1.0)


@_register("longrope", ("factor", "short_factor", "long_factor", "attention_factor"), dynamic=True)
def _longrope(head_dim, dim, base, params, seq_len):
    """LongRoPE: ``theta_i = base ** (-2i/d) / lambda_i``; lambda = long_factor if seq_len > L, else short.

    arXiv 2402.13753 (Phi-3). Equals HF ``_compute_longrope_parameters``; attention scale
    ``attention_factor`` or ``sqrt(1 + ln(factor) / ln(L))`` (1 if factor <= 1), ``factor`` defaulting to
    ``max_position_embeddings / original_max_position_embeddings`` like HF. HF picks the short factors
    when ``seq_len`` is None; we require ``seq_len`` so the choice is explicit.
    """
    trained = _trained_len(params, "longrope")
    key = "long_factor" if seq_len > trained else "short_factor"
    for name in ("short_factor", "long_factor"):
        if name not in params:
            raise ValueError(f"scaling[{name!r}] is required for rope_type 'longrope' "
                             f"({dim // 2} numbers > 0)")
        if len(params[name]) != dim // 2:
            raise ValueError(f"scaling[{name!r}] must have rotary_dim // 2 = {dim // 2} entries, "
                             f"got {len(params[name])}")
    attention = params.get("attention_factor")
    if attention is None:
        factor = params.get("factor")
        if factor is None and all(k in params for k in _LENGTH_KEYS):
            factor = params["max_position_embeddings"] / params["original_max_position_embeddings"]
        if factor is None:
            raise ValueError("rope_type 'longrope' needs scaling['factor'] (>= 1), "
                             "scaling['attention_factor'], or both max_position_embeddings and "
                             "original_max_position_embeddings")
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(trained))
    ext = torch.tensor(params[key], dtype=torch.float64)
    return RopeFrequencies(default_inv_freq(dim, base) / ext, float(attention))


@_register("proportional", ("factor",))
def _proportional(head_dim, dim, base, params, seq_len):
    """Proportional RoPE (Gemma 4), i.e. p-RoPE (Barbero et al., "Round and Round We Go! What makes Rotary
    Positional Encodings useful?", arXiv 2410.06205) with ``p = partial_rotary_factor``:
    ``theta_i = base ** (-2i/head_dim) / factor`` if i < rotary_dim/2, else 0. The fraction p of the pairs
    with the highest frequencies keeps full RoPE's ladder; the rest (the lowest frequencies) are not
    rotated at all (NoPE pairs). Method record ``p_rope`` in :mod:`posenc.scheme.methods`.

    Matches HF ``_compute_proportional_rope_parameters``: the exponent uses the *full* head_dim and
    the result has ``head_dim // 2`` entries (zero frequency = that pair is not rotated), so the
    rotation is applied to the whole head with the half layout, not as partial RoPE on the first
    ``rotary_dim`` dims. This is the one schedule whose ``inv_freq`` is longer than ``rotary_dim // 2``.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rope_type 'proportional', got {head_dim}")
    rotated = _exponents(dim, head_dim)  # [dim/2]: 2i / head_dim
    inv_freq = torch.zeros(head_dim // 2, dtype=torch.float64)
    inv_freq[: dim // 2] = 1.0 / base ** rotated
    return RopeFrequencies(inv_freq / params.get("factor", 1.0), 1.0)


@_register("base", ("base",))
def _base_change(head_dim, dim, base, params, seq_len):
    """Base change: ``theta_i = base' ** (-2i/d)`` with ``base'`` from key ``base`` or ``rope_theta``.

    Scaling Laws of RoPE-based Extrapolation, arXiv 2310.05209: both larger bases (Code Llama 1e6,
    Llama 2 Long 5e5) and smaller ones (e.g. 500) extrapolate after tuning at the original length.
    Seed 001 cites it; same formula.
    """
    if "base" in params and "rope_theta" in params and params["base"] != params["rope_theta"]:
        raise ValueError(f"scaling['base'] ({params['base']}) and scaling['rope_theta'] "
                         f"({params['rope_theta']}) disagree; give one")
    if "base" not in params and "rope_theta" not in params:
        raise ValueError("rope_type 'base' needs the new base in scaling['base'] or scaling['rope_theta'] "
                         "(a finite number > 0)")
    return _plain(dim, params.get("base", base))


# ----------------------------------------------------------------------------------------------------------
# config parsing and validation

_POSITIVE_INT_KEYS = ("original_max_position_embeddings", "max_position_embeddings")
_POSITIVE_KEYS = ("rope_theta", "base", "low_freq_factor", "high_freq_factor", "b", "attention_factor",
                  "beta_fast", "beta_slow")
_AT_LEAST_ONE_KEYS = ("factor", "alpha")


def _check_numbers(name: str, value) -> None:
    """Refuse NaN/inf anywhere (numbers, nested lists, 0-d tensors)."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_numbers(f"{name}[{i}]", v)
    elif isinstance(value, Real) and not isinstance(value, bool) and not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")


def _parse(scaling) -> tuple[str, dict]:
    """Validate a rope_scaling / rope_parameters dict; return ``(rope_type, params)``, None values dropped."""
    if scaling is None:
        return "default", {}
    if not isinstance(scaling, Mapping):
        raise ValueError(f"scaling must be a dict (HF rope_scaling / rope_parameters) or None, got "
                         f"{type(scaling).__name__}")
    params = {k: v for k, v in scaling.items() if v is not None}
    if params and all(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(f"scaling is nested by layer type ({sorted(params)}); pass one of them, "
                         "e.g. scaling['full_attention']")
    for key, value in params.items():
        _check_numbers(f"scaling[{key!r}]", value)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if "type" in params and "rope_type" in params and params["type"] != params["rope_type"]:
        raise ValueError(f"scaling['type'] ({params['type']!r}) and scaling['rope_type'] "
                         f"({params['rope_type']!r}) disagree")
    if rope_type not in ROPE_SCALINGS:
        raise ValueError(f"scaling['rope_type'] must be one of {sorted(ROPE_SCALINGS)}, got {rope_type!r}")
    unknown = sorted(set(params) - _KEYS[rope_type])
    if unknown:
        raise ValueError(f"scaling has keys {unknown} that rope_type {rope_type!r} does not use; "
                         f"allowed keys: {sorted(_KEYS[rope_type])}")
    for key in _POSITIVE_INT_KEYS:
        if key in params:
            params[key] = check_positive_int(f"scaling[{key!r}]", params[key])
    for key in _POSITIVE_KEYS:
        if key in params:
            params[key] = check_finite(f"scaling[{key!r}]", params[key], minimum=0.0, strict_min=True)
    for key in _AT_LEAST_ONE_KEYS:
        if key in params:
            params[key] = check_finite(f"scaling[{key!r}]", params[key], minimum=1.0)
    for key in ("mscale", "mscale_all_dim"):  # 0.1 * mscale * ln(s) + 1 must stay >= 1: no negative scale
        if key in params:
            params[key] = check_finite(f"scaling[{key!r}]", params[key], minimum=0.0)
    if "partial_rotary_factor" in params:
        params["partial_rotary_factor"] = _check_partial(params["partial_rotary_factor"],
                                                         "scaling['partial_rotary_factor']")
    if "truncate" in params and not isinstance(params["truncate"], bool):
        raise ValueError(f"scaling['truncate'] must be true or false, got {params['truncate']!r}")
    for key in ("short_factor", "long_factor"):
        if key in params:
            values = params[key]
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"scaling[{key!r}] must be a non-empty list of numbers > 0, got {values!r}")
            params[key] = [check_finite(f"scaling[{key!r}][{i}]", v, minimum=0.0, strict_min=True)
                           for i, v in enumerate(values)]
    return rope_type, params


def _check_partial(value, name: str = "partial_rotary_factor") -> float:
    return check_finite(name, value, minimum=0.0, maximum=1.0, strict_min=True)


def _check_seq_len(seq_len) -> int | None:
    if seq_len is None:
        return None
    if isinstance(seq_len, torch.Tensor) and seq_len.numel() == 1 and not seq_len.is_floating_point():
        seq_len = int(seq_len)  # HF's dynamic update passes max(position_ids) + 1 as a tensor
    return check_positive_int("seq_len", seq_len)


def _require_seq_len(rope_type: str, seq_len: int | None) -> None:
    if rope_type in _DYNAMIC and seq_len is None:
        raise ValueError(f"seq_len is required for rope_type {rope_type!r} (its frequencies depend on the "
                         "sequence length); pass seq_len = max(position) + 1, an integer >= 1")


# ----------------------------------------------------------------------------------------------------------
# public API

def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: Mapping | None = None,
                     seq_len: int | None = None, partial_rotary_factor: float = 1.0) -> RopeFrequencies:
    """RoPE inverse frequencies and attention scale for a HF-style ``scaling`` dict.

    ``theta_i = base ** (-2i / rotary_dim)`` transformed by ``ROPE_SCALINGS[rope_type]``, with
    ``rotary_dim = int(head_dim * partial_rotary_factor)`` (even, >= 2). ``rope_type`` (or legacy
    ``type``) defaults to ``"default"``; ``scaling['rope_theta']`` and
    ``scaling['partial_rotary_factor']``, when present, override ``base`` and ``partial_rotary_factor``.
    Returns float32 ``inv_freq`` ``[rotary_dim // 2]`` (``proportional``: ``[head_dim // 2]``).
    Raises ``ValueError`` for any out-of-range input (see the module docstring).
    """
    head_dim = check_positive_int("head_dim", head_dim)
    rope_type, params = _parse(scaling)
    base = check_finite("scaling['rope_theta']" if "rope_theta" in params else "base",
                        params.get("rope_theta", base), minimum=0.0, strict_min=True)
    partial = params.get("partial_rotary_factor", _check_partial(partial_rotary_factor))
    rotary_dim = int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim = int(head_dim * partial_rotary_factor) must be an even integer >= 2, "
                         f"got head_dim={head_dim}, partial_rotary_factor={partial} -> {rotary_dim}")
    seq_len = _check_seq_len(seq_len)
    _require_seq_len(rope_type, seq_len)
    return _compute(rope_type, params, head_dim, rotary_dim, base, seq_len)


def _compute(rope_type: str, params: dict, head_dim: int, rotary_dim: int, base: float,
             seq_len: int | None) -> RopeFrequencies:
    out = ROPE_SCALINGS[rope_type](head_dim, rotary_dim, base, params, seq_len)
    inv_freq = out.inv_freq
    inv_freq = resonance(inv_freq, params.get("resonance", False))
    if not bool(torch.isfinite(inv_freq).all()) or bool((inv_freq < 0).any()):
        raise ValueError(f"rope_type {rope_type!r} with base={base} and rotary_dim={rotary_dim} gives "
                         "non-finite or negative frequencies; use a base in a sane range (e.g. 10 .. 1e9)")
    if not (math.isfinite(out.attention_scale) and out.attention_scale > 0):
        raise ValueError(f"rope_type {rope_type!r} gives attention scale {out.attention_scale}; "
                         "scaling['attention_factor'] / mscale must give a finite scale > 0")
    return RopeFrequencies(inv_freq.to(torch.float32), float(out.attention_scale))


def validate_rope_scaling(scaling: Mapping | None, head_dim: int | None = None, base: float = 10000.0,
                          partial_rotary_factor: float = 1.0) -> dict:
    """Check a HF-style ``rope_scaling`` dict completely, before anything uses it; return it normalised.

    Refuses (``ValueError`` naming the key and its allowed range): a non-dict, an unknown ``rope_type``
    or key, a missing required key, NaN/inf, ``factor`` < 1, ``low_freq_factor >= high_freq_factor``,
    ``beta_fast <= beta_slow``, a negative ``mscale``, LongRoPE ``short_factor``/``long_factor`` lists
    whose lengths differ (or, with ``head_dim``, are not ``rotary_dim // 2`` long), and values whose
    frequencies overflow. It runs the schedule itself at the lengths that choose its branches, so a
    config accepted here is one :func:`rope_frequencies` accepts. Without ``head_dim`` the rotary
    dimension is taken from the LongRoPE lists (else 64). Returns ``{"rope_type": ..., **params}``
    with None values dropped; ``{"rope_type": "default"}`` for ``None``.
    """
    rope_type, params = _parse(scaling)
    base = check_finite("base", params.get("rope_theta", base), minimum=0.0, strict_min=True)
    if head_dim is None:
        rotary_dim = 2 * len(params.get("short_factor", ())) or 64
        head_dim = rotary_dim
    else:
        head_dim = check_positive_int("head_dim", head_dim)
        partial = params.get("partial_rotary_factor", _check_partial(partial_rotary_factor))
        rotary_dim = int(head_dim * partial)
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"rotary_dim = int(head_dim * partial_rotary_factor) must be an even integer >= 2, "
                             f"got head_dim={head_dim}, partial_rotary_factor={partial} -> {rotary_dim}")
    lengths: tuple[int | None, ...] = (None,)
    if rope_type in _DYNAMIC:
        trained = _trained_len(params, rope_type)
        lengths = (trained, trained + 1)  # inside and beyond the trained length (longrope: short and long)
    for seq_len in lengths:
        _compute(rope_type, params, head_dim, rotary_dim, base, seq_len)
    return {"rope_type": rope_type, **{k: v for k, v in params.items() if k not in ("rope_type", "type")}}


def is_dynamic(scaling: Mapping | None) -> bool:
    """True when the schedule depends on ``seq_len`` (dynamic, dynamic_qwen, dynamic_yarn, longrope)."""
    return _parse(scaling)[0] in _DYNAMIC


def scaling_factor(scaling: Mapping | None, seq_len: int | None = None) -> float:
    """The effective context-extension scale ``s`` a schedule applies (1.0 for an unscaled one).

    default / base: 1; linear, ntk_mixed, yarn, llama3, proportional, longrope: ``factor`` (yarn /
    longrope infer it as ``max_position_embeddings / original_max_position_embeddings`` when absent);
    ntk: ``factor`` or ``alpha``; at a given ``seq_len`` (required for them): dynamic
    ``max(1, factor * t / L - (factor - 1))``, dynamic_qwen ``alpha_t``, dynamic_yarn ``max(1, t / L)``.
    Useful for logit scales that follow the extension (e.g. log-n) and for reports.
    """
    rope_type, params = _parse(scaling)
    seq_len = _check_seq_len(seq_len)
    if rope_type in ("dynamic", "dynamic_qwen", "dynamic_yarn"):
        _require_seq_len(rope_type, seq_len)
        trained = _trained_len(params, rope_type)
        if seq_len <= trained:  # inside the trained length every dynamic schedule is the default one
            return 1.0
        if rope_type == "dynamic":
            factor = _factor(params, rope_type)  # factor * t / L - (factor - 1) rounds to 1 + 7e-15 at t = L
            return max(1.0, factor * seq_len / trained - (factor - 1))
        if rope_type == "dynamic_qwen":
            return float(_qwen_alpha(seq_len, trained))
        return max(1.0, seq_len / trained)
    if rope_type in ("default", "base"):
        return 1.0
    if rope_type == "ntk" and "alpha" in params:
        return params["alpha"]
    if "factor" in params:
        return params["factor"]
    if rope_type in ("yarn", "longrope") and all(k in params for k in _LENGTH_KEYS):
        return params["max_position_embeddings"] / params["original_max_position_embeddings"]
    if rope_type == "proportional":
        return 1.0
    return _factor(params, rope_type)  # raises: factor is required
