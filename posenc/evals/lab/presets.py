"""The bench's presets: :class:`BenchPreset` (corpus, model size, train length, steps, eval lengths, schemes,
methods, probes, seeds, fine-tune rows), :class:`FineTune`, :func:`yarn_schedule`, :func:`scheme_spec` (a preset's
scheme entry with parameters) and :data:`PRESETS`, built from the data file ``presets.json`` beside this module
(:func:`load_presets`); :mod:`posenc.evals.lab.bench` runs them (see its docstring)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from posenc._util import check_positive_int

__all__ = ["ALL_TRAINED", "BenchPreset", "FineTune", "PRESETS", "ROPE_METHODS", "scheme_spec", "yarn_schedule"]

ROPE_METHODS = ("pi", "ntk", "ntk_mixed", "dynamic_ntk", "dynamic_ntk_qwen", "yarn", "dynamic_yarn", "rerope",
                "leaky_rerope", "selfextend", "logn", "rerope+logn", "ntk_mixed+logn", "lm_infinite",
                "streaming_llm", "sliding_window", "bca")
ALL_TRAINED = ("nope", "sinusoidal", "learned", "floater", "complex_order", "shaw", "transformer_xl", "t5",
               "deberta", "rope", "xpos", "alibi", "kerple_power", "kerple_log", "sandwich", "infini", "cope", "fox",
               "fire")


@dataclass(frozen=True)
class FineTune:
    """A short fine-tune continued from the ``base`` scheme's checkpoint under ``base.extend(method,
    **params)``, at ``len_factor * L`` (Chen et al. arXiv:2306.15595 for PI; Liu et al. arXiv:2310.05209
    for a changed RoPE base). ``name`` labels its row. ``base`` may name an earlier row (YaRN's two-stage
    schedule, :func:`yarn_schedule`) or be ``None``: a model trained from scratch with the trained preset
    ``method`` (PoSE / randomized-position rows, and training at the full length). ``options`` are
    :class:`~posenc.training.train.TrainConfig` training options (PoSE, randomized ids, S^2-attention).
    ``scheme_from``: the weights come from ``base`` but ``method`` extends this row's scheme (YaRN's second
    stage: the ``base`` checkpoint at scale ``s``, re-scaled to ``2s`` from the plain RoPE scheme)."""

    name: str
    method: str
    params: dict = field(default_factory=dict)
    steps: int = 100
    len_factor: int = 2
    base: str | None = "rope"  # a trained scheme, an earlier fine-tune row (a schedule), or None: from scratch
    options: dict = field(default_factory=dict)  # training options (TrainConfig fields: positions, s2_groups, ...)
    scheme_from: str | None = None  # the row whose scheme ``method`` extends (default: ``base``'s)
    # The schedule of a fine-tune continued from a checkpoint (``base`` set): linear warmup over ``warmup_fraction``
    # of the steps, then cosine decay from a peak of ``lr_factor`` x the preset's lr to a tenth of that peak. The
    # papers fine-tune from a far lower peak than pretraining and warm up again (PI, arXiv:2306.15595 Sec. 3.1:
    # lr 2e-5 after pretraining at 3e-4, 20 warmup steps; YaRN, arXiv:2309.00071 Sec. 4.1: lr 2e-5, 20 warmup
    # steps): restarting a converged model at the pretraining peak (3e-3 here) first undoes part of what it
    # learned. 0.1 x is the lab's 3e-4, about PI's ratio (1/15); the cosine ends at 3e-5, below the pretraining's
    # final 1e-4, so the short run settles instead of stopping at its peak. A from-scratch row (``base=None``) is
    # pretraining and keeps the preset's recipe.
    lr_factor: float = 0.1
    warmup_fraction: float = 0.1

    def __post_init__(self):
        if not (isinstance(self.lr_factor, (int, float)) and 0 < self.lr_factor <= 1):
            raise ValueError(f"FineTune.lr_factor must be in (0, 1], got {self.lr_factor!r}")
        if not (isinstance(self.warmup_fraction, (int, float)) and 0 <= self.warmup_fraction < 1):
            raise ValueError(f"FineTune.warmup_fraction must be in [0, 1), got {self.warmup_fraction!r}")

    def schedule(self, preset_lr: float) -> dict:
        """``lr``, ``min_lr`` and ``warmup`` of this row's training (see the field comments)."""
        peak = preset_lr * self.lr_factor
        return {"lr": peak, "min_lr": peak / 10, "warmup": max(1, round(self.steps * self.warmup_fraction))}


