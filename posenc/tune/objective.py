"""The objective ``posenc tune`` minimises: the long-context suite's two measures on held-out contexts.

For each candidate (a method and its parameters) the model is extended (:func:`posenc.hf.patch.extend`) and every
tune context, built by the suite (:func:`posenc.hf.suite.context.build_context`: a Gutenberg test-split ``book``
haystack with needles and a scored target passage, fixed seeds), is prefilled once
(:func:`posenc.hf.suite.run.run_context`), which gives

- ``loss``: the mean next-token loss (nats) of the target passages, the same tokens for every candidate;
- ``retrieval``: the fraction of needle queries answered exactly.

The score (lower is better) is ``loss + weight x (1 - retrieval)`` (``weight`` nats per lost query fraction;
default 1.0, about the loss gap between a working extension and a broken one on SmolLM2), so retrieval decides
between candidates that differ in it, and perplexity among those that retrieve alike (LongRoPE searches on
perplexity, arXiv:2402.13753; LongRoPE2 on needle-driven perplexity, arXiv:2502.20082).

Each (candidate, context) result is a cell of a :class:`posenc.lab.cells.CellStore` keyed by everything it depends
on (model, method, parameters, length, context, seed, objective version), so an interrupted tune resumes without
re-running a finished prefill, and a second tune with the same contexts reuses every cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posenc.lab.stats import mean_interval, wilson

__all__ = ["TUNE_VERSION", "TuneObjective", "candidate_record"]

TUNE_VERSION = 1


@dataclass
class TuneObjective:
    """The suite objective of one model at one ``length`` (module docstring). ``source``: a Hugging Face folder,
    a ``.gguf`` file or ``"smollm2"`` (:mod:`posenc.hf.source`); ``contexts``: ``(generators, seed)`` pairs of
    book-haystack contexts with a ``target``-token scored passage; ``cells``: the folder of the cell store."""

    source: str
    length: int
    cells: Path
    contexts: tuple = (("passkey", 0), ("niah", 1))
    target: int = 256
    weight: float = 1.0
    forwards: int = field(default=0, init=False)  # prefills run (not read from the store) by this object
    _facts: object = field(default=None, init=False, repr=False)
    _model: object = field(default=None, init=False, repr=False)
    _built: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        from posenc._util import check_positive_int
        from posenc.lab.cells import CellStore

        self.length = check_positive_int("length", self.length)
        if not self.contexts:
            raise ValueError("contexts must hold at least one (generators, seed) pair")
        if not self.weight >= 0:
            raise ValueError(f"weight must be >= 0, got {self.weight!r}")
        self.store = CellStore(self.cells)

    # ---------------------------------------------------------------------------------------------- model
    @property
    def facts(self):
        """The model's folder, tokenizer, trained length, head dim and RoPE base
        (:class:`~posenc.hf.suite.spec.ModelFacts`)."""
        if self._facts is None:
            from posenc.hf.suite.spec import load_facts

            self._facts = load_facts(self.source)
        return self._facts

    def _loaded(self):
        if self._model is None:
            import torch

            from posenc.hf.patch import load

            self._model = load(self.facts.folder, dtype=torch.float32).eval()
        return self._model

    def _context(self, generators: str, seed: int):
        from posenc.hf.suite.cells import _HAYSTACKS
        from posenc.hf.suite.context import build_context
        from posenc.hf.suite.haystack import make_haystack

        key = (generators, seed)
        if key not in self._built:
            hay = _HAYSTACKS.get("book") or _HAYSTACKS.setdefault("book", make_haystack("book", self.facts.tokenizer))
            ctx = build_context(self.facts.tokenizer, hay, self.length, tuple(generators.split("+")), seed,
                                self.target)
            ctx.check(self.facts.tokenizer)
            self._built[key] = ctx
        return self._built[key]

    def key(self, method: str, params: dict, generators: str, seed: int) -> dict:
        """The cell key of one (candidate, context)."""
        return {"tune": TUNE_VERSION, "model": self.facts.model_id, "method": method, "params": params,
                "length": self.length, "haystack": "book", "generators": generators, "seed": seed,
                "target": self.target}

    def pending(self, method: str, params: dict) -> int:
        """How many prefills evaluating this candidate still needs (0: every cell is stored)."""
        return sum(self.store.get(self.key(method, params, g, s)) is None for g, s in self.contexts)

    # ---------------------------------------------------------------------------------------------- evaluate
    def evaluate(self, method: str, params: dict) -> dict:
        """The candidate's :func:`candidate_record`, every missing cell computed (one prefill each) and stored."""
        from posenc.hf.patch import extend, unextend
        from posenc.hf.suite.run import run_context

        cells = []
        model = None
        try:
            for g, s in self.contexts:
                k = self.key(method, params, g, s)
                v = self.store.get(k)
                if v is None:
                    if model is None:
                        model = extend(self._loaded(), method, **params)
                    r = run_context(model, self.facts.tokenizer, self._context(g, s))
                    v = {"loss": r["target"]["loss"], "answers": [{"kind": a["kind"], "correct": a["correct"]}
                                                                   for a in r["answers"]],
                         "prefill_s": r["prefill_s"]}
                    self.store.put(k, v)
                    self.forwards += 1
                cells.append(v)
        finally:
            if model is not None and getattr(model, "_posenc_extended", None):
                unextend(model)
        return candidate_record(method, params, cells, self.weight)


def candidate_record(method: str, params: dict, cells: list[dict], weight: float) -> dict:
    """One candidate's row: ``loss`` (mean over contexts, with a t interval over them), ``ppl = exp(loss)``,
    ``retrieval`` (exact-match fraction with its Wilson interval), ``score = loss + weight x (1 - retrieval)``."""
    import math

    losses = [c["loss"] for c in cells]
    hits = [a["correct"] for c in cells for a in c["answers"]]
    li = mean_interval(losses, over="contexts")
    ri = wilson(sum(hits), len(hits))
    rate = sum(hits) / len(hits) if hits else 0.0
    loss = sum(losses) / len(losses)
    li, ri = li.to_dict(), ri.to_dict()  # NaN ends (one context) as None, for JSON
    return {"method": method, "params": params, "loss": loss, "loss_lo": li["lo"], "loss_hi": li["hi"],
            "ppl": math.exp(loss), "retrieval": rate, "retrieval_lo": ri["lo"], "retrieval_hi": ri["hi"],
            "queries": len(hits), "contexts": len(cells), "score": loss + weight * (1.0 - rate),
            "prefill_s": sum(c.get("prefill_s", 0.0) for c in cells)}
