"""A long-context evaluation suite for Hugging Face models, offline, in the spirit of RULER (arXiv 2404.06654).

- :mod:`~posenc.tasks.haystack`: the text needles hide in (Gutenberg prose, or Landmark's noise);
- :mod:`~posenc.tasks.ruler`: the task generators (pass key, multi-key / multi-query / multi-value needles,
  variable tracking, common words) and their chance levels;
- :mod:`~posenc.tasks.context`: one context of a given length, the same needles and target passage at every
  length, with its checks;
- :mod:`~posenc.evals.suite.prefill`: one prefill answers every query of a context (cache rewound per query) and scores
  the target passage's perplexity from the same forward;
- :mod:`~posenc.evals.suite.spec`: presets, contexts and cell keys as plain data;
- :mod:`~posenc.evals.suite.grid`, :mod:`~posenc.evals.suite.runner`: the method x length x context x seed grid,
  resumable cell by cell; :mod:`~posenc.evals.suite.calibration`: parameters found on the model (DuoAttention's heads);
- :mod:`~posenc.evals.suite.results`, :mod:`~posenc.evals.report.suite`: records, effective lengths, the report;
- :mod:`~posenc.evals.suite.presets`: ``smollm2`` (short) and ``smollm2_full`` on the real model posenc installs.

``posenc bench --preset smollm2 --out DIR`` runs a preset; ``--model`` points it at another model (a folder or a
GGUF file).
"""

from posenc.evals.suite.grid import run_suite
from posenc.evals.suite.presets import SUITE_PRESETS
from posenc.evals.suite.spec import ContextSpec, SuitePreset

__all__ = ["ContextSpec", "SUITE_PRESETS", "SuitePreset", "run_suite"]
