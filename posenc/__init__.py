"""posenc: positional encodings and length extrapolation for transformers.

One composable, typed API (:class:`PositionScheme`) for every method of the seed notes, an
attention engine that executes any scheme (reference / blockwise / FlexAttention paths), a KV
cache that is right under every method, and a lab (``posenc bench``) that measures them.
"""

from posenc.absolute import sinusoidal_table
from posenc.attention import PositionalAttention, attention
from posenc.biases import alibi_slopes, t5_relative_bucket
from posenc.frequencies import RopeFrequencies, rope_frequencies
from posenc.masks import MaskSpec
from posenc.model import LMConfig, TinyLM
from posenc.rotary import apply_rope, xpos_scale
from posenc.scheme import Part, PositionScheme, RopeSpec

__version__ = "0.1.0"

__all__ = [
    "LMConfig",
    "MaskSpec",
    "Part",
    "PositionScheme",
    "PositionalAttention",
    "RopeFrequencies",
    "RopeSpec",
    "TinyLM",
    "alibi_slopes",
    "apply_rope",
    "attention",
    "generate",
    "rope_frequencies",
    "sinusoidal_table",
    "t5_relative_bucket",
    "xpos_scale",
]


def __getattr__(name):  # lazy: generation pulls in the cache machinery
    if name == "generate":
        from posenc.generation import generate

        return generate
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")
