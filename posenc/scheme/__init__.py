"""The scheme: :class:`PositionScheme`, the typed, composable description of how a model encodes position
(trained parts plus inference-time methods, whose records are :mod:`posenc.methods`), its parts (:class:`Part`) and
per-layer patterns (``pattern``)."""

from posenc.scheme.core import TRAINED, PositionScheme, RopeSpec
from posenc.scheme.part import Part

__all__ = ["TRAINED", "Part", "PositionScheme", "RopeSpec"]