def yarn_schedule(factor: float = 2.0, steps: int = 150, base: str = "rope") -> tuple[FineTune, FineTune]:
    """YaRN's fine-tune schedule (Peng et al. arXiv:2309.00071, Sec. 4.1): scale ``s = factor`` fine-tuned for
    ``steps`` on windows of ``s * L`` tokens (the paper: s=16, 400 steps on 64k-token windows for a 4k Llama 2),
    then ``2s`` continued from that checkpoint for ``steps / 2`` more on the same windows (the paper: s=32, 200
    steps). Two :class:`FineTune` rows, the second based on the first. The paper's optimizer (lr 2e-5, no
    weight decay, 20 warmup steps) is for a 7B model; the lab keeps its preset's recipe."""
    if not isinstance(factor, (int, float)) or factor <= 1 or factor != int(factor):
        raise ValueError(f"factor must be an integer > 1 (the window is factor x L), got {factor!r}")
    steps = check_positive_int("steps", steps, minimum=2)
    first = FineTune(f"{base}_ft_yarn{int(factor)}", "yarn", {"factor": float(factor)}, steps=steps,
                     len_factor=int(factor), base=base)
    second = FineTune(f"{base}_ft_yarn{int(2 * factor)}", "yarn", {"factor": float(2 * factor)}, steps=steps // 2,
                      len_factor=int(factor), base=first.name, scheme_from=base)
    return first, second


