"""What a suite run is made of, as plain data: a :class:`ContextSpec` (a haystack and the task generators hidden
in it), a :class:`SuitePreset` (model, lengths, method rows, contexts, how effective length is judged), the
parameters a row runs with at a length (:func:`method_params`), the key of a cell (:func:`cell_key`), the cells
of a preset (:func:`plan`), and the facts about the model a run needs (:class:`ModelFacts`). The run itself is
:mod:`posenc.evals.suite.grid`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

__all__ = ["ContextSpec", "ModelFacts", "SUITE_VERSION", "SuitePreset", "cell_key", "cell_row", "load_facts",
           "method_params", "plan", "runs_on"]

SUITE_VERSION = 1
"""Bumped when anything that changes a cell's result changes (tasks, layout, scoring): part of every cell key."""


@dataclass(frozen=True)
class ContextSpec:
    """One kind of context: ``haystack`` (``book`` or ``noise``) holding the needles of ``generators``; ``seeds``
    contexts of it per (method, length), seeds ``first_seed`` .. ``first_seed + seeds - 1``; ``target`` scored tokens
    at the end (book haystacks; 0: none; ``"L/16"``: the model's trained length over 16, fixed by
    :meth:`SuitePreset.sized`); ``min_length``/``max_length``: used only from / up to this length (None:
    every length; neither is part of a cell's key); ``options``: keyword parameters per generator
    (``{"niah": {"n_keys": 4}}``; the ``keys`` generator's ``bins``, when left out, are the model's
    :func:`posenc.tasks.ruler.key_bins`, filled in by :meth:`SuitePreset.sized`); ``reach``: a book haystack's
    longest context (:meth:`posenc.tasks.haystack.Haystack.window`; None: the default, 64k; set, it is part of
    the cell key: its passages are others); ``methods``: the rows (preset labels) this context is run for (None:
    every row; not part of a cell's key), e.g. more passages for the rows a page compares, where a row's
    perplexity column keeps to the contexts every row runs (:func:`posenc.evals.suite.results.shared_cells`)."""

    haystack: str
    generators: tuple[str, ...]
    seeds: int = 1
    target: int | str = 0
    max_length: int | None = None
    options: dict = field(default_factory=dict)
    first_seed: int = 0
    min_length: int | None = None
    reach: int | None = None
    methods: tuple[str, ...] | None = None

    def used_at(self, length: int, method: str | None = None) -> bool:
        """Whether this context is part of a cell grid at ``length``, for row ``method`` (None: for some row)."""
        return (self.min_length is None or length >= self.min_length) and (
            self.max_length is None or length <= self.max_length) and (
            method is None or self.methods is None or method in self.methods)

    @property
    def seed_range(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)

    @property
    def name(self) -> str:
        return f"{self.haystack}:{'+'.join(self.generators)}"


