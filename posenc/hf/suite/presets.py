"""The long-context suite's presets on the real model posenc installs (SmolLM2-135M-Instruct, trained at 8192).

- ``smollm2``: the short version (README quickstart, ~45 minutes on 2 idle cores): the untouched model and seven
  methods at 4k, 8k and 16k;
- ``smollm2_full``: every training-free method that applies to a RoPE model, the 2024 ones included (STRING,
  Resonance RoPE, DCA with ChunkLlama's and Qwen2.5-1M's temperatures, InfLLM-style block retrieval, DuoAttention
  with heads calibrated on the model), at 4k, 8k, 16k and 32k: hours; the run is resumable cell by cell and can be
  completed over several sittings. At 32k a method runs only if its retrieval at 16k reached the threshold, on one
  book and one pass-key context per method (32k prefills cost about four times 16k's).

Contexts: a book context (Gutenberg prose) holding the multi-key/multi-query needles and ending with a 512-token
target passage (perplexity), pass-key contexts in Landmark's noise haystack, and (full, up to 16k) a noise context
with the multi-value, variable-tracking and common-word tasks. Method parameters follow the length
(:func:`posenc.hf.suite.grid.method_params`: ``factor = n / 8192``, SelfExtend's group, DCA's chunk 6144 and local
512, the windows at 8192, ...); the dynamic schedules recompute their length every 512 positions (``step``), which
keeps cached decoding equal to the full forward and costs the engine one call per 512 queries instead of one per
query.
"""

from __future__ import annotations

from posenc.hf.suite.grid import ContextSpec, SuitePreset

__all__ = ["SUITE_PRESETS"]

_BOOK = ContextSpec("book", ("niah",), seeds=1, target=512)
_PASSKEY = ContextSpec("noise", ("passkey",), seeds=2)
_DYNAMIC_STEP = {"dynamic_ntk": {"step": 512}, "dynamic_yarn": {"step": 512}, "dynamic_ntk_qwen": {"step": 512}}
_LONG = 16384  # the full preset's second seeds and its aggregation context stop here

SUITE_PRESETS: dict[str, SuitePreset] = {p.name: p for p in (
    SuitePreset(
        "smollm2", "SmolLM2-135M (trained at 8k): untouched + 7 methods at 4k, 8k, 16k; ~45 min on 2 idle cores",
        lengths=(4096, 8192, 16384),
        methods=("none", "yarn", "ntk", "dynamic_ntk", "selfextend", "dca", "rerope+logn", "streaming_llm"),
        contexts=(_BOOK, _PASSKEY), reference_length=8192, params=_DYNAMIC_STEP),
    SuitePreset(
        "smollm2_full", "SmolLM2-135M (trained at 8k): every training-free RoPE method at 4k-32k; hours, resumable",
        lengths=(4096, 8192, 16384, 32768),
        methods=("none", "pi", "ntk", "ntk_mixed", "dynamic_ntk", "yarn", "dynamic_yarn", "llama3", "rerope",
                 "leaky_rerope", "selfextend", "dca", "dca@chunkllama", "dca@qwen", "string", "resonance",
                 "resonance+yarn", "rerope+logn", "ntk_mixed+logn", "streaming_llm", "lm_infinite", "sliding_window",
                 "retrieval", "duo"),
        contexts=(_BOOK, ContextSpec("noise", ("passkey",), seeds=1),
                  ContextSpec("book", ("niah",), seeds=1, target=512, first_seed=1, max_length=_LONG),
                  ContextSpec("noise", ("passkey",), seeds=1, first_seed=1, max_length=_LONG),
                  ContextSpec("noise", ("mv", "vt", "cwe"), seeds=1, max_length=_LONG)),
        reference_length=8192, prune_from=32768,
        params={**_DYNAMIC_STEP, "dca@chunkllama": {"temperature": "chunkllama"}, "dca@qwen": {"temperature": "qwen"},
                "duo": {"streaming": "calibrate"}}),
)}