@dataclass(frozen=True)
class BenchPreset:
    """Everything one bench run depends on (see the module docstring)."""

    name: str
    description: str
    corpus: str = "gutenberg"
    tokenizer: str = "byte"
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    train_len: int = 128
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    schemes: tuple[str, ...] = ("sinusoidal", "learned", "rope", "alibi")
    rope_methods: tuple[str, ...] = ROPE_METHODS
    learned_methods: tuple[str, ...] = ("hierarchical",)
    passkey_factors: tuple[int, ...] = ()  # the Landmark-format passkey (models big enough to read it)
    passkey_depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    passkey_trials: int = 1
    recall_batch: int = 4  # key-value recall rows added to every training batch (0: no recall probe)
    recall_weight: float = 0.25  # measured: 1.0 raised the learned table's PPL(L) from 6.75 to 14.1, 0.25 to 8.36
    recall_pairs: int = 1
    recall_factors: tuple[int, ...] | None = None  # eval lengths (x L) of the recall probe; None: every eval length
    recall_trials: int = 16  # probe sequences per (method, length, distance) cell
    recall_task: str = "recall"  # "recall": the single needle (a content-copy control, posenc.tasks.recall);
    #                              "kv": kv_recall + offset (posenc.tasks.kv_recall), which need key matching
    seeds: int = 1  # training seeds (seed, seed + 1, ...) of each scheme in seed_schemes; the others train once
    seed_schemes: tuple[str, ...] = ("rope", "alibi", "nope")  # the headline rows (RoPE with its methods)
    eval_target: int | None = None  # eval_mode "tail": the scored last tokens of each window (None: train_len)
    recall_distances: tuple[float, ...] | None = None  # probed distances as fractions of L (None: probe_distances')
    max_windows: int | None = 8
    eval_batch_size: int = 4
    eval_mode: str = "nonoverlap"
    finetunes: tuple[FineTune, ...] = ()
    seed: int = 0
    warmup: int = 50
    val_batches: int = 4
    threads: int | None = 1  # torch intra-op threads; tiny models are op-overhead bound and a shared CPU
    #                          thrashes with more (a busy CPU makes each extra thread wait on the others)
    seed_finetunes: bool = False  # fine-tune rows at the seeds of the scheme they start from (finetune_seeds)
    jobs: int = 1  # models trained / evaluated at once, each in its own process with `threads` threads
    #                (posenc.runtime.parallel); results do not depend on it

    def __post_init__(self):
        if self.recall_task not in ("recall", "kv"):
            raise ValueError(f"recall_task must be 'recall' or 'kv', got {self.recall_task!r}")
        check_positive_int("seeds", self.seeds)
        check_positive_int("jobs", self.jobs)
        for name in ("passkey_factors", "recall_factors"):
            extra = sorted(set(getattr(self, name) or ()) - set(self.eval_factors))
            if extra:
                raise ValueError(f"{name} {extra} must be among eval_factors {self.eval_factors}")

    @property
    def eval_lengths(self) -> list[int]:
        return [f * self.train_len for f in self.eval_factors]

    @property
    def recall_lengths(self) -> list[int]:
        factors = self.eval_factors if self.recall_factors is None else self.recall_factors
        return [f * self.train_len for f in factors] if self.recall_batch else []

    @property
    def passkey_lengths(self) -> list[int]:
        return [f * self.train_len for f in self.passkey_factors]

    def seeds_for(self, scheme: str) -> list[int]:
        """The training seeds of ``scheme`` (a preset entry): ``seeds`` of them for the headline schemes."""
        n = self.seeds if scheme_spec(scheme)[0] in self.seed_schemes else 1
        return [self.seed + i for i in range(n)]

    @property
    def eval_kwargs(self) -> dict:
        """The perplexity windows: ``tail`` mode scores the same last ``eval_target`` tokens at every length."""
        if self.eval_mode != "tail":
            return {}
        return {"target_len": self.eval_target or self.train_len, "context_max": max(self.eval_lengths)}

    def methods_for(self, scheme: str) -> tuple[str, ...]:
        """The inference-time methods evaluated on the model trained with ``scheme`` (besides ``"none"``)."""
        return {"rope": self.rope_methods, "learned": self.learned_methods}.get(scheme, ())

    def to_dict(self) -> dict:
        """The preset as plain data; a fine-tune's training-time fields at their defaults (no ``options``, no
        ``scheme_from``) are left out, so presets recorded before those fields existed still compare equal."""
        d = asdict(self)
        for key in _PRESET_DEFAULTS:  # added later: left out at defaults
            if d[key] == _PRESET_DEFAULTS[key]:
                del d[key]
        for ft in d.get("finetunes", []):
            for key, empty in (("options", {}), ("scheme_from", None)):
                if key in ft and ft[key] == empty:
                    del ft[key]
        return d


_PRESET_DEFAULTS = {"recall_task": "recall", "seeds": 1, "seed_schemes": ("rope", "alibi", "nope"), "eval_target": None,
                    "recall_distances": None, "jobs": 1, "seed_finetunes": False}

DATA = Path(__file__).with_name("presets.json")


def load_presets(path=DATA) -> dict[str, BenchPreset]:
    """Every preset of the data file ``path`` (``presets.json`` beside this module), by name: a field left out takes
    :class:`BenchPreset`'s default, a fine-tune's field :class:`FineTune`'s; lists become tuples."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for row in data["presets"]:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in row.items() if k != "finetunes"}
        finetunes = tuple(FineTune(**ft) for ft in row.get("finetunes", ()))
        out[row["name"]] = BenchPreset(**fields, finetunes=finetunes)
    return out


PRESETS: dict[str, BenchPreset] = load_presets()


def scheme_spec(entry: str) -> tuple[str, dict]:
    """A preset's scheme entry: ``"name"`` or ``"name:key=value,key=value"`` (parameters of that trained
    preset, e.g. ``"local_global:every=2"`` for a 2-layer model); values are ints, floats or strings."""
    name, _, rest = entry.partition(":")
    params: dict = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"scheme entry {entry!r}: parameters must be key=value, got {item!r}")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                continue
        params[key.strip()] = value
    return name, params
