"""Layer 2, the scheme: :class:`PositionScheme`, the typed, composable description of how a model
encodes position (trained parts plus inference-time methods), and the method registry."""

from posenc.scheme.core import METHODS, TRAINED, Part, PositionScheme, RopeSpec

__all__ = ["METHODS", "TRAINED", "Part", "PositionScheme", "RopeSpec"]
