"""The objective ``posenc tune`` minimises: the long-context suite's two measures on held-out contexts.

For each candidate (a method and its parameters) the model is extended (:func:`posenc.hf.patch.extend`) and every
tune context, built by the suite (:func:`posenc.tasks.context.build_context`, fixed seeds), is prefilled once
(:func:`posenc.evals.suite.prefill.run_context`). A context is ``(haystack, generators, seed)``: a ``book`` haystack
(Gutenberg test-split prose) or a ``book_heldout`` one (other books: the train split) ends with a ``target``-token
scored passage, a ``noise`` haystack (Landmark's repeated filler, the pass-key setting small models solve) has none.
Together they give

- ``loss``: the mean next-token loss (nats) of the target passages of the book contexts, the same tokens for every
  candidate, with a 95% t interval over those contexts (over the 64-token blocks of the one passage where there
  is one book context);
- ``retrieval``: the fraction of needle queries of every context answered exactly, with its Wilson interval.

The score (lower is better) is ``loss + weight x (1 - retrieval)`` (``weight`` nats per lost query fraction;
default 1.0, about the loss gap between a working extension and a broken one on SmolLM2), so retrieval decides
between candidates that differ in it, and perplexity among those that retrieve alike (LongRoPE searches on
perplexity, arXiv:2402.13753; LongRoPE2 on needle-driven perplexity, arXiv:2502.20082). The default contexts are a
book pass key (the loss) and a noise pass key (retrieval), **held out from the suite's**: the book one reads other
books than any suite context (``book_heldout``), so it shares no haystack window and no target passage with one,
and the noise one takes seed :data:`HELD_OUT_SEED`, which no suite preset draws (their seeds start at 0), so its
key and depth are others; a tune's recommendation can then be checked on the suite's keys. At 16k, SmolLM2-135M
answers the noise pass key under SelfExtend and YaRN and not untouched, while it misses book-haystack needles under
every method (the committed suite cells), so a book needle alone would add a constant, not a signal.

Each (candidate, context) result is a cell of a :class:`posenc.runtime.cells.CellStore` keyed by everything it depends
on (model, method, parameters, length, context, seed, objective version), so an interrupted tune resumes without
re-running a finished prefill, and a second tune with the same contexts reuses every cell; a stored cell whose value
is damaged (:func:`cell_is_whole` says no) reads as missing and is computed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posenc.evals.stats.intervals import mean_interval, wilson
from posenc.tasks.haystack import HAYSTACKS, SCORED

__all__ = ["DEFAULT_CONTEXTS", "HELD_OUT_SEED", "TUNE_VERSION", "TuneObjective", "candidate_record", "cell_is_whole",
           "context_triples"]

TUNE_VERSION = 2
"""Bumped when a cell's value changes meaning (2: haystacks per context, the target's block losses kept)."""

HELD_OUT_SEED = 1000
"""The seed of the default noise context: suite presets draw seeds from 0 up, far below it."""
DEFAULT_CONTEXTS = (("book_heldout", "passkey", 0), ("noise", "passkey", HELD_OUT_SEED))


def context_triples(contexts) -> tuple[tuple[str, str, int], ...]:
    """``contexts`` as ``(haystack, generators, seed)`` triples (a ``(generators, seed)`` pair is a book context);
    ``ValueError`` for an unknown haystack or without a book context (its target passage is the loss)."""
    out = []
    for c in contexts:
        c = tuple(c)
        if len(c) == 2:
            c = ("book", *c)
        if len(c) != 3 or c[0] not in HAYSTACKS or not isinstance(c[1], str) or not isinstance(c[2], int):
            raise ValueError(f"a tune context is (haystack, generators, seed) with haystack one of {HAYSTACKS} "
                             f"(or (generators, seed): a book context), got {c!r}")
        out.append((c[0], c[1], int(c[2])))
    if not out:
        raise ValueError("contexts must hold at least one (haystack, generators, seed) context")
    if not any(h in SCORED for h, _, _ in out):
        raise ValueError(f"contexts need a book context ({' or '.join(sorted(SCORED))}): its target passage is the "
                         f"loss (noise haystacks have none)")
    return tuple(dict.fromkeys(out))


@dataclass
class TuneObjective:
    """The suite objective of one model at one ``length`` (module docstring). ``source``: a Hugging Face folder,
    a ``.gguf`` file, a lab run or ``"smollm2"`` (:mod:`posenc.hf.source`); ``contexts``: ``(haystack, generators,
    seed)`` triples (:func:`context_triples`), the book ones with a ``target``-token scored passage; ``cells``: the
    folder of the cell store; ``device``/``dtype``: what the model runs on and with (``"auto"``: float32 on the CPU,
    bfloat16 on CUDA), named in a cell's key unless they are the CPU and float32."""

    source: str
    length: int
    cells: Path
    contexts: tuple = DEFAULT_CONTEXTS
    target: int = 256
    weight: float = 1.0
    device: str = "cpu"
    dtype: str = "auto"
    forwards: int = field(default=0, init=False)  # prefills run (not read from the store) by this object
    _facts: object = field(default=None, init=False, repr=False)
    _model: object = field(default=None, init=False, repr=False)
    _built: dict = field(default_factory=dict, init=False, repr=False)
    _hay: dict = field(default_factory=dict, init=False, repr=False)  # haystack name -> tokens (this model's)

    def __post_init__(self):
        from posenc._util import check_device, check_dtype, check_positive_int
        from posenc.runtime.cells import CellStore

        self.length = check_positive_int("length", self.length)
        self.device = check_device("device", self.device)
        self.dtype = check_dtype("dtype", self.dtype, self.device)
        self.contexts = context_triples(self.contexts)
        if not self.weight >= 0:
            raise ValueError(f"weight must be >= 0, got {self.weight!r}")
        self.store = CellStore(self.cells, check=cell_is_whole)

    # ---------------------------------------------------------------------------------------------- model
    @property
    def facts(self):
        """The model's folder, tokenizer, trained length, head dim and RoPE base
        (:class:`~posenc.evals.suite.spec.ModelFacts`)."""
        if self._facts is None:
            from posenc.evals.suite.spec import load_facts

            self._facts = load_facts(self.source, self.device, self.dtype)
        return self._facts

    def _loaded(self):
        if self._model is None:
            self._model = self.facts.load()  # on the device, with the dtype
        return self._model

    def _context(self, haystack: str, generators: str, seed: int):
        from posenc.tasks.context import build_context
        from posenc.tasks.haystack import make_haystack

        key = (haystack, generators, seed)
        if key not in self._built:
            if haystack not in self._hay:
                self._hay[haystack] = make_haystack(haystack, self.facts.tokenizer)
            ctx = build_context(self.facts.tokenizer, self._hay[haystack], self.length, tuple(generators.split("+")),
                                seed, self.target if haystack in SCORED else 0)
            ctx.check(self.facts.tokenizer)
            self._built[key] = ctx
        return self._built[key]

    def key(self, method: str, params: dict, haystack: str, generators: str, seed: int) -> dict:
        """The cell key of one (candidate, context); the device and dtype only where they are not the CPU and
        float32 (:func:`posenc.evals.suite.spec.runs_on`), so the keys of float32 CPU cells stay as they were."""
        from posenc.evals.suite.spec import runs_on

        return {"tune": TUNE_VERSION, "model": self.facts.model_id, "method": method, "params": params,
                "length": self.length, "haystack": haystack, "generators": generators, "seed": seed,
                "target": self.target if haystack in SCORED else 0, **runs_on(self.device, self.dtype)}

    def pending(self, method: str, params: dict) -> int:
        """How many prefills evaluating this candidate still needs (0: every cell is stored)."""
        return sum(self.store.get(self.key(method, params, *c)) is None for c in self.contexts)

    # ---------------------------------------------------------------------------------------------- evaluate
    def evaluate(self, method: str, params: dict) -> dict:
        """The candidate's :func:`candidate_record`, every missing cell computed (one prefill each) and stored."""
        from posenc.evals.suite.prefill import run_context
        from posenc.hf.patch import unextend

        cells = []
        model = None
        try:
            for c in self.contexts:
                k = self.key(method, params, *c)
                v = self.store.get(k)
                if v is None:
                    if model is None:
                        model = self.facts.extended(self._loaded(), method, params)  # a hybrid: on the engine
                    r = run_context(model, self.facts.tokenizer, self._context(*c))
                    t = r["target"]
                    v = {"loss": t["loss"] if t else None, "block_losses": t["block_losses"] if t else None,
                         "answers": [{"kind": a["kind"], "correct": a["correct"]} for a in r["answers"]],
                         "prefill_s": r["prefill_s"]}
                    self.store.put(k, v)
                    self.forwards += 1
                cells.append(v)
        finally:
            if model is not None and getattr(model, "_posenc_extended", None):
                unextend(model)
        return candidate_record(method, params, cells, self.weight)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def cell_is_whole(v) -> bool:
    """Whether a stored cell value has every field :meth:`TuneObjective.evaluate` writes and
    :func:`candidate_record` reads, of the right type (a value damaged on disk reads as missing)."""
    return (isinstance(v, dict) and (v["loss"] is None or _number(v["loss"]))
            and (v["block_losses"] is None or all(_number(b) for b in v["block_losses"]))
            and isinstance(v["answers"], list)
            and all(isinstance(a["kind"], str) and isinstance(a["correct"], bool) for a in v["answers"])
            and _number(v["prefill_s"]))


