"""Small shared helpers: input validation, position normalisation, and a tensor comparison that
reports how far apart two tensors are (not just that they differ)."""

from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `posenc --help` does not load it
    import torch


def check_positive_int(name: str, value, *, minimum: int = 1) -> int:
    """Return ``value`` as int, or raise ``ValueError`` naming the parameter and its allowed range."""
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        isinstance(value, float) and value.is_integer()
    ):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def check_device(name: str, value) -> str:
    """Return ``value`` (a device string) if torch knows it and it is available here, else ``ValueError``."""
    import torch
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} must be a torch device such as 'cpu', 'cuda' or 'cuda:1', got {value!r}") from None
    available = {"cpu": lambda: True, "meta": lambda: True, "cuda": torch.cuda.is_available,
                 "mps": lambda: bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()}
    if not available.get(device.type, lambda: False)():
        raise ValueError(f"{name} {value!r} is not available on this machine (torch.{device.type} reports no "
                         f"device); use 'cpu'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{name} {value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return str(value)


DTYPES = ("auto", "float32", "bfloat16", "float16")
"""The model dtypes a command or a run accepts: ``auto`` is float32 on the CPU (and every device but CUDA),
bfloat16 on CUDA (:func:`check_dtype`)."""


def check_dtype(name: str, value, device="cpu") -> str:
    """The dtype name (``"float32"``, ``"bfloat16"`` or ``"float16"``) that ``value`` (one of :data:`DTYPES`, or a
    ``torch.dtype`` of those) means on ``device``: ``"auto"`` is bfloat16 on CUDA and float32 elsewhere.
    ``ValueError`` naming ``name`` for anything else."""
    import torch
    if isinstance(value, torch.dtype):
        value = str(value).removeprefix("torch.")
    if value not in DTYPES:
        raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")
    if value == "auto":
        return "bfloat16" if torch.device(device).type == "cuda" else "float32"
    return value


def check_even_int(name: str, value, why: str = "dimension pairs") -> int:
    """Return ``value`` as an even int >= 2, or raise ``ValueError`` naming the parameter."""
    value = check_positive_int(name, value, minimum=2)
    if value % 2:
        raise ValueError(f"{name} must be even ({why}), got {value}")
    return value


def check_finite(name: str, value, *, minimum: float | None = None, maximum: float | None = None,
                 strict_min: bool = False) -> float:
    """Return ``value`` as float; raise ``ValueError`` if it is not a finite real in the allowed range."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value <= minimum if strict_min else value < minimum):
        op = ">" if strict_min else ">="
        rng = f"{op} {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise ValueError(f"{name} must be {rng}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def batch_choices(batch: int) -> str:
    """The batch sizes that broadcast against ``batch`` rows, for a message: ``"1"`` or ``"1 or 4"``."""
    return "1" if batch == 1 else f"1 or {batch}"


def as_positions(positions, batch: int | None = None, seq: int | None = None,
                 device: torch.device | None = None) -> torch.Tensor:
    """Normalise positions to a LongTensor ``[batch, seq]``.

    Accepts ``None`` (0..seq-1), a 1-D ``[seq]`` tensor (shared by every row) or ``[batch, seq]``.
    Negative positions are refused: every scheme here measures distance from the first token.
    """
    import torch
    if positions is None:
        if seq is None:
            raise ValueError("positions is None and seq is unknown")
        positions = torch.arange(seq, device=device)
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype == torch.bool:
        raise ValueError("positions must be integers, got a bool tensor (True would count as position 1)")
    if positions.is_floating_point():
        raise ValueError("positions must be integers (they stay integers until multiplied by inv_freq)")
    positions = positions.long()
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)  # [1, seq]
    if positions.dim() != 2:
        raise ValueError(f"positions must be [seq] or [batch, seq], got shape {tuple(positions.shape)}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
    shape = tuple(positions.shape)
    hint = ("; a [seq, n_axes] tensor such as grid_positions(...) is for a scheme with a multi-axis part "
            "(rope_2d, rope_mixed, mrope)" if seq is not None and shape[0] == seq != shape[1] else "")
    if batch is not None and positions.shape[0] not in (1, batch):
        raise ValueError(f"positions must be [seq] or [batch, seq] with batch {batch_choices(batch)}"
                         f"{'' if seq is None else f' and seq {seq}'}, got shape {shape}{hint}")
    if seq is not None and positions.shape[1] != seq:
        raise ValueError(f"positions has length {positions.shape[1]}, expected {seq}{hint}")
    if batch is not None and positions.shape[0] == 1 and batch > 1:
        positions = positions.expand(batch, -1)
    return positions


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float = 1e-5, atol: float = 1e-6,
                 name: str = "tensor") -> None:
    """``torch.testing.assert_close`` on whole tensors, with max and mean |diff| in the message."""
    import torch
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    a = actual.detach().double()
    e = expected.detach().double()
    diff = (a - e).abs()
    finite = torch.isfinite(diff)
    bad = (~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=False)) & ~(
        torch.isinf(a) & torch.isinf(e) & (a.sign() == e.sign()))
    if bad.any():
        d = diff[finite]
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{bad.numel()} elements differ beyond rtol={rtol}, atol={atol}; "
            f"max |diff| {float(d.max()) if d.numel() else float('nan'):.3e}, "
            f"mean |diff| {float(d.mean()) if d.numel() else float('nan'):.3e}, "
            f"max |expected| {float(e.abs().max()):.3e}"
        )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - e| / max |e| (the measure the acceptance criteria quote)."""
    a, e = actual.detach().double(), expected.detach().double()
    return float((a - e).abs().max() / e.abs().max().clamp_min(1e-30))
