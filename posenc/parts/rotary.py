"""Rotary position embedding (RoPE) and xPos: the q/k-transform part of a positional scheme.

RoPE (Su et al., "RoFormer", arXiv 2104.09864) rotates each pair of features of q and k by the angle
``position * inv_freq[i]``, so that ``<R_m q, R_n k>`` depends only on ``m - n``.
xPos (Sun et al., "A Length-Extrapolatable Transformer", arXiv 2212.10554) additionally multiplies q by
``zeta ** (pos / scale_base)`` and k by its inverse, so the logit decays with distance.

Shape legend: ``B`` batch, ``H`` heads, ``N`` sequence, ``D`` head_dim, ``R`` rotary_dim (<= D), ``R/2``
the number of rotated pairs (= len(inv_freq)).

Layouts (which features form a rotated pair):

* ``"half"``: pair ``(i, i + R/2)``; Llama / GPT-NeoX / Hugging Face ``rotate_half``.
* ``"interleaved"``: pair ``(2i, 2i + 1)``; RoFormer, GPT-J, ``rotary-embedding-torch``.

Both rotate pair ``i`` by ``+position * inv_freq[i]`` (``a' = a cos - b sin``, ``b' = b cos + a sin``, where
``a`` is the first member of the pair). With ``rotary_dim < D`` (partial rotary, GPT-NeoX/GPT-J) only the
first ``rotary_dim`` features are rotated and the rest pass through unchanged.

Precision: angles ``position * inv_freq`` are formed in float64 (positions are exact integers there, so the
angle error is ~1e-16 relative: < 1e-8 rad at position 2^24), cos/sin are then cast (float32 by default).
The rotation itself runs in ``promote_types(x.dtype, cos.dtype)`` (float32 for bf16/fp16 ``x`` with the
default float32 cos/sin) and the result is cast back to ``x.dtype``, so a bf16 input at position 10^6 only
suffers the final bf16 rounding. Angles are never computed in ``x``'s dtype.
"""

from __future__ import annotations

import os

import torch

from posenc._util import as_positions, batch_choices, check_finite, check_positive_int

__all__ = [
    "LAYOUTS",
    "RopeAngleCache",
    "apply_rope",
    "apply_rope_",
    "apply_rope_cos_sin",
    "rope_angles",
    "rope_cos_sin",
    "xpos_scale",
]

LAYOUTS = ("half", "interleaved")


# ----------------------------------------------------------------------------------------------------------
# validation helpers


