"""Dual Chunk Attention (An et al. 2024, arXiv:2402.17463), all of it: the record, its parameters and per-length
defaults (ChunkLlama's chunk 3L/4 and local window L/16), and its two logit temperatures (ChunkLlama's,
Qwen2.5-1M's). The three branches are :class:`posenc.parts.remap.DualChunk`; the temperature
:class:`posenc.parts.remap.LengthTemperature`."""

from __future__ import annotations

from dataclasses import replace

from posenc.methods.common import set_remap
from posenc.methods.records import Method, Param
from posenc.scheme.part import Part

_TEMPERATURES = {"chunkllama": (0.05, 2.0), "qwen": (0.1, 1.0)}  # dca's temperature forms: (coef, power)


def _dca(m: Method, scheme, temperature="none", temperature_length="query", **params):
    """Dual Chunk Attention's remap, and with ``temperature`` its logit temperature (ChunkLlama's or Qwen2.5-1M's
    :class:`~posenc.parts.remap.LengthTemperature`, n per query or per call: ``temperature_length``)."""
    for name, value in (("temperature", temperature), ("temperature_length", temperature_length)):
        if not m.param(name).contains(value):
            raise ValueError(f"dca.{name} must be one of {m.param(name).choices}, got {value!r}")
    s = set_remap(scheme, m.remap_kind, params, m.filled_defaults)
    if temperature == "none":
        return s
    if scheme.temperature is not None:
        raise ValueError(
            f"{scheme.name!r} already has a query temperature ({scheme.temperature.kind}); temperatures do not stack"
        )
    coef, power = _TEMPERATURES[temperature]
    return replace(
        s,
        temperature=Part(
            "log_length", {"coef": coef, "power": power, "train_len": s.train_len, "length": temperature_length}
        ),
    )


def _dca_chunk(L: int) -> int:
    """ChunkLlama's chunk size: 3/4 of the pretraining length."""
    return max(2, L * 3 // 4)


def _dca_local(L: int) -> int:
    """ChunkLlama's local window: 1/16 of the pretraining length (below the chunk)."""
    return min(L // 16, _dca_chunk(L) - 1)


RECORDS = (
    Method(
        name="dca",
        kind="remap",
        description="An et al. 2024: Dual Chunk Attention (intra / successive / inter-chunk positions); "
        "temperature= ChunkLlama's or Qwen2.5-1M's logit temperature",
        paper="arXiv:2402.17463",
        apply=_dca,
        params=(
            Param(
                name="chunk",
                rule="train_len * 3 // 4",
                minimum=1,
                integer=True,
                filled=True,
                from_train_len=_dca_chunk,
                original="chunk_size (pretraining_length * 3 // 4)",
            ),
            Param(
                name="local",
                rule="train_len // 16",
                minimum=0,
                integer=True,
                filled=True,
                from_train_len=_dca_local,
                original="local_window (replace_with_chunkllama's default: pretraining_length // 8)",
            ),
            Param(
                name="temperature",
                default="none",
                choices=("none", "chunkllama", "qwen"),
                original="chunkllama: get_mscale 0.05 ln(n/L) + 1 on q and k; qwen: vLLM's 0.1 ln(n/L) + 1",
            ),
            Param(
                name="temperature_length",
                default="query",
                choices=("query", "sequence"),
                original="n = kv_seq_len of the call (ChunkLlama's prefill: 'sequence')",
            ),
        ),
        sets=("remap",),
        remap_kind="dca",
        original="HKUNLP/ChunkLlama chunkllama_attn_replace.py",
        eval_defaults=lambda L, n, d, b: {"chunk": _dca_chunk(L), "local": _dca_local(L)},
    ),
)
