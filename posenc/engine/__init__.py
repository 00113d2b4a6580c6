"""Layer 3, the engine: executes any :class:`~posenc.scheme.PositionScheme` as attention, on the
fastest backend that computes the reference's answer for the call.

Modules: :mod:`~posenc.engine.parts` (a layer's runtime parts), :mod:`~posenc.engine.call` (one call as
the backends see it), :mod:`~posenc.engine.scores` (rotation, scores and softmax shared by backends),
:mod:`~posenc.engine.backends` (one module per execution path), :mod:`~posenc.engine.dispatch` (the
``auto`` choice, fallbacks, :func:`run_attention`; its docstring describes every path),
:mod:`~posenc.engine.functional` (:func:`attention`), :mod:`~posenc.engine.module`
(:class:`PositionalAttention`), :mod:`~posenc.engine.toeplitz` (the strided Toeplitz kernel),
:mod:`~posenc.engine.keystore` (:class:`KeyStore`: a layer's rotated keys kept across calls).
"""

from posenc.engine.backends import BACKENDS, Backend, build_block_mask
from posenc.engine.call import AttentionCall
from posenc.engine.dispatch import (
    AUTO_ORDER,
    FALLBACKS,
    IMPLS,
    check_inputs,
    choose_backend,
    make_call,
    run_attention,
    run_backend,
)
from posenc.engine.functional import attention
from posenc.engine.keystore import KeyStore
from posenc.engine.module import PositionalAttention
from posenc.engine.parts import AttentionParts

__all__ = ["AUTO_ORDER", "BACKENDS", "FALLBACKS", "IMPLS", "AttentionCall", "AttentionParts", "Backend",
           "KeyStore", "PositionalAttention", "attention", "build_block_mask", "check_inputs", "choose_backend",
           "make_call", "run_attention", "run_backend"]