@dataclass(frozen=True)
class SuitePreset:
    """Everything a suite run depends on (module docstring). ``reference_length``: the untouched model's
    retrieval there is the reference; ``threshold``: the fraction of it a method must keep for a length to count
    as effective; ``params``: fixed parameters per method spec, on top of the per-length ones; ``compare_to``: rows
    every other row is compared with, query by query, past the trained length (paired differences in retrieval,
    :func:`posenc.evals.suite.results.paired_differences`).

    Presets derived from the model (:meth:`sized`): ``length_factors`` gives the lengths as multiples of the
    model's trained length ``L`` (``(0.5, 1, 2, 4)``: L/2, L, 2L, 4L) and makes ``L`` the reference length;
    ``floor``: the untouched model's retrieval at the reference length below which the run refuses to judge any
    method (None: no floor); ``retrieval_kinds``: the query kinds the retrieval score and the verdicts pool (None:
    the informative kinds, :func:`posenc.evals.suite.results.informative_kinds`); ``ppl_bound``: the perplexity
    ratio to the untouched model at the reference length a row must stay under to keep perplexity
    (:mod:`posenc.evals.suite.verdict`).

    Pruning (``prune_from``: from that length on, a row runs only if its verdict at the previous length allows,
    :func:`posenc.evals.suite.grid._pruned`): by default a row is left out once it lost the keys or the perplexity
    there, an undecided row running on; ``prune_unless_extends`` leaves it out unless it extended there, except the
    untouched model and the ``compare_to`` rows, which the paired intervals at that length are taken against."""

    name: str
    description: str
    model: str = "smollm2"
    lengths: tuple[int, ...] = (4096, 8192, 16384)
    methods: tuple[str, ...] = ("none",)
    contexts: tuple[ContextSpec, ...] = ()
    reference_length: int = 4096
    threshold: float = 0.85
    prune_from: int | None = None
    params: dict = field(default_factory=dict)
    chat: bool = False
    threads: int | None = None
    compare_to: tuple[str, ...] = ()
    length_factors: tuple[float, ...] | None = None
    floor: float | None = None
    retrieval_kinds: tuple[str, ...] | None = None
    ppl_bound: float = 1.25
    prune_unless_extends: bool = False

    def __post_init__(self):
        from posenc.methods import is_identity

        if not self.methods or not is_identity(self.methods[0]):
            raise ValueError(f"a suite's first method must be 'none' (the untouched model), got {self.methods[:1]}")
        if self.length_factors is None and self.reference_length not in self.lengths:
            raise ValueError(f"reference_length {self.reference_length} must be one of the lengths {self.lengths}")
        if not self.contexts:
            raise ValueError("a suite needs at least one context")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.prune_unless_extends and (self.prune_from is None or self.retrieval_kinds is None):
            raise ValueError("prune_unless_extends needs prune_from and retrieval_kinds (the interval rule's verdict "
                             "decides which rows run on)")
        unknown = [c for c in self.compare_to if c not in self.methods]
        if unknown:
            raise ValueError(f"compare_to names rows that are not methods of the preset: {unknown}")
        for c in self.contexts:
            unknown = [m for m in c.methods or () if m not in self.methods]
            if unknown:
                raise ValueError(f"context {c.name} names rows that are not methods of the preset: {unknown}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def derived(self) -> bool:
        """Whether the lengths still wait for the model's trained length (:meth:`sized`)."""
        return self.length_factors is not None

    def only(self, methods: tuple[str, ...], lengths: tuple[int, ...]) -> SuitePreset:
        """This preset cut down to the rows ``methods`` at ``lengths`` (e.g. the untouched model at the reference
        length, run first against the floor): ``compare_to`` and each context's rows kept to those methods, and a
        context run for none of them dropped, so the cut preset is valid wherever the whole one is."""
        contexts = tuple(c if c.methods is None else replace(c, methods=tuple(m for m in c.methods if m in methods))
                         for c in self.contexts)
        return replace(self, methods=tuple(methods), lengths=tuple(lengths),
                       compare_to=tuple(m for m in self.compare_to if m in methods),
                       contexts=tuple(c for c in contexts if c.methods is None or c.methods))

    def sized(self, train_len: int, lengths=None) -> SuitePreset:
        """This preset for a model trained at ``train_len`` = ``L``: the lengths ``L x length_factors`` (or
        ``lengths``, with ``L`` added: the reference is the untouched model at ``L``), the reference length ``L``,
        every ``"L/d"`` target ``L // d`` and every ``keys`` context's bins the model's
        (:func:`posenc.tasks.ruler.key_bins`). A preset with fixed lengths keeps them (``lengths``, when given,
        replaces them; its reference length must be among them)."""
        from posenc.tasks.ruler import key_bins

        contexts = tuple(_sized_context(c, train_len, key_bins(train_len)) for c in self.contexts)
        if lengths is not None:
            lengths = tuple(sorted({int(n) for n in lengths} | ({train_len} if self.derived else set())))
        elif self.derived:
            lengths = tuple(sorted({round(train_len * f) for f in self.length_factors}))
        if self.derived:
            return replace(self, lengths=lengths, reference_length=train_len, length_factors=None, contexts=contexts)
        return replace(self, contexts=contexts, **({"lengths": lengths} if lengths is not None else {}))


def _sized_context(spec: ContextSpec, train_len: int, bins) -> ContextSpec:
    target = spec.target
    if isinstance(target, str):
        head, _, div = target.partition("/")
        if head != "L" or not div.isdigit() or int(div) < 1:
            raise ValueError(f"context target must be a token count or 'L/<d>', got {target!r}")
        target = train_len // int(div)
    options = spec.options
    if "keys" in spec.generators and "bins" not in options.get("keys", {}):
        options = {**options, "keys": {**options.get("keys", {}), "bins": [list(b) for b in bins]}}
    return replace(spec, target=target, options=options)


def method_params(method: str, train_len: int, length: int, head_dim: int, base: float, fixed: dict) -> dict:
    """The parameters row ``method`` (a label, :func:`posenc.methods.method_spec`) runs with at ``length``: the
    per-length defaults of its spec, then the preset's fixed ones for the label."""
    from posenc.methods import is_identity, length_defaults, method_spec

    spec = method_spec(method)
    if is_identity(spec):
        return {}
    return {**length_defaults(spec, train_len, length, head_dim=head_dim, base=base, hf=True), **fixed.get(method, {})}


def cell_row(method: str, train_len: int, length: int, head_dim: int, base: float, fixed: dict) -> tuple[str, dict]:
    """``(method, params)`` row ``method``'s cells at ``length`` are keyed and run with: its own label and
    :func:`method_params`, or ``("none", {})`` where those parameters read the length exactly as the untouched model
    does (:func:`posenc.analysis.maps.identity_at`: a scaling factor of 1, a window or exact range no pair reaches;
    at and below the trained length most rows): such a row shares the untouched model's cells there, computed once,
    instead of recomputing the same answers."""
    params = method_params(method, train_len, length, head_dim, base, fixed)
    return ("none", {}) if _same_as_untouched(method, train_len, length, head_dim, base, _frozen(params)) else (
        method, params)


def _frozen(params: dict) -> str:
    import json

    return json.dumps(params, sort_keys=True, default=str)


@lru_cache(maxsize=1024)
def _same_as_untouched(method: str, train_len: int, length: int, head_dim: int, base: float, params: str) -> bool:
    import json

    from posenc.analysis.maps import identity_at
    from posenc.methods import is_identity, method_spec

    spec = method_spec(method)
    if is_identity(spec):
        return False  # the untouched row itself: its own cells
    return identity_at(spec, train_len, length, json.loads(params), head_dim=head_dim, base=base)


def runs_on(device="cpu", dtype: str = "float32") -> dict:
    """What a cell key adds for the device and dtype the model ran with: ``dtype`` unless it is float32, ``device``
    (its type: ``"cuda"``, not ``"cuda:1"``) unless it is the CPU. Float32 on the CPU adds nothing, so every cell
    computed before runs took a device keeps its key; a result depends on the dtype (and, at float noise, on the
    device), so a bfloat16 or CUDA cell never answers for a float32 CPU one."""
    import torch

    kind = torch.device(device).type
    return {**({"dtype": dtype} if dtype != "float32" else {}), **({"device": kind} if kind != "cpu" else {})}


def cell_key(model_id: str, method: str, params: dict, length: int, spec: ContextSpec, seed: int, chat: bool, *,
             device="cpu", dtype: str = "float32") -> dict:
    """Everything a cell's result depends on (:class:`posenc.runtime.cells.CellStore` key); ``device``/``dtype``: what
    the model ran with (:func:`runs_on`)."""
    return {"suite": SUITE_VERSION, "model": model_id, "method": method, "params": params, "length": length,
            "haystack": spec.haystack, "generators": list(spec.generators), "target": spec.target, "seed": seed,
            "chat": chat, **({"options": spec.options} if spec.options else {}),
            **({"reach": spec.reach} if spec.reach is not None else {}), **runs_on(device, dtype)}


def plan(preset: SuitePreset) -> list[tuple[int, str, ContextSpec, int]]:
    """Every cell ``(length, method, context, seed)`` the preset may run, shortest length first."""
    return [(n, m, spec, s) for n in sorted(preset.lengths) for m in preset.methods for spec in preset.contexts
            if spec.used_at(n, m) for s in spec.seed_range]


@dataclass
class ModelFacts:
    """The untouched model's folder, tokenizer and shape facts, loaded once per run, and the ``device`` and
    ``dtype`` (a name: ``"float32"``, ``"bfloat16"``, ``"float16"``) every model of the run is loaded with.
    ``model_id``: the model in every cell key, named by its content, not its folder's name
    (:func:`posenc.hf.identity.model_id`). ``local_windows``: the sliding windows of a local/global hybrid's
    local layers (:func:`posenc.hf.layers.local_windows`; Gemma 3: ``(512,)``); on such a model every row, the
    untouched one included, runs on posenc's engine (``native=False``: the identity path for ``none``), whose
    windowed kernel reads only a local layer's window where transformers attends over the whole context under a
    mask (a 64k prefill would take hours that way). The engine equals transformers' own path to float noise
    (``tests/hf/test_gemma3.py``), so a row's answer does not depend on the path."""

    folder: Path
    tokenizer: object
    model_id: str
    train_len: int
    head_dim: int
    base: float
    device: str = "cpu"
    dtype: str = "float32"
    local_windows: tuple[int, ...] = ()

    def load(self):
        """The untouched model in eval mode, with the run's dtype, on its device."""
        import torch

        from posenc.hf.patch import load

        return load(self.folder, dtype=getattr(torch, self.dtype)).to(self.device)

    def fresh(self, method: str, params: dict):
        """A fresh copy of the model (:meth:`load`) extended with row ``method`` (a label)."""
        return self.extended(self.load(), method, params)

    def extended(self, model, method: str, params: dict):
        """``model`` (this model, loaded) extended in place with row ``method`` (a label) and ``params``; on a
        hybrid every row, ``none`` included, on posenc's engine (class docstring)."""
        from posenc.hf.patch import extend
        from posenc.methods import method_spec

        if self.local_windows:
            params = {"native": False, **params}
        return extend(model, method_spec(method), **params)  # "none": the model as it is (or its identity path)


def load_facts(source, device="cpu", dtype="auto") -> ModelFacts:
    """The facts of model ``source`` for a run on ``device`` with ``dtype`` (``"auto"``: float32 on the CPU,
    bfloat16 on CUDA; :func:`posenc._util.check_dtype`); ``ValueError`` for a device this machine lacks."""
    from transformers import AutoConfig

    from posenc._util import check_device, check_dtype
    from posenc.hf.identity import model_id
    from posenc.hf.layers import local_windows
    from posenc.hf.patch import scheme_from_config, train_len_of
    from posenc.hf.saved import describe_record, saved_record
    from posenc.hf.source import load_tokenizer, source_folder

    device = check_device("device", device)
    dtype = check_dtype("dtype", dtype, device)
    folder = source_folder(source)
    record = saved_record(folder)
    if record is not None:
        raise ValueError(f"model {str(source)!r} was saved extended by posenc with {describe_record(record)}: the "
                         "suite and tune apply methods to the untouched model (methods do not stack); give the model "
                         "it was extended from, or score this one with posenc eval")
    cfg = AutoConfig.from_pretrained(folder)
    rope = scheme_from_config(cfg).rope
    if rope is None:
        raise ValueError(f"model {source!r} has no RoPE: the suite's methods extend RoPE models")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelFacts(folder, load_tokenizer(source), model_id(source, folder, cfg.model_type), train_len_of(cfg),
                      int(head_dim), float(rope.base), device, dtype, local_windows(cfg))
