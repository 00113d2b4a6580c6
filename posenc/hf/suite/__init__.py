"""A long-context evaluation suite for Hugging Face models, offline, in the spirit of RULER (arXiv 2404.06654).

- :mod:`~posenc.hf.suite.haystack`: the text needles hide in (Gutenberg prose, or Landmark's noise);
- :mod:`~posenc.hf.suite.tasks`: the task generators (pass key, multi-key / multi-query / multi-value needles,
  variable tracking, common words) and their chance levels;
- :mod:`~posenc.hf.suite.context`: one context of a given length, the same needles and target passage at every
  length, with its checks;
- :mod:`~posenc.hf.suite.run`: one prefill answers every query of a context (cache rewound per query) and scores
  the target passage's perplexity from the same forward;
- :mod:`~posenc.hf.suite.spec`: presets, contexts and cell keys as plain data;
- :mod:`~posenc.hf.suite.grid`, :mod:`~posenc.hf.suite.cells`: the method x length x context x seed grid,
  resumable cell by cell; :mod:`~posenc.hf.suite.calibration`: parameters found on the model (DuoAttention's heads);
- :mod:`~posenc.hf.suite.results`, :mod:`~posenc.hf.suite.report`: records, effective lengths, the report;
- :mod:`~posenc.hf.suite.presets`: ``smollm2`` (short) and ``smollm2_full`` on the real model posenc installs.

``posenc bench --preset smollm2 --out DIR`` runs a preset; ``--model`` points it at another model (a folder or a
GGUF file).
"""

from posenc.hf.suite.grid import run_suite
from posenc.hf.suite.presets import SUITE_PRESETS
from posenc.hf.suite.spec import ContextSpec, SuitePreset

__all__ = ["ContextSpec", "SUITE_PRESETS", "SuitePreset", "run_suite"]