def candidate_record(method: str, params: dict, cells: list[dict], weight: float) -> dict:
    """One candidate's row: ``loss`` (mean over the contexts with a target passage, with a t interval over them, or
    over the 64-token blocks of the one passage: ``loss_over``), ``ppl = exp(loss)``, ``retrieval`` (exact-match
    fraction over every context, with its Wilson interval), ``score = loss + weight x (1 - retrieval)``."""
    import math

    scored = [c for c in cells if c.get("loss") is not None]
    if not scored:
        raise ValueError("no cell has a target passage: the loss needs a book context")
    losses = [c["loss"] for c in scored]
    over = "contexts" if len(scored) > 1 else "blocks"
    li = mean_interval(losses if over == "contexts" else scored[0].get("block_losses") or losses, over=over)
    hits = [a["correct"] for c in cells for a in c["answers"]]
    ri = wilson(sum(hits), len(hits))
    rate = sum(hits) / len(hits) if hits else 0.0
    loss = sum(losses) / len(losses)
    li, ri = li.to_dict(), ri.to_dict()  # NaN ends (one value) as None, for JSON
    return {"method": method, "params": params, "loss": loss, "loss_lo": li["lo"], "loss_hi": li["hi"],
            "loss_over": over, "ppl": math.exp(loss), "retrieval": rate, "retrieval_lo": ri["lo"],
            "retrieval_hi": ri["hi"], "queries": len(hits), "contexts": len(cells),
            "score": loss + weight * (1.0 - rate), "prefill_s": sum(c.get("prefill_s", 0.0) for c in cells)}
