"""``posenc tune``: pick and fit the length extension of a model on the long-context suite's objective, with
LongRoPE's evolutionary search of per-dimension factors, and save the winner where serving engines read it.

- :mod:`~posenc.evals.tune.factors`: LongRoPE's factor vectors (PI / NTK / YaRN initialisations, the monotonicity
  constraint) and the evolutionary search (arXiv:2402.13753);
- :mod:`~posenc.evals.tune.objective`: the suite objective (target-passage loss + needle retrieval), cell by cell;
- :mod:`~posenc.evals.tune.search`: the method / parameter grid, the search, the ranked table, the saved winner;
- :mod:`~posenc.evals.tune.gguf_rope`: the winner's RoPE schedule as llama.cpp GGUF keys (``gguf``'s writer and reader).
"""

from posenc.evals.tune.factors import evolve, initial_factors, is_monotone
from posenc.evals.tune.search import method_candidates, tune

__all__ = ["evolve", "initial_factors", "is_monotone", "method_candidates", "tune"]
