"""Layer 2, the scheme: :class:`PositionScheme`, the typed, composable description of how a model
encodes position (trained parts plus inference-time methods), and the method registry
(:mod:`posenc.scheme.methods`)."""

from posenc.scheme.core import TRAINED, PositionScheme, RopeSpec
from posenc.scheme.methods import METHODS, Method, Param, parse_methods
from posenc.scheme.part import Part

__all__ = ["METHODS", "TRAINED", "Method", "Param", "Part", "PositionScheme", "RopeSpec", "parse_methods"]