def _check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def _check_x(x) -> None:
    """``x`` must be a floating ``[B, H, N, D]`` tensor: an integer one would truncate the rotated values."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a tensor [batch, heads, seq, head_dim], got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor (float32/float16/bfloat16/float64), got {x.dtype}")


def _check_inv_freq(inv_freq) -> torch.Tensor:
    if not isinstance(inv_freq, torch.Tensor):
        inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64)
    if inv_freq.dim() != 1 or not inv_freq.is_floating_point():
        raise ValueError(f"inv_freq must be a 1-D float tensor [rotary_dim // 2], got dtype {inv_freq.dtype} "
                         f"and shape {tuple(inv_freq.shape)}")
    if inv_freq.numel() == 0:
        raise ValueError("inv_freq must have at least one frequency (rotary_dim >= 2)")
    if not bool(torch.isfinite(inv_freq).all()):
        raise ValueError("inv_freq must be finite")
    return inv_freq


def _resolve_rotary_dim(rotary_dim, head_dim: int, half_pairs: int) -> int:
    """Return the number of rotated features; ``half_pairs`` is len(inv_freq) or cos.shape[-1]."""
    if rotary_dim is None:
        rotary_dim = head_dim
    rotary_dim = check_positive_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (features are rotated in pairs), got {rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim ({head_dim}), got {rotary_dim}")
    if half_pairs != rotary_dim // 2:
        raise ValueError(f"inv_freq (or cos/sin) has {half_pairs} frequencies but rotary_dim // 2 = "
                         f"{rotary_dim // 2}; pass rotary_dim = 2 * len(inv_freq) for partial rotary")
    return rotary_dim


# ----------------------------------------------------------------------------------------------------------
# angles and cos/sin


def rope_angles(positions, inv_freq, freq_scale: float = 1.0) -> torch.Tensor:
    """Float64 angles ``theta[b, 0, n, i] = positions[b, n] * inv_freq[i] * freq_scale``: ``[B, 1, N, R/2]``.

    ``positions`` is ``[N]`` or ``[B, N]`` (non-negative integers, see ``posenc._util.as_positions``).
    """
    inv_freq = _check_inv_freq(inv_freq)
    freq_scale = check_finite("freq_scale", freq_scale, minimum=0.0, strict_min=True)
    pos = as_positions(positions, device=inv_freq.device)  # [B, N] long
    freqs = inv_freq.to(torch.float64) * freq_scale  # [R/2] float64
    # [B, N, 1] * [R/2] -> [B, N, R/2] -> [B, 1, N, R/2]
    return (pos.to(torch.float64).unsqueeze(-1) * freqs).unsqueeze(1)


def rope_cos_sin(positions, inv_freq, dtype: torch.dtype = torch.float32, scale: float = 1.0,
                 freq_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of the RoPE angles, each ``[B, 1, N, R/2]`` in ``dtype`` (one value per pair).

    Formula: ``cos = scale * cos(p * inv_freq * freq_scale)``, same for sin, angles in float64 and cast to
    ``dtype`` only after cos/sin. ``scale`` is Hugging Face's ``attention_scaling`` (YaRN's attention factor;
    it multiplies both cos and sin, so q.k is scaled by ``scale**2``). ``freq_scale`` multiplies inv_freq
    (e.g. position interpolation by 1/factor of one branch). Unlike HF, cos/sin are *not* duplicated to the
    full head_dim: the layout is applied in :func:`apply_rope_cos_sin`. Reuse the result across layers.
    """
    scale = check_finite("scale", scale)
    angles = rope_angles(positions, inv_freq, freq_scale)  # [B, 1, N, R/2] float64
    cos, sin = torch.cos(angles), torch.sin(angles)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


# ----------------------------------------------------------------------------------------------------------
# fused rotation kernel (optional C++/OpenMP extension; pure PyTorch is the fallback and the definition)

_KERNEL_SRC = r"""
#include <torch/extension.h>
#ifdef _OPENMP
#include <omp.h>
#endif
// x, out: [rows, D] float32 contiguous (out may alias x); cos/sin: [cb, N, R/2] float32 contiguous.
// Row r = ((b * H) + h) * N + n uses cos row (b % cb) * N + n. Same op order as the PyTorch path
// (t1 = a*c, t2 = b*s, a' = t1 - t2; b' = b*c + a*s), no FMA contraction, so results are bit-identical.
void rope_rows(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, torch::Tensor out, int64_t B,
               int64_t H, int64_t N, int64_t D, int64_t R, bool half) {
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t P = R / 2, cb = cos.size(0), rows = B * H * N;
  #pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = r % N, b = r / (H * N);
    const float* c = cp + ((b % cb) * N + n) * P;
    const float* s = sp + ((b % cb) * N + n) * P;
    const float* xi = xp + r * D;
    float* o = op + r * D;
    if (half) {
      #pragma omp simd
      for (int64_t i = 0; i < P; ++i) {
        const float a = xi[i], bb = xi[i + P];
        const float t1 = a * c[i], t2 = bb * s[i], t3 = bb * c[i], t4 = a * s[i];
        o[i] = t1 - t2;
        o[i + P] = t3 + t4;
      }
    } else {
      for (int64_t i = 0; i < P; ++i) {
        const float a = xi[2 * i], bb = xi[2 * i + 1];
        const float t1 = a * c[i], t2 = bb * s[i], t3 = bb * c[i], t4 = a * s[i];
        o[2 * i] = t1 - t2;
        o[2 * i + 1] = t3 + t4;
      }
    }
    if (o != xi) for (int64_t i = R; i < D; ++i) o[i] = xi[i];
  }
}
"""

