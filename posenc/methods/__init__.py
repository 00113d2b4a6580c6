"""The methods: one record per method (:class:`Method`, :class:`Param`: what it sets, its parameters with their
ranges and per-length defaults, its paper, its Hugging Face type, the original implementation its parameters map to),
grouped by family, one module each (``schedules``, ``remaps``, ``dca``, ``retrieval``, ``masks``, ``scales``,
``embeddings``, ``trained``; how they apply: ``common``), the registry and the one ``"a+b"`` parser (``registry``)
and the conventions table (``conventions``). The formulas live with the parts (:mod:`posenc.parts`)."""

from posenc.methods.records import LengthDefaults, Method, Param
from posenc.methods.registry import (
    HF_ONLY,
    METHODS,
    NONE,
    TRAINED_METHODS,
    UnknownMethodError,
    check_method_params,
    hf_methods,
    is_identity,
    length_defaults,
    lookup,
    method_params,
    method_spec,
    parse_methods,
    split_spec,
)

__all__ = ["HF_ONLY", "METHODS", "NONE", "TRAINED_METHODS", "LengthDefaults", "Method", "Param",
           "UnknownMethodError", "check_method_params", "hf_methods", "is_identity", "length_defaults", "lookup",
           "method_params", "method_spec", "parse_methods", "split_spec"]
