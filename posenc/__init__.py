"""posenc: positional encodings and length extrapolation for transformers.

One composable, typed API (:class:`PositionScheme`) for the published methods, an attention engine that executes
any scheme (reference / blockwise / FlexAttention paths), a KV cache that is right under every method, and a lab
(``posenc bench``) that measures them.

The names below are imported on first use (module ``__getattr__``): ``import posenc`` alone imports neither torch
nor transformers, so ``posenc --help`` and ``posenc --version`` start at once.
"""

from typing import TYPE_CHECKING

from posenc import _moved
from posenc._version import __version__ as __version__

if TYPE_CHECKING:  # the names for type checkers and the API reference; at run time __getattr__ imports them
    from posenc.engine import PositionalAttention, attention
    from posenc.models.generation import generate
    from posenc.models.tinylm import LMConfig, TinyLM
    from posenc.parts.absolute import sinusoidal_table
    from posenc.parts.biases import alibi_slopes, t5_relative_bucket
    from posenc.parts.frequencies import RopeFrequencies, rope_frequencies
    from posenc.parts.masks import MaskSpec
    from posenc.parts.multiaxis import grid_positions
    from posenc.parts.rotary import apply_rope, xpos_scale
    from posenc.scheme.core import Part, PositionScheme, RopeSpec

#: public name -> the module that defines it (imported when the name is first read)
_PUBLIC = {
    "LMConfig": "posenc.models.tinylm",
    "MaskSpec": "posenc.parts.masks",
    "Part": "posenc.scheme.core",
    "PositionScheme": "posenc.scheme.core",
    "PositionalAttention": "posenc.engine",
    "RopeFrequencies": "posenc.parts.frequencies",
    "RopeSpec": "posenc.scheme.core",
    "TinyLM": "posenc.models.tinylm",
    "alibi_slopes": "posenc.parts.biases",
    "apply_rope": "posenc.parts.rotary",
    "attention": "posenc.engine",
    "generate": "posenc.models.generation",
    "grid_positions": "posenc.parts.multiaxis",
    "rope_frequencies": "posenc.parts.frequencies",
    "sinusoidal_table": "posenc.parts.absolute",
    "t5_relative_bucket": "posenc.parts.biases",
    "xpos_scale": "posenc.parts.rotary",
}

__all__ = ["LMConfig", "MaskSpec", "Part", "PositionScheme", "PositionalAttention", "RopeFrequencies", "RopeSpec",
           "TinyLM", "alibi_slopes", "apply_rope", "attention", "generate", "grid_positions", "rope_frequencies",
           "sinusoidal_table", "t5_relative_bucket", "xpos_scale"]


_moved.install()  # old import paths of moved modules: one more release, one FutureWarning


def __getattr__(name):
    """A public name, imported from its module on first use and kept in the package's namespace."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
