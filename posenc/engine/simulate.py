"""CUDA's engine paths, run on the CPU: :func:`device_paths` makes the engine take, on CPU tensors, the routes it
takes on a GPU, with reference kernels in place of the GPU ones, so everything but the kernels themselves can be
checked (and debugged) on a machine without a GPU.

- **Pieces through the device layout.** On CUDA the fused log-sum-exp pieces (band, chunks, sinks, retrieved and
  the Toeplitz kernel, for a few queries) run on the memory-efficient kernel through
  :func:`posenc.engine.pieces.device_lse`: GQA query heads packed as rows or keys repeated, biases copied into
  aligned rows. Here the same layout code runs with :func:`posenc.engine.pieces.math_lse` as the kernel.
- **Flex with log-sum-exp.** On CUDA compiled flex returns its rows' log-sum-exp, so one flex call per remap branch
  merged by log-sum-exp runs every multi-branch remap (:mod:`posenc.engine.backends.flex`); compiled CPU flex in
  torch 2.13 returns none. Here flex is the eager ``flex_attention`` (the same block masks and ``score_mod``).

What the simulation does not do is the dispatch's device test itself: the pieces backends still take any number
of queries on CPU tensors (on CUDA they take a decode step's few), so a simulated run computes every route the
GPU may take, and more. Used by ``benchmarks/gpu/run.py --dry-run`` and ``tests/engine/test_simulate.py``.
"""

from __future__ import annotations

import contextlib
import warnings

from posenc.engine import pieces
from posenc.engine import toeplitz as toeplitz_kernel
from posenc.engine.backends import flex as flex_backend

__all__ = ["device_paths", "device_pieces", "flex_with_lse"]


def _device_kernel(q, k, v, bias):
    return pieces.device_lse(pieces.math_lse, q, k, v, bias)


@contextlib.contextmanager
def device_pieces():
    """Every fused log-sum-exp piece through the device layout (:func:`posenc.engine.pieces.device_lse`)."""
    saved = pieces.fused_lse, toeplitz_kernel.fused_lse
    pieces.fused_lse = toeplitz_kernel.fused_lse = _device_kernel
    try:
        yield
    finally:
        pieces.fused_lse, toeplitz_kernel.fused_lse = saved


@contextlib.contextmanager
def flex_with_lse():
    """Flex as on CUDA (log-sum-exp, GQA read as is, multi-branch remaps), computed by eager ``flex_attention``."""
    from torch.nn.attention.flex_attention import flex_attention

    saved = flex_backend._compiled_flex, flex_backend.returns_lse
    flex_backend._compiled_flex = lambda device_type="cpu": flex_attention
    flex_backend.returns_lse = lambda device: True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()": on purpose here
            yield
    finally:
        flex_backend._compiled_flex, flex_backend.returns_lse = saved


@contextlib.contextmanager
def device_paths():
    """Both of the above."""
    with device_pieces(), flex_with_lse():
        yield
