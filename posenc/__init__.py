"""posenc: positional encodings and length extrapolation for transformers.

One composable, typed API (:class:`PositionScheme`) for the published methods, an
attention engine that executes any scheme (reference / blockwise / FlexAttention paths), a KV
cache that is right under every method, and a lab (``posenc bench``) that measures them.
"""

from posenc import _moved
from posenc._version import __version__ as __version__
from posenc.engine import PositionalAttention, attention
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.parts.absolute import sinusoidal_table
from posenc.parts.biases import alibi_slopes, t5_relative_bucket
from posenc.parts.frequencies import RopeFrequencies, rope_frequencies
from posenc.parts.masks import MaskSpec
from posenc.parts.multiaxis import grid_positions
from posenc.parts.rotary import apply_rope, xpos_scale
from posenc.scheme.core import Part, PositionScheme, RopeSpec

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
    "grid_positions",
    "rope_frequencies",
    "sinusoidal_table",
    "t5_relative_bucket",
    "xpos_scale",
]


_moved.install()  # old import paths of moved modules: one more release, one FutureWarning


def __getattr__(name):  # lazy: generation pulls in the cache machinery
    if name == "generate":
        from posenc.models.generation import generate

        return generate
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")