_KERNEL_STATE: dict = {}
_KERNEL_MIN_NUMEL = 1 << 15  # below this the kernel's call overhead is not worth it (and tests stay compile-free)


def _extension_dir() -> str:
    """Build folder of the fused kernel: torch's extension cache (``TORCH_EXTENSIONS_DIR`` or
    ``~/.cache/torch_extensions``), one subfolder per Python and torch version *and torch install*.

    Why the install: the build command names torch's include folders by path, so two environments
    sharing one folder (two checkouts with their own venvs) rewrite each other's build file and every
    process of the other environment rebuilds the kernel (tens of seconds to minutes on a loaded CPU)."""
    import hashlib
    import sys

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                 "torch_extensions")
    install = hashlib.sha1(os.path.dirname(os.path.abspath(torch.__file__)).encode()).hexdigest()[:10]
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}-{install}".replace("+", "_")
    return os.path.join(root, f"posenc_rope_v1-{tag}")


class _BuildLock:
    """Exclusive ``flock`` on ``<build dir>/posenc.lock`` around the extension build.

    Why: torch's ``load_inline`` serialises builds with a *file baton* (``<build dir>/lock``, created
    and deleted, never tied to a process). A build killed half-way (Ctrl-C, a CI timeout, a killed test
    worker) leaves the baton behind, and every later ``load_inline`` of that extension waits for it
    forever, asleep: the test suite then hangs. An ``flock`` is released by the kernel when its holder
    dies, so whoever holds it knows that no live process is building, and a baton it finds is stale.
    """

    def __init__(self, build_dir: str):
        self.path = os.path.join(build_dir, "posenc.lock")
        self.baton = os.path.join(build_dir, "lock")
        self.fd = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # not POSIX: no flock, keep torch's own behaviour
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # waits while a live process builds
        if os.path.exists(self.baton):
            os.remove(self.baton)  # left by a build that died: nobody else can hold it now
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def rope_kernel():
    """The compiled fused kernel module, or None (compilation failed, disabled by ``POSENC_NO_EXT=1``).

    Built once with ``torch.utils.cpp_extension.load_inline`` into :func:`_extension_dir`, under
    :class:`_BuildLock` (a killed build cannot make later processes wait forever); never needed for
    correctness: every caller falls back to the pure PyTorch rotation.
    """
    if "mod" not in _KERNEL_STATE:
        _KERNEL_STATE["mod"] = None
        if os.environ.get("POSENC_NO_EXT", "") not in ("", "0"):
            return None
        try:
            from torch.utils.cpp_extension import load_inline

            build_dir = _extension_dir()
            os.makedirs(build_dir, exist_ok=True)
            with _BuildLock(build_dir):
                _KERNEL_STATE["mod"] = load_inline(
                    name="posenc_rope_v1", cpp_sources=[_KERNEL_SRC], functions=["rope_rows"],
                    extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off", "-fno-fast-math"],
                    extra_ldflags=["-fopenmp"], build_directory=build_dir, verbose=False)
        except Exception as exc:  # noqa: BLE001 - any build failure means: use the PyTorch path
            _KERNEL_STATE["error"] = repr(exc)
    return _KERNEL_STATE["mod"]


def _kernel_ok(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, force: bool = False) -> bool:
    if x.device.type != "cpu" or x.dtype != torch.float32 or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        return False
    if cos.shape[1] != 1 or (x.numel() < _KERNEL_MIN_NUMEL and not force):
        return False
    if x.requires_grad and torch.is_grad_enabled():
        return False
    return rope_kernel() is not None


