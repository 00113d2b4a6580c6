"""Layer 3, the engine: executes any :class:`~posenc.scheme.PositionScheme` as attention, on the
fastest backend that computes the reference's answer for the call."""

from posenc.engine.attention import PositionalAttention, attention

__all__ = ["PositionalAttention", "attention"]
