"""The extrapolation lab: train short, test long, under identical conditions (``posenc bench``).

A :class:`BenchPreset` is plain data: corpus, model size, train length ``L``, steps, batch, eval lengths
(multiples of ``L``), the trained-in schemes, the inference-time methods applied to the RoPE model (and
Su's hierarchical extension of the learned table), a passkey grid, the eval window cap and optional
fine-tune rows (PI / RoPE-base change continued from the RoPE checkpoint at ``2L``).

:func:`run_bench` trains each scheme into ``runs_dir/<scheme>`` (a finished checkpoint is reused, so a
second run only evaluates; an unfinished one resumes from its last checkpoint, saved every tenth of the
steps and on SIGINT/SIGTERM), evaluates every model at every length on the test split
(:func:`posenc.lab.evaluate.evaluate_model`), writes ``results.json`` = ``{"meta": {...}, "records": [...]}``
and the report (``report.md``, ``report.html``, PNGs; :mod:`posenc.lab.report`; every file written
atomically), and prints the Markdown table. Each (model, length, probe) evaluation is a cell kept in
``out_dir/cells/`` (:class:`posenc.lab.cells.CellStore`), so an interrupted bench (Ctrl-C or SIGTERM: it
stops after the current step or cell, saves, and says so in one line) continues where it stopped. One bench
writes ``out_dir`` at a time (:class:`posenc.lab.lock.FolderLock`). The protocol is the one of ALiBi
(arXiv:2108.12409, Table 2: non-overlapping windows, every position counts) with Su's next-token accuracy
next to perplexity (ReRoPE post, kexue.fm/archives/9708).

Command line (:mod:`posenc.cli.bench`):
``posenc bench --preset quick --out DIR [--corpus NAME] [--device cpu] [--runs-dir DIR]``.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from posenc._util import check_device, check_positive_int
from posenc.lab.atomic import atomic_write_json, remove_stale_temps
from posenc.lab.bench_cells import BenchCells, save_every, train_or_reuse
from posenc.lab.bench_probes import content_copy_records, passkey_cells, passkey_records, retrieval_records
from posenc.lab.interrupt import StopSignals
from posenc.lab.lock import FolderLock
from posenc.lab.records import EvalRecord, RetrievalRecord
from posenc.lab.report import markdown_tables, shape_checks, write_report
from posenc.lab.report_retrieval import ppl_vs_retrieval_table, retrieval_checks
from posenc.scheme.methods import NONE, is_identity

__all__ = ["BenchPreset", "FineTune", "PRESETS", "ROPE_METHODS", "run_bench", "scheme_spec", "yarn_schedule"]

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
    :class:`~posenc.lab.train.TrainConfig` training options (PoSE, randomized ids, S^2-attention).
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
    recall_task: str = "recall"  # "recall": the single needle (a content-copy control, posenc.lab.recall);
    #                              "kv": kv_recall + offset (posenc.lab.kv_recall), which need key matching
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
    #                (posenc.lab.parallel); results do not depend on it

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

PRESETS: dict[str, BenchPreset] = {
    "quick": BenchPreset(
        "quick", "RoPE + 9 training-free methods and NoPE, one seed (the budget; the retrieval preset has 3), "
        "kv_recall / offset probes, the same 64 x 64 target tokens at every length, L=64 to 8L, <= 15 min on 2 CPU "
        "cores",
        # standard's recipe (lr 1e-3, 2400 steps of 8 text + 32 kv rows: the one that learns the kv probes
        # at L, benchmarks/results/ablation/kv_recall_design.md) cut to RoPE and NoPE at one seed and 64 windows per
        # perplexity cell to fit 15 minutes (measured 673 s here); ALiBi and the other schemes are in standard (the
        # description's "retrieval preset", RoPE / ALiBi / NoPE at 3 seeds, became part of standard after this run)
        dim=128, n_layers=2, n_heads=4, train_len=64, steps=2400, batch_size=8, lr=1e-3, warmup=100,
        eval_factors=(1, 2, 4, 8), schemes=("rope", "nope"), learned_methods=(),
        rope_methods=("pi", "ntk", "dynamic_ntk", "yarn", "rerope", "selfextend", "sliding_window", "streaming_llm",
                      "lm_infinite"),
        recall_task="kv", recall_pairs=2, recall_batch=32, recall_weight=1.0, recall_trials=32, recall_factors=(1, 4),
        recall_distances=(1 / 8, 1 / 2, 15 / 16, 3), eval_mode="tail", max_windows=64),
    "standard": BenchPreset(
        "standard", "every trained-in scheme; RoPE with 17 training-free methods, ALiBi and NoPE at 3 seeds; "
        "kv_recall / offset probes; the same 256 x 64 target tokens at every length, L=64 to 8L; PI / base-500 "
        "fine-tunes; two models at a time, <= 100 min on 2 CPU cores",
        # quick's model and recipe (lr 1e-3, 2400 steps of 8 text + 32 kv rows: the one that learns the kv probes at
        # L, benchmarks/results/ablation/kv_recall_design.md), so standard's seed-0 RoPE row is quick's model, for
        # all 19 schemes, with every RoPE method and 256 windows per perplexity cell. Two models train (and are
        # evaluated) at once, one thread each (jobs=2, posenc.lab.parallel): measured here, 240 steps of this recipe
        # take 27.7 s alone on one thread, 17.6 s on two threads, and 37.7 s for two models side by side (about
        # 19 s each, spawn included)
        dim=128, n_layers=2, n_heads=4, train_len=64, steps=2400, batch_size=8, lr=1e-3, warmup=100,
        eval_factors=(1, 2, 4, 8), schemes=ALL_TRAINED,
        recall_task="kv", recall_pairs=2, recall_batch=32, recall_weight=1.0, recall_trials=32, recall_factors=(1, 4),
        recall_distances=(1 / 8, 1 / 2, 15 / 16, 3), eval_mode="tail", max_windows=256,
        seeds=3, seed_schemes=("rope", "alibi", "nope"), jobs=2,
        finetunes=(FineTune("rope_ft_pi", "pi", {"factor": 2.0}, steps=150),
                   FineTune("rope_ft_base500", "rope_base", {"base": 500.0}, steps=150))),
    "hybrid": BenchPreset(
        "hybrid", "plain RoPE next to three per-layer hybrids (2 layers, every=2), L=64 to 8L, ~15 min on 2 CPU cores",
        dim=128, n_layers=2, n_heads=4, train_len=64, steps=1200, batch_size=16, lr=3e-3, warmup=100,
        max_windows=24, recall_factors=(1, 2, 4), rope_methods=(), learned_methods=(),
        schemes=("rope", "irope:every=2", "local_global:every=2", "nope_every4:every=2")),
    "training_time": BenchPreset(
        "training_time", "train-time extension (PoSE, randomized ids, S^2-attn, YaRN schedule) vs training at 4L and "
        "training-free methods, every RoPE row at 3 seeds, kv_recall / offset probes, L=64 to 8L, two models at a "
        "time, ~70 min on 2 CPU cores",
        # quick's RoPE model and recipe (lr 1e-3, 2400 steps of 8 text + 32 kv rows: it learns the kv probes at L,
        # benchmarks/results/ablation/kv_recall_design.md), each row at the 3 seeds of the RoPE model it starts
        # from; every row covers 4L = 256 positions. PoSE (arXiv:2309.10400) with PI as in the paper, two chunks;
        # randomized ids (arXiv:2305.16843) to 8L; S^2 (arXiv:2309.12307) at 4L, 4 groups, with PI as LongLoRA; the
        # plain PI fine-tune at 4L is S^2's full-attention reference. ~70 min: the rates of the standard run (two
        # 2400-step models side by side in ~280 s, a 4L model 4x the tokens), not measured for this preset yet
        dim=128, n_layers=2, n_heads=4, train_len=64, steps=2400, batch_size=8, lr=1e-3, warmup=100,
        eval_factors=(1, 2, 4, 8), schemes=("rope",), learned_methods=(),
        rope_methods=("pi", "ntk", "yarn", "selfextend", "rerope"),
        recall_task="kv", recall_pairs=2, recall_batch=32, recall_weight=1.0, recall_trials=32, recall_factors=(1, 4),
        recall_distances=(1 / 8, 1 / 2, 15 / 16, 3), eval_mode="tail", max_windows=64,
        seeds=3, seed_schemes=("rope",), seed_finetunes=True, jobs=2,
        finetunes=(FineTune("rope_full_4L", "rope", steps=2400, len_factor=4, base=None),
                   FineTune("rope_pose_4L", "rope", steps=2400, len_factor=1, base=None,
                            options={"positions": "pose", "position_range": 256}),
                   FineTune("rope_randomized_8L", "rope", steps=2400, len_factor=1, base=None,
                            options={"positions": "randomized", "position_range": 512}),
                   FineTune("rope_ft_pose_pi4", "pi", {"factor": 4.0}, steps=150, len_factor=1,
                            options={"positions": "pose", "position_range": 256}),
                   FineTune("rope_ft_pi4", "pi", {"factor": 4.0}, steps=150, len_factor=4),
                   FineTune("rope_ft_s2_pi4", "pi", {"factor": 4.0}, steps=150, len_factor=4, options={"s2_groups": 4}),
                   *yarn_schedule(2.0, 150))),
    "full": BenchPreset(
        "full", "GPU-sized: every scheme, dim 512, 8 layers, L=512, to 16L",
        dim=512, n_layers=8, n_heads=8, train_len=512, steps=20000, batch_size=32, lr=6e-4,
        eval_factors=(1, 2, 4, 8, 16), schemes=ALL_TRAINED, passkey_factors=(1, 2, 4, 8, 16),
        passkey_depths=(0.0, 0.25, 0.5, 0.75, 1.0), passkey_trials=5, max_windows=64, eval_batch_size=8,
        threads=None,
        finetunes=(FineTune("rope_ft_pi", "pi", {"factor": 2.0}, steps=1000),
                   FineTune("rope_ft_base500", "rope_base", {"base": 500.0}, steps=1000))),
}


# ------------------------------------------------------------------------------------------------ helpers
class _Log:
    """One line per stage with the elapsed wall time since the bench started."""

    def __init__(self, enabled: bool):
        self.t0 = time.perf_counter()
        self.enabled = enabled

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"[bench {self.elapsed():7.1f}s] {msg}", flush=True)


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


def _train_config(preset: BenchPreset, scheme: str, run_dir: Path, device: str, *, steps=None, train_len=None,
                  init=None, scheme_params=None, options=None, seed=None, schedule=None):
    """The ``posenc.lab.train.TrainConfig`` of one model (``scheme`` a preset name; with ``init`` a method name
    applied to that checkpoint's scheme; ``schedule``: a fine-tune's ``lr``/``min_lr``/``warmup``,
    :meth:`FineTune.schedule`)."""
    from posenc.lab.train import TrainConfig

    steps = steps or preset.steps
    sched = schedule or {"lr": preset.lr, "min_lr": min(preset.lr, 1e-4), "warmup": min(preset.warmup, steps // 5)}
    return TrainConfig(out_dir=str(run_dir), corpus=str(preset.corpus), tokenizer=preset.tokenizer, scheme=scheme,
                       scheme_params=dict(scheme_params or {}), dim=preset.dim, n_layers=preset.n_layers,
                       n_heads=preset.n_heads, train_len=train_len or preset.train_len,
                       batch_size=preset.batch_size, steps=steps, **sched,
                       seed=preset.seed if seed is None else seed, init=init, device=device,
                       save_every=save_every(steps), eval_batches=preset.val_batches, recall_batch=preset.recall_batch,
                       recall_weight=preset.recall_weight, recall_pairs=preset.recall_pairs,
                       recall_task=preset.recall_task, **dict(options or {}))


def _train(preset, scheme, run_dir: Path, device: str, progress: bool, **kw) -> dict:
    from posenc.lab.train import train

    summary = train(_train_config(preset, scheme, run_dir, device, **kw), progress=progress)
    return dict(summary or {})


def _evaluate(model, tokens, preset: BenchPreset, methods, log, lengths=None) -> list[dict]:
    """``evaluate_model`` one length at a time (one progress line each; no record is computed twice);
    ``lengths``: those of ``preset.eval_lengths`` to run (default: all)."""
    from posenc.lab.evaluate import evaluate_model

    records = []
    for n in preset.eval_lengths if lengths is None else lengths:
        t = time.perf_counter()
        records += evaluate_model(model, tokens, [n], [m for m in methods if not is_identity(m)],
                                  mode=preset.eval_mode, max_windows=preset.max_windows,
                                  batch_size=preset.eval_batch_size,
                                  passkey=False, progress=False, **preset.eval_kwargs)
        log(f"  eval_len {n}: {len(methods)} method(s) in {time.perf_counter() - t:.1f}s")
    return records


def _machine(device: str) -> dict:
    import torch

    return {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "device": device, "threads": torch.get_num_threads(),
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _bench_record(rec: EvalRecord, name: str, finetuned: bool, pk: dict, seed: int) -> EvalRecord:
    """``rec`` under the bench's model ``name`` (trained with ``seed``, ``extra["seed"]``), with its passkey
    cells from ``pk`` (or None)."""
    note = "; ".join(x for x in (rec.note, "fine-tuned from the rope checkpoint") if x) if finetuned else rec.note
    cells = pk.get((rec.method, rec.eval_len))
    passkey = {"accuracy": sum(c["accuracy"] for c in cells) / len(cells), "cells": cells} if cells else None
    return rec.replace(scheme=name, note=note, passkey=passkey, extra={**rec.extra, "seed": seed})


def _clean(records: list[EvalRecord]) -> list[dict]:
    """The JSON rows, every :data:`posenc.lab.records.REQUIRED_KEYS` present."""
    return [r.to_dict() for r in records]


# ------------------------------------------------------------------------------------------------ run
def run_bench(preset: BenchPreset | str, out_dir, progress: bool = True, *, corpus: str | None = None,
              device: str = "cpu", runs_dir=None, threads: int | None = None) -> dict:
    """Train (or reuse) every scheme of ``preset``, evaluate, and write results + report into ``out_dir``.

    Checkpoints go to ``runs_dir`` (default ``out_dir/runs``) as ``<scheme>/`` folders; a finished one is
    reused. ``threads`` (default: the preset's) sets ``torch.set_num_threads`` for the run and is restored
    after. Returns the results dict (also in ``out_dir/results.json``) with ``meta`` (preset, corpus,
    machine, timings in seconds, config) and ``records`` (see :mod:`posenc.lab.report`)."""
    import torch

    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
        preset = PRESETS[preset]
    if corpus is not None:
        preset = replace(preset, corpus=corpus)
    check_device("device", device)
    if threads is not None:
        check_positive_int("threads", threads)
    threads = threads if threads is not None else preset.threads
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with FolderLock(out_dir, what="bench", tidy=True), StopSignals() as stop:  # one bench per folder; Ctrl-C saves
            return _run(preset, Path(out_dir), progress, device, runs_dir, stop)
    finally:
        torch.set_num_threads(old_threads)


def _run_dir(runs_dir: Path, scheme: str, seed: int, preset: BenchPreset) -> Path:
    """``runs_dir/<scheme>`` for the preset's seed (the folder of a single-seed run), ``<scheme>-seed<k>`` else."""
    name = scheme.replace(":", "-").replace(",", "-").replace("=", "")
    return runs_dir / (name if seed == preset.seed else f"{name}-seed{seed}")


def _train_all(preset: BenchPreset, runs_dir: Path, device: str, progress: bool, log, timings,
               stop: StopSignals | None = None) -> dict[str, Path]:
    """Train (or reuse) every scheme of ``preset`` at each of its seeds (:meth:`BenchPreset.seeds_for`):
    ``{scheme: run_dir}`` of the preset's own seed; the other seeds' folders are :func:`_seed_runs`. With
    ``preset.jobs > 1`` the unfinished ones train side by side in worker processes (:mod:`posenc.lab.parallel`)."""
    run_dirs: dict[str, Path] = {}
    todo: list[tuple[str, str, Path, tuple, dict]] = []  # (label, timing key, run_dir, args, kwargs) of _train
    for scheme in preset.schemes:
        name, params = scheme_spec(scheme)
        for seed in preset.seeds_for(scheme):
            run_dir = _run_dir(runs_dir, scheme, seed, preset)
            label = scheme if seed == preset.seed else f"{scheme} seed {seed}"
            key = f"train/{scheme}" if seed == preset.seed else f"train/{scheme}/seed{seed}"
            if seed == preset.seed:
                run_dirs[scheme] = run_dir
            todo.append((label, key, run_dir, (preset, name, run_dir, device, progress),
                         {"scheme_params": params, "seed": seed}))
    plan = f"{preset.steps} steps x {preset.batch_size} x {preset.train_len}"
    if preset.jobs > 1 and stop is not None:
        from posenc.lab.parallel import Job, run_jobs

        jobs = []
        for label, _key, run_dir, args, kwargs in todo:
            train_or_reuse(f"train {label}", plan, run_dir, preset.steps, log, _queue, jobs,
                           Job(f"train {label}", _train, (*args[:-1], False), kwargs))
        t = time.perf_counter()
        _, seconds = run_jobs(jobs, preset.jobs, stop=stop, threads=preset.threads, log=log)
        if jobs:
            timings["train (wall, parallel)"] = time.perf_counter() - t
        for label, key, *_ in todo:
            if f"train {label}" in seconds:
                timings[key] = seconds[f"train {label}"]
        return run_dirs
    for label, key, run_dir, args, kwargs in todo:
        t = time.perf_counter()
        train_or_reuse(f"train {label}", plan, run_dir, preset.steps, log, _train, *args, **kwargs)
        timings[key] = time.perf_counter() - t
        log(f"train {label}: done in {timings[key]:.1f}s")
    return run_dirs


def _queue(jobs: list, job) -> None:
    """:func:`train_or_reuse`'s ``train`` for a parallel bench: queue the training instead of running it."""
    jobs.append(job)


def _seed_runs(preset: BenchPreset, runs_dir: Path) -> list[tuple[str, int, Path]]:
    """``(scheme, seed, run_dir)`` of every extra seed (besides the preset's own) that :func:`_train_all` trains."""
    return [(scheme, seed, _run_dir(runs_dir, scheme, seed, preset)) for scheme in preset.schemes
            for seed in preset.seeds_for(scheme) if seed != preset.seed]


def _root(preset: BenchPreset, ft: FineTune) -> str:
    """The trained scheme a fine-tune row starts from, through earlier rows (a schedule); a from-scratch row's
    own trained preset (its ``method``)."""
    rows = {r.name: r for r in preset.finetunes}
    while ft.base in rows:
        ft = rows[ft.base]
    return ft.method if ft.base is None else ft.base


def finetune_seeds(preset: BenchPreset, ft: FineTune) -> list[int]:
    """The seeds a fine-tune row runs at: with ``preset.seed_finetunes`` those of the scheme it starts from
    (:meth:`BenchPreset.seeds_for`), each continued from that seed's checkpoint and trained on that seed's data
    order; else the preset's seed only."""
    return preset.seeds_for(_root(preset, ft)) if preset.seed_finetunes else [preset.seed]


def _depth(preset: BenchPreset, ft: FineTune) -> int:
    """0 for a row based on a trained scheme (or from scratch), 1 + its base's for a row based on another row."""
    rows = {r.name: r for r in preset.finetunes}
    return 0 if ft.base not in rows else 1 + _depth(preset, rows[ft.base])


def _finetune_all(preset: BenchPreset, runs_dir: Path, run_dirs: dict[str, Path], device: str, progress: bool,
                  log, timings, stop: StopSignals | None = None) -> tuple[dict[str, Path], list]:
    """Fine-tune (or reuse) every row of ``preset.finetunes`` whose base was trained, at each of its seeds
    (:func:`finetune_seeds`): ``({name: run_dir} of the preset's seed, [(name, seed, run_dir)] of the others)``.
    Rows run in waves by :func:`_depth` (a schedule's second stage after its first); with ``preset.jobs > 1`` the
    rows of a wave train side by side (:mod:`posenc.lab.parallel`)."""
    trained = {(scheme, seed): _run_dir(runs_dir, scheme, seed, preset)
               for scheme in preset.schemes for seed in preset.seeds_for(scheme)}
    dirs: dict[tuple[str, int], Path] = {}
    for depth in sorted({_depth(preset, ft) for ft in preset.finetunes}):
        todo = []
        for ft in preset.finetunes:
            if _depth(preset, ft) != depth:
                continue
            if ft.base is not None and ft.base not in run_dirs and not any(k[0] == ft.base for k in dirs):
                log(f"fine-tune {ft.name}: skipped, base {ft.base!r} not trained in this preset")
                continue
            for seed in finetune_seeds(preset, ft):
                todo.append(_finetune_job(preset, runs_dir, ft, seed, {**trained, **dirs}, device, progress))
                dirs[(ft.name, seed)] = todo[-1][2]
        if preset.jobs > 1 and stop is not None and len(todo) > 1:
            from posenc.lab.parallel import Job, run_jobs

            jobs: list = []
            for label, _key, run_dir, steps, plan, kwargs in todo:
                train_or_reuse(label, plan, run_dir, steps, log, _queue, jobs, Job(label, _train, (
                    preset, kwargs.pop("scheme"), run_dir, device, False), kwargs))
            _, seconds = run_jobs(jobs, preset.jobs, stop=stop, threads=preset.threads, log=log)
            timings.update({key: seconds[label] for label, key, *_ in todo if label in seconds})
            continue
        for label, key, run_dir, steps, plan, kwargs in todo:
            t = time.perf_counter()
            train_or_reuse(label, plan, run_dir, steps, log, _train, preset, kwargs.pop("scheme"), run_dir, device,
                           progress, **kwargs)
            timings[key] = time.perf_counter() - t
    ft_dirs = {name: d for (name, seed), d in dirs.items() if seed == preset.seed}
    extra = [(name, seed, d) for (name, seed), d in dirs.items() if seed != preset.seed]
    return ft_dirs, extra


def _finetune_job(preset: BenchPreset, runs_dir: Path, ft: FineTune, seed: int, bases: dict, device: str,
                  progress: bool) -> tuple[str, str, Path, int, str, dict]:
    """``(label, timing key, run_dir, steps, plan, _train keywords with "scheme")`` of row ``ft`` at ``seed``;
    ``bases``: ``{(scheme or row, seed): run_dir}`` of what is trained (or queued in an earlier wave)."""
    own = seed == preset.seed
    run_dir = runs_dir / (ft.name if own else f"{ft.name}-seed{seed}")
    ft_len = ft.len_factor * preset.train_len
    init = None if ft.base is None else str(bases[(ft.base, seed)])
    scheme, params = ft.method, ft.params
    if init is not None and ft.scheme_from not in (None, ft.base):  # a schedule's next stage: a new scale
        from posenc.lab.checkpoint import load_model

        scheme, params = load_model(bases[(ft.scheme_from, seed)]).scheme.extend(ft.method, **ft.params).to_dict(), {}
    schedule = None if init is None else ft.schedule(preset.lr)  # a fine-tune warms up again, lower peak
    label = f"fine-tune {ft.name}" + ("" if own else f" seed {seed}")
    plan = (f"{ft.method} {ft.params} {ft.options} from {init or 'scratch'}, {ft.steps} steps at {ft_len}"
            + (f", lr {schedule['lr']:g} after {schedule['warmup']} warmup steps" if schedule else ""))
    kwargs = {"scheme": scheme, "steps": ft.steps, "train_len": ft_len, "init": init, "scheme_params": params,
              "options": ft.options, "schedule": schedule, **({} if own else {"seed": seed})}
    return label, f"finetune/{ft.name}" + ("" if own else f"/seed{seed}"), run_dir, ft.steps, plan, kwargs


def _ppl_cell(load, tokens, preset: BenchPreset, methods, log, n: int) -> list[dict]:
    return _evaluate(load(), tokens, preset, methods, log, lengths=[n])


def _passkey_cell(load, preset: BenchPreset, methods, tokenizer) -> list[list]:
    return [[m, n, cells] for (m, n), cells in passkey_cells(load(), preset, methods, tokenizer).items()]


def _recall_cell(load, preset: BenchPreset, methods, tokens, name: str, log, n: int, seed: int = 0) -> list[dict]:
    return [r.to_dict() for r in retrieval_records(load(), preset, methods, tokens, name, log, [n], seed)]


def _models(preset: BenchPreset, run_dirs: dict[str, Path], ft_dirs: dict[str, Path], seed_runs=(),
            ft_seeds=()) -> list[tuple]:
    """Every evaluated model: ``(name, training seed, run_dir, methods)``, the trained schemes with their
    methods, their extra seeds, then the fine-tunes as they are, then their extra seeds."""
    models = [(scheme, preset.seed, run_dir, [NONE.name, *preset.methods_for(scheme)])
              for scheme, run_dir in run_dirs.items()]
    models += [(scheme, seed, run_dir, [NONE.name, *preset.methods_for(scheme)]) for scheme, seed, run_dir in seed_runs]
    models += [(name, preset.seed, run_dir, [NONE.name]) for name, run_dir in ft_dirs.items()]
    models += [(name, seed, run_dir, [NONE.name]) for name, seed, run_dir in ft_seeds]
    return models


def _eval_model(preset: BenchPreset, data, cells, name: str, seed: int, run_dir: Path, methods, log,
                timings) -> tuple[list[dict], dict, list[RetrievalRecord]]:
    """One model's cells (perplexity at every length, passkey, recall): ``(perplexity rows, passkey cells,
    retrieval records)``, each cell read back from ``cells`` when an earlier run (or a worker) finished it."""
    t = time.perf_counter()
    label = name if seed == preset.seed else f"{name}/seed{seed}"
    log(f"eval {label}: {len(methods)} method(s) x {len(preset.eval_lengths)} lengths")
    model = cells.model(name, run_dir, methods)  # loaded on first use
    recs = []
    for n in preset.eval_lengths:
        recs += cells.get("ppl", n, _ppl_cell, model, data.test, preset, methods, log, n)
    timings[f"eval/{label}"] = time.perf_counter() - t
    t = time.perf_counter()
    pk_rows = cells.get("passkey", None, _passkey_cell, model, preset, methods, data.tokenizer) \
        if preset.passkey_lengths else []
    pk = {(m, n): c for m, n, c in pk_rows}
    retrieval = passkey_records(name, preset.train_len, pk, seed)
    for n in preset.recall_lengths:
        rows = cells.get("recall", n, _recall_cell, model, preset, methods, data.test, name, log, n, seed)
        retrieval += [RetrievalRecord.from_dict(r) for r in rows]
    timings[f"retrieval/{label}"] = time.perf_counter() - t
    log(f"eval {label}: done in {timings[f'eval/{label}']:.1f}s (+ retrieval {timings[f'retrieval/{label}']:.1f}s)")
    return recs, pk, retrieval


def _eval_cells_job(preset: BenchPreset, folder: Path, device: str, model: tuple) -> dict:
    """A worker's job in a parallel bench: compute the unfinished cells of one ``model`` (a :func:`_models`
    entry) into the cell folder (each cell file is committed atomically, so workers share the folder safely);
    returns ``{"computed": cells, "timings": {...}}``. The main process then reads every cell back."""
    from posenc.lab.data import prepare

    data = prepare(preset.corpus, preset.tokenizer)
    timings: dict[str, float] = {}
    with StopSignals() as stop:
        cells = BenchCells(folder, preset, data, device, stop, tidy=False)
        _eval_model(preset, data, cells, *model, lambda msg: None, timings)
    return {"computed": cells.computed, "timings": timings}


def _evaluate_all(preset: BenchPreset, data, run_dirs: dict[str, Path], ft_dirs: dict[str, Path], device: str,
                  log, timings, cells, seed_runs=(), stop: StopSignals | None = None, ft_seeds=()
                  ) -> tuple[list[EvalRecord], list[RetrievalRecord]]:
    """Every model (:func:`_models`) at every length: the perplexity records and the retrieval records, each
    (model, length, probe) a cell of ``cells`` (:class:`~posenc.lab.bench_cells.BenchCells`): finished cells of
    an interrupted run are read back, not computed again. With ``preset.jobs > 1`` the models' cells are
    computed side by side in worker processes first (:func:`_eval_cells_job`), then read back here in order.
    Each record's ``extra["seed"]`` is the training seed of its model."""
    records: list[EvalRecord] = []
    retrieval: list[RetrievalRecord] = content_copy_records(preset, data.test)
    models = _models(preset, run_dirs, ft_dirs, seed_runs, ft_seeds)
    worker_timings: dict[str, float] = {}
    if preset.jobs > 1 and stop is not None and len(models) > 1:
        from posenc.lab.parallel import Job, run_jobs

        t = time.perf_counter()
        jobs = [Job(f"eval {m[0] if m[1] == preset.seed else f'{m[0]}/seed{m[1]}'}", _eval_cells_job,
                    (preset, cells.store.folder, device, m)) for m in models]
        results, _ = run_jobs(jobs, preset.jobs, stop=stop, threads=preset.threads, log=log)
        timings["eval (wall, parallel)"] = time.perf_counter() - t
        for r in results:
            worker_timings.update(r["timings"])
            cells.reused -= r["computed"]  # read back below, but computed by this run
            cells.computed += r["computed"]
    read_log = log if not worker_timings else (lambda msg: None)  # the workers' lines said it already
    for name, seed, run_dir, methods in models:
        recs, pk, rows = _eval_model(preset, data, cells, name, seed, run_dir, methods, read_log, timings)
        retrieval += rows
        records += [_bench_record(EvalRecord.from_dict(r), name, name in ft_dirs, pk, seed) for r in recs]
    timings.update(worker_timings)  # where the work was done, not the read-back
    return records, retrieval


def _run(preset: BenchPreset, out_dir: Path, progress: bool, device: str, runs_dir, stop) -> dict:
    from posenc.lab.data import prepare

    runs_dir = Path(runs_dir) if runs_dir is not None else out_dir / "runs"
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir)  # of results, reports and PNGs a killed run was writing (we hold the lock)
    log = _Log(progress)
    timings: dict[str, float] = {}
    machine = _machine(device)
    log(f"preset {preset.name}: {preset.description}; corpus {preset.corpus}; L={preset.train_len}; "
        f"eval {preset.eval_lengths}; {machine['cpu_count']} CPUs, torch {machine['torch']}")

    t = time.perf_counter()
    data = prepare(preset.corpus, preset.tokenizer)
    timings["prepare"] = time.perf_counter() - t
    log(f"data ready ({len(data.train)} train / {len(data.test)} test tokens, "
        f"{'cached' if data.from_cache else 'built'})")
    stop.check("nothing was trained yet")

    run_dirs = _train_all(preset, runs_dir, device, progress, log, timings, stop)
    ft_dirs, ft_seeds = _finetune_all(preset, runs_dir, run_dirs, device, progress, log, timings, stop)
    cells = BenchCells(out_dir / "cells", preset, data, device, stop)
    records, retrieval = _evaluate_all(preset, data, run_dirs, ft_dirs, device, log, timings, cells,
                                       _seed_runs(preset, runs_dir), stop, ft_seeds)
    if cells.reused:
        log(f"reused {cells.reused} finished evaluation cell(s) of an earlier run from {cells.store.folder}")
    tokens = data.test

    timings["total"] = log.elapsed()
    machine["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results = {"meta": {"preset": preset.name, "corpus": preset.corpus, "tokenizer": preset.tokenizer,
                        "machine": machine, "timings": {k: round(v, 2) for k, v in timings.items()},
                        "config": preset.to_dict(), "runs_dir": str(runs_dir),
                        "cells": {"reused": cells.reused, "computed": cells.computed},
                        "eval_split": "test", "eval_tokens": int(len(tokens)),
                        "passkey": "tasks.passkey_grid without the instruction sentence, teacher-forced exact match",
                        "recall": "posenc.lab.recall: key-value recall in test-split text, exact match on the final "
                                  "query" if preset.recall_task == "recall" else
                                  "posenc.lab.kv_recall: kv_recall (key matching) and offset (the token 2 after the "
                                  "key) in test-split text, exact match on the final query; content_copy rows: the "
                                  "control that copies a value of the window by content alone",
                        "ppl_windows": preset.eval_mode + (f": the last {preset.eval_kwargs['target_len']} tokens of "
                                                           f"windows ending at the same tokens at every length"
                                                           if preset.eval_mode == "tail" else "")},
               "records": _clean(records), "retrieval": [r.to_dict() for r in retrieval]}
    atomic_write_json(out_dir / "results.json", results, indent=1, default=str)
    paths = write_report(results, out_dir)
    log(f"wrote {out_dir / 'results.json'}, {paths['markdown'].name}, {paths['html'].name}")
    if progress:
        print(markdown_tables(results["records"]))
        print()
        print("\n".join(shape_checks(results["records"]) + retrieval_checks(results["retrieval"])))
        table = ppl_vs_retrieval_table(results["records"], results["retrieval"])
        if table:
            print()
            print(table)
    return results