def _rotate_kernel(x, cos, sin, layout, rot, out):
    B, H, N, D = x.shape
    c = cos.reshape(cos.shape[0], N, cos.shape[-1]).contiguous()  # [cb, N, R/2]
    s = sin.reshape(sin.shape[0], N, sin.shape[-1]).contiguous()
    rope_kernel().rope_rows(x, c, s, out, B, H, N, D, rot, layout == "half")
    return out


# ----------------------------------------------------------------------------------------------------------
# rotation


def apply_rope_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half",
                       rotary_dim: int | None = None) -> torch.Tensor:
    """Rotate ``x [B, H, N, D]`` by precomputed ``cos, sin [B or 1, 1, N, R/2]`` (see :func:`rope_cos_sin`).

    Pair ``(a, b)`` of pair index ``i`` becomes ``(a cos_i - b sin_i, b cos_i + a sin_i)``; pairs are
    ``(i, i + R/2)`` for ``layout="half"`` and ``(2i, 2i+1)`` for ``"interleaved"``. ``rotary_dim`` (default
    ``D``) features are rotated; features ``rotary_dim:`` pass through. Computes in
    ``promote_types(x.dtype, cos.dtype)`` and returns ``x.dtype``.
    """
    _check_layout(layout)
    _check_x(x)
    if cos.shape != sin.shape or cos.dim() != 4:
        raise ValueError(f"cos and sin must both be [B, 1, N, rotary_dim // 2], got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"cos/sin have {cos.shape[-2]} positions but x has seq length {x.shape[-2]}")
    if cos.shape[0] not in (1, x.shape[0]) or cos.shape[1] not in (1, x.shape[1]):
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x {tuple(x.shape)}")
    rot = _resolve_rotary_dim(rotary_dim, x.shape[-1], cos.shape[-1])
    if _kernel_ok(x, cos, sin):  # fused C++ path: same ops in the same order, one pass over x
        xc = x.contiguous()
        return _rotate_kernel(xc, cos, sin, layout, rot, torch.empty_like(xc))
    return _rotate_torch(x, cos, sin, layout, rot)


def _rotate_torch(x, cos, sin, layout, rot):
    """Pure PyTorch rotation: the definition the kernel is tested against."""
    half = rot // 2
    work = torch.promote_types(x.dtype, cos.dtype)
    c, s = cos.to(work), sin.to(work)
    x_rot = x[..., :rot].to(work)  # [B, H, N, R]
    if layout == "half":
        x1, x2 = x_rot[..., :half], x_rot[..., half:]  # [B, H, N, R/2] each
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)  # [B, H, N, R]
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]  # even / odd features, [B, H, N, R/2] each
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)  # [B, H, N, R/2, 2] -> R
    out = out.to(x.dtype)
    if rot == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rot:]), dim=-1)  # partial rotary: [B, H, N, D]


def apply_rope(x: torch.Tensor, positions, inv_freq: torch.Tensor, layout: str = "half",
               rotary_dim: int | None = None) -> torch.Tensor:
    """Rotary position embedding of ``x [B, H, N, D]`` at integer ``positions [N] or [B, N]``.

    RoFormer (arXiv 2104.09864): pair ``i`` is rotated by ``position * inv_freq[i]``; ``inv_freq`` has
    ``rotary_dim // 2`` entries (``rotary_dim`` defaults to ``D``). ``layout="half"`` matches Hugging Face
    Llama / GPT-NeoX ``apply_rotary_pos_emb``; ``"interleaved"`` matches RoFormer and
    ``rotary-embedding-torch``.
    Angles in float64, cos/sin in float32 (float64 for a float64 ``x``), output in ``x.dtype``. Equals
    ``apply_rope_cos_sin(x, *rope_cos_sin(positions, inv_freq), layout, rotary_dim)``.
    """
    _check_layout(layout)
    inv_freq = _check_inv_freq(inv_freq)
    _check_x(x)
    _resolve_rotary_dim(rotary_dim, x.shape[-1], inv_freq.numel())
    pos = as_positions(positions, seq=x.shape[-2], device=x.device)  # [B or 1, N]; [1, N] broadcasts
    if pos.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"positions has batch {pos.shape[0]}, expected {batch_choices(x.shape[0])}")
    cos, sin = _cached_cos_sin(pos, inv_freq.to(x.device), _table_dtype(x))
    return apply_rope_cos_sin(x, cos, sin, layout, rotary_dim)


def apply_rope_(x: torch.Tensor, positions, inv_freq: torch.Tensor, layout: str = "half",
                rotary_dim: int | None = None) -> torch.Tensor:
    """In-place :func:`apply_rope`: overwrites and returns ``x`` (same values as ``apply_rope``).

    Saves the output allocation (one pass over ``x`` instead of read + write of a new tensor) when the fused
    kernel applies (contiguous float32 CPU tensor); otherwise computes out of place and copies back.
    """
    _check_layout(layout)
    inv_freq = _check_inv_freq(inv_freq)
    _check_x(x)
    rot = _resolve_rotary_dim(rotary_dim, x.shape[-1], inv_freq.numel())
    pos = as_positions(positions, seq=x.shape[-2], device=x.device)
    if pos.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"positions has batch {pos.shape[0]}, expected {batch_choices(x.shape[0])}")
    cos, sin = _cached_cos_sin(pos, inv_freq.to(x.device), _table_dtype(x))
    if x.is_contiguous() and _kernel_ok(x, cos, sin):
        return _rotate_kernel(x, cos, sin, layout, rot, x)
    return x.copy_(_rotate_torch(x, cos, sin, layout, rot))


_TABLES: dict = {}
_TABLE_MAX_POSITION = 1 << 15  # positions beyond this are computed directly (bounds table memory)


def _cached_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_cos_sin(pos, inv_freq, dtype)`` through a per-``(inv_freq, dtype)`` :class:`RopeAngleCache`.

    The table holds the same float64-angle cos/sin values, so this only skips recomputing them per call.
    """
    if pos.numel() == 0 or int(pos.max()) >= _TABLE_MAX_POSITION:
        return rope_cos_sin(pos, inv_freq, dtype=dtype)
    key = (str(inv_freq.device), tuple(inv_freq.to(torch.float64).tolist()), dtype)
    cache = _TABLES.get(key)
    if cache is None:
        if len(_TABLES) >= 8:
            _TABLES.pop(next(iter(_TABLES)))
        cache = _TABLES[key] = RopeAngleCache(inv_freq.to(torch.float64), max_position=int(pos.max()) + 1,
                                              dtype=dtype)
    return cache.cos_sin(pos)


def _table_dtype(x: torch.Tensor) -> torch.dtype:
    """cos/sin in float32, or float64 for a float64 ``x`` (a float64 input stays exact in float64)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class RopeAngleCache:
    """Float32 cos/sin table for positions ``0 .. capacity-1``, built once from float64 angles.

    ``cos_sin(positions)`` indexes the table (growing it by doubling when a position is beyond it), so the
    result is bit-identical to :func:`rope_cos_sin` at a fraction of the cost. One table per
    ``(inv_freq, scale, freq_scale, dtype)``; memory ``2 * capacity * R/2`` values.
    """

    def __init__(self, inv_freq: torch.Tensor, max_position: int = 4096, scale: float = 1.0,
                 freq_scale: float = 1.0, dtype: torch.dtype = torch.float32):
        self.inv_freq = _check_inv_freq(inv_freq)
        self.scale = check_finite("scale", scale)
        self.freq_scale = check_finite("freq_scale", freq_scale, minimum=0.0, strict_min=True)
        self.dtype = dtype
        self.capacity = 0
        self._cos = self._sin = None
        self._build(check_positive_int("max_position", max_position))

    def _build(self, capacity: int) -> None:
        table_pos = torch.arange(capacity, device=self.inv_freq.device)
        cos, sin = rope_cos_sin(table_pos, self.inv_freq, self.dtype, self.scale, self.freq_scale)
        self._cos, self._sin = cos[0, 0], sin[0, 0]  # [capacity, R/2]
        self.capacity = capacity

    def cos_sin(self, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` each ``[B, 1, N, R/2]`` for ``positions [N] or [B, N]``."""
        pos = as_positions(positions, device=self.inv_freq.device)  # [B, N]
        need = int(pos.max()) + 1 if pos.numel() else 0
        if need > self.capacity:
            self._build(max(need, 2 * self.capacity))
        return self._cos[pos].unsqueeze(1), self._sin[pos].unsqueeze(1)  # [B, N, R/2] -> [B, 1, N, R/2]


# ----------------------------------------------------------------------------------------------------------
# xPos


def xpos_scale(positions, head_dim: int, scale_base: float = 512, gamma: float = 0.4, layout: str = "half",
               center=0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """xPos scale ``[B, 1, N, head_dim]``: multiply rotated q by it and rotated k by its inverse.

    Sun et al., arXiv 2212.10554: ``zeta_i = (2i / D + gamma) / (1 + gamma)`` for ``i = 0 .. D/2 - 1``,
    ``scale[b, 0, n, pair i] = zeta_i ** ((positions[b, n] - center) / scale_base)``, so
    ``q.k`` gains the factor ``zeta ** ((m - n) / scale_base)``, which depends only on ``m - n``. Each pair's
    value is written to both of its features: ``cat(z, z)`` for ``layout="half"``, ``repeat_interleave(z, 2)``
    for ``"interleaved"``. Exponent in float64, cast to ``dtype``.

    ``center`` (an int, or a tensor ``[B]`` for per-row centres) is subtracted from the positions before
    exponentiation; it cancels in ``q.k`` but keeps the scales near 1 (``zeta < 1``, so a large positive
    exponent underflows q's scale and overflows k's). The reference implementations centre on the sequence:

    * ``rotary-embedding-torch`` (``RotaryEmbedding(use_xpos=True).rotate_queries_and_keys``): positions
      ``0..N-1`` and ``power = (t - N // 2) / scale_base``, i.e. ``center = N // 2``; it uses the interleaved
      layout. (Its ``get_scale`` caches the first sequence length's scales, so later shorter calls reuse a
      table centred for the old length.)
    * torchscale's ``XPOS``: exponents ``arange(-(N // 2) rounded toward -inf, ...)``, i.e.
      ``center = ceil(N / 2)`` (``-(N) // 2`` in Python); equal to the above for even ``N``.

    ``center=0`` (default) is the un-centred form of the paper's equations.
    """
    _check_layout(layout)
    head_dim = check_positive_int("head_dim", head_dim, minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for xPos, got {head_dim}")
    scale_base = check_finite("scale_base", scale_base, minimum=0.0, strict_min=True)
    gamma = check_finite("gamma", gamma, minimum=0.0)
    pos = as_positions(positions)  # [B, N]
    if isinstance(center, torch.Tensor):
        if center.is_floating_point() or center.dim() > 1:
            raise ValueError(f"center must be an int or an integer tensor [batch], got {center.dtype} "
                             f"shape {tuple(center.shape)}")
        center = center.to(pos.device, torch.float64).reshape(-1, 1)  # [B or 1, 1]
    elif isinstance(center, bool) or not isinstance(center, int):
        raise ValueError(f"center must be an int or an integer tensor [batch], got {center!r}")
    i = torch.arange(head_dim // 2, device=pos.device, dtype=torch.float64)
    zeta = (2.0 * i / head_dim + gamma) / (1.0 + gamma)  # [D/2]
    power = (pos.to(torch.float64) - center) / scale_base  # [B, N]
    scale = zeta ** power.unsqueeze(-1)  # [B, N, D/2]
    if layout == "half":
        scale = torch.cat((scale, scale), dim=-1)  # [B, N, D]
    else:
        scale = scale.repeat_interleave(2, dim=-1)  # [B, N, D]
    return scale.unsqueeze(1).to(dtype)  # [B, 1, N, D]
