"""Train a :class:`~posenc.models.tinylm.TinyLM` under a :class:`~posenc.scheme.PositionScheme`
(train short, test long).

nanoGPT-style loop: AdamW (decoupled weight decay on matrices only: no decay on norms, biases, or the
parameters of positional parts), linear warmup then cosine decay to ``min_lr``, gradient clipping by
global norm, deterministic seeds. Batch ``step`` comes from :func:`posenc.data.batches.get_batch` and depends
only on ``(seed, step)``, which is what makes resuming exact.

Run folder (``out_dir``): see :mod:`posenc.models.checkpoint`. Re-running with the same ``out_dir``

- returns a *finished* checkpoint without training ("reuses finished checkpoints");
- resumes an *unfinished* one exactly: model, optimizer, step and RNG state are restored, so a killed
  and resumed run ends with parameters bit-identical to an uninterrupted run;
- refuses (``ValueError``) when the saved run used a different configuration.

One process writes a run folder at a time (:class:`posenc.runtime.lock.FolderLock`: a second ``train`` into the
same folder gets a ``ValueError`` naming the first one's pid and command), and it first finishes a
checkpoint commit that a kill interrupted (:func:`posenc.models.checkpoint.recover`). SIGINT (Ctrl-C) or SIGTERM
during training saves a checkpoint of the last finished step and raises
:class:`posenc.runtime.interrupt.Interrupted`, whose one-line message says how to resume (``posenc train``
prints it and exits with status 130 / 143).

Data parallel: under ``torchrun --nproc-per-node N -m posenc train ...`` (``WORLD_SIZE``/``RANK`` set)
the process group is initialised (gloo on CPU, nccl on CUDA); rank ``r`` takes rows
``[r*b, (r+1)*b)`` of the same global batch and DDP averages gradients, so the loss curve equals a
single process with the same global ``batch_size``. Only rank 0 writes checkpoints and logs.

``init`` continues a checkpoint under a new scheme (the short fine-tunes of PI, YaRN or a base change):
its weights are loaded into a TinyLM built with the new scheme; an inference-time method name
(``pi``, ``yarn``, ``rope_base`` ...) is applied to the initial model's scheme via ``scheme.extend``.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from posenc.methods import parse_methods
from posenc.models import checkpoint as ckpt
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.runtime.interrupt import StopSignals
from posenc.runtime.lock import FolderLock
from posenc.scheme.core import PositionScheme
from posenc.training.config import (  # noqa: F401 (the configuration's names, where they were)
    DEFAULT_WARMUP,
    RECALL_TASKS,
    WARMUP_FRACTION,
    TrainConfig,
    TrainConfigWarning,
)

log = logging.getLogger("posenc")
# TrainConfig fields that do not change the trained parameters (may differ when resuming / reusing).
_RUNTIME_FIELDS = ("out_dir", "device", "compile", "save_every", "eval_every", "eval_batches", "log_every")
# TrainConfig fields added after runs were saved: a saved run without them used their defaults.
_ADDED_FIELDS = ("positions", "position_range", "pose_chunks", "s2_groups", "recall_task")
_ADDED_WAS = {"recall_task": "recall"}  # an added field whose value before it existed is not today's default


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup ``lr * (step+1)/warmup`` for
    ``step < warmup`` (:attr:`TrainConfig.warmup_steps`), then cosine from ``lr`` to ``min_lr`` over the remaining
    steps."""
    warmup = cfg.warmup_steps
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    span = max(1, cfg.steps - warmup)
    t = min(1.0, (step - warmup) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * t))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on weight matrices (linear layers, token embedding); none on norms, biases
    and positional parameters (``pos.*`` embeddings, attention ``parts.*`` bias/relative tables)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        positional = name.startswith("pos.") or ".parts." in name
        (decay if p.ndim >= 2 and not positional else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------- setup
def resolve_scheme(cfg: TrainConfig, init_scheme: PositionScheme | None = None) -> PositionScheme:
    """The scheme to train: a dict is ``PositionScheme.from_dict``; an inference-time method name applied
    to ``init_scheme`` (fine-tune) or to a default RoPE; a trained preset built at ``train_len``."""
    params = dict(cfg.scheme_params)
    if isinstance(cfg.scheme, dict):
        if params:
            raise ValueError("scheme_params only go with a preset name, not with a scheme dict")
        return PositionScheme.from_dict(cfg.scheme)
    if not isinstance(cfg.scheme, str):
        raise ValueError(f"TrainConfig.scheme must be a preset name or a scheme dict, got {cfg.scheme!r}")
    if init_scheme is not None and _is_method(cfg.scheme):
        return init_scheme.extend(cfg.scheme, **params)
    params.setdefault("train_len", cfg.train_len)
    return PositionScheme.preset(cfg.scheme, **params)


def _is_method(spec: str) -> bool:
    """True when ``spec`` names only inference-time methods (``"a+b"``), not a trained-in preset."""
    try:
        parse_methods(spec, identity=False)
    except ValueError:
        return False
    return True


def _dist_env() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


def _build_model(cfg: TrainConfig, vocab_size: int) -> TinyLM:
    if cfg.init is None:
        scheme = resolve_scheme(cfg)
        return TinyLM(LMConfig(vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, scheme, cfg.train_len,
                               dropout=cfg.dropout))
    base = ckpt.load_model(cfg.init)
    if base.cfg.vocab_size != vocab_size:
        raise ValueError(f"init checkpoint {cfg.init} has vocab_size {base.cfg.vocab_size} but tokenizer "
                         f"{cfg.tokenizer!r} gives {vocab_size}; use the tokenizer it was trained with")
    scheme = resolve_scheme(cfg, base.scheme)
    model = TinyLM(replace(base.cfg, scheme=scheme, train_len=cfg.train_len, dropout=cfg.dropout))
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"scheme {scheme.name!r} does not fit the weights of {cfg.init}: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")
    return model


def _compatible(saved: dict, cfg: TrainConfig) -> None:
    cur = cfg.to_dict()
    # a field a run saved before it existed had its default then (the training options were added later)
    saved = {**{k: v for k, v in TrainConfig(out_dir="").to_dict().items() if k in _ADDED_FIELDS}, **_ADDED_WAS,
             **saved}
    diff = sorted(k for k in cur if k not in _RUNTIME_FIELDS and json.dumps(saved.get(k), sort_keys=True)
                  != json.dumps(cur[k], sort_keys=True))
    if diff:
        detail = ", ".join(f"{k}: saved {saved.get(k)!r} vs now {cur[k]!r}" for k in diff[:6])
        raise ValueError(f"out_dir {cfg.out_dir} holds a run with a different configuration ({detail}); "
                         f"choose another out_dir or delete that folder")


@torch.no_grad()
def _val_loss(model: TinyLM, tokens, cfg: TrainConfig, rank: int, world: int, device) -> float:
    from posenc.data.batches import get_batch

    was = model.training
    model.eval()
    total = 0.0
    for i in range(cfg.eval_batches):
        x, y = get_batch(tokens, cfg.batch_size, cfg.train_len, cfg.seed + 1_000_003, i, rank=rank, world_size=world)
        logits = model(x.to(device), impl="auto")
        total += float(F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten()))
    loss = torch.tensor(total / cfg.eval_batches, dtype=torch.float64, device=device)
    if world > 1:
        torch.distributed.all_reduce(loss)
        loss /= world
    model.train(was)
    return float(loss)


def _summary(run_dir: Path, state: dict, **kw) -> dict:
    hist = state.get("history", [])
    return {"run_dir": str(run_dir), "steps": state.get("step", 0), "finished": state.get("finished", False),
            "final_train_loss": hist[-1] if hist else None, "val_loss": state.get("val_loss"),
            "tokens_per_s": state.get("tokens_per_s"), "wall_time_s": state.get("wall_time_s"),
            "history": list(hist), "reused": False, "resumed_from": None, **kw}


def _batch_loss(fwd, tokens, cfg: TrainConfig, step: int, rank: int, world: int, device) -> torch.Tensor:
    """Loss of batch ``step``: next-token cross-entropy over the text rows (:func:`posenc.data.batches.get_batch`)
    plus, with ``recall_batch``, ``recall_weight`` x the cross-entropy over the queried values of that many
    key-value recall rows (:func:`posenc.tasks.recall.recall_batch`), both in one forward pass. Each term is
    a mean over its own targets, so the recall rows' few targets are not drowned by the text's. With
    ``cfg.positions`` PoSE or randomized, every row gets its own ids
    (:func:`posenc.training.positions.train_positions`)."""
    from posenc.data.batches import get_batch
    from posenc.tasks.recall import IGNORE, RecallSpec, recall_batch
    from posenc.training.positions import train_positions

    x, y = get_batch(tokens, cfg.batch_size, cfg.train_len, cfg.seed, step, rank=rank, world_size=world)
    b = cfg.recall_batch // world
    pos = train_positions(cfg.positions, x.shape[0] + b, cfg.train_len, cfg.position_range, cfg.seed, step,
                          chunks=cfg.pose_chunks, rank=rank)  # [b_text + b_recall, N] or None (0..N-1)
    pos = None if pos is None else pos.to(device)
    if not cfg.recall_batch:
        logits = fwd(x.to(device), pos, impl="auto")  # [b, N, V]
        return F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten())
    if cfg.recall_task == "kv":
        from posenc.tasks.kv_recall import KVSpec, kv_batch

        xr, yr = kv_batch(tokens, cfg.recall_batch, cfg.train_len, cfg.seed, step, KVSpec(pairs=cfg.recall_pairs))
    else:
        xr, yr = recall_batch(tokens, cfg.recall_batch, cfg.train_len, cfg.seed, step,
                              RecallSpec(pairs=cfg.recall_pairs))
    xr, yr = xr[rank * b:(rank + 1) * b], yr[rank * b:(rank + 1) * b]
    logits = fwd(torch.cat([x, xr]).to(device), pos, impl="auto").float()  # [b_text + b_recall, N, V]
    n = x.shape[0]
    text = F.cross_entropy(logits[:n].flatten(0, 1), y.to(device).flatten())
    recall = F.cross_entropy(logits[n:].flatten(0, 1), yr.to(device).flatten(), ignore_index=IGNORE)
    return text + cfg.recall_weight * recall


# ---------------------------------------------------------------------------------------------- train
def train(cfg: TrainConfig, progress: bool = True, on_step: Callable[[int, float], None] | None = None) -> dict:
    """Train (or resume, or reuse) the run in ``cfg.out_dir`` and return a summary dict: ``run_dir``,
    ``steps``, ``final_train_loss``, ``val_loss``, ``tokens_per_s`` (global, this session),
    ``wall_time_s`` (total over sessions), ``history`` (per-step train loss, global-batch mean),
    ``reused`` (a finished checkpoint was returned untouched) and ``resumed_from`` (step or None).
    ``on_step(step, loss)`` is called after every optimizer step (after any checkpoint of that step)."""
    from tqdm.auto import tqdm

    from posenc.data.prepare import prepare

    if cfg.init is None:
        resolve_scheme(cfg)  # a bad scheme or parameter fails here, before the corpus is prepared
    for message in cfg.warnings():
        warnings.warn(message, TrainConfigWarning, stacklevel=2)
    _check_corpus(cfg.corpus)  # ... and a missing corpus before the lock creates the run folder
    run_dir = Path(cfg.out_dir)
    rank, world, local_rank = _dist_env()
    started_dist = False
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if cfg.device.startswith("cuda") else "gloo"
        torch.distributed.init_process_group(backend)
        started_dist = True
    device = torch.device(f"cuda:{local_rank}" if cfg.device == "cuda" and world > 1 else cfg.device)
    lock = FolderLock(run_dir, what="run", tidy=True) if rank == 0 else None  # only rank 0 writes the folder
    try:
        if lock is not None:
            lock.acquire()
            for line in ckpt.recover(run_dir):  # a commit killed half-way is finished, stale temp files go
                log.info("%s", line)
        with StopSignals() as stop:
            return _train(cfg, progress, on_step, run_dir, rank, world, device, prepare, tqdm, stop)
    finally:
        if lock is not None:
            lock.release()
        if started_dist:
            torch.distributed.destroy_process_group()


def _check_corpus(corpus) -> None:
    """A corpus that is neither registered nor an existing file/folder is refused before anything is written."""
    from posenc.data.corpora import CORPORA

    if isinstance(corpus, str) and corpus in CORPORA:
        return
    if not Path(corpus).expanduser().exists():
        close = difflib.get_close_matches(str(corpus), sorted(CORPORA), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown corpus {str(corpus)!r}{hint}: corpus must be one of {sorted(CORPORA)} or an "
                         f"existing file/folder")


def _training_loss(model: TinyLM, fwd, tokens, cfg: TrainConfig, step: int, rank: int, world: int, device):
    """:func:`_batch_loss` under the training attention (:func:`_attention_for_training`)."""
    with _attention_for_training(model, cfg):
        return _batch_loss(fwd, tokens, cfg, step, rank, world, device)


def _attention_for_training(model: TinyLM, cfg: TrainConfig):
    """S^2-attention (:func:`posenc.training.s2.s2_attention`) for the forward and backward of a training step when
    ``cfg.s2_groups``; plain attention (a no-op context) otherwise. Evaluation is always full attention."""
    import contextlib

    from posenc.training.s2 import s2_attention

    return s2_attention(model, cfg.s2_groups) if cfg.s2_groups else contextlib.nullcontext()


def _stop_now(stop: StopSignals, world: int, device) -> bool:
    """Whether a stop was requested, agreed by every rank (one all-reduce per step under DDP)."""
    if world == 1:
        return stop.requested
    flag = torch.tensor([1.0 if stop.requested else 0.0], device=device)  # on the device: NCCL needs it there
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def _model_and_state(cfg: TrainConfig, run_dir: Path, resume: bool, vocab_size: int, device):
    """The model, its AdamW and the train state: fresh (seeded), or restored from the run's checkpoint."""
    torch.manual_seed(cfg.seed)
    model = _build_model(cfg, vocab_size).to(device)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    state = {"step": 0, "finished": False, "history": [], "val_history": [], "wall_time_s": 0.0}
    if resume:
        state = {**state, **ckpt.load_checkpoint(run_dir, model, opt, restore_rng=True)["train_state"]}
    return model, opt, state


def _stopped(stop: StopSignals, step: int, cfg: TrainConfig, run_dir: Path) -> None:
    """Raise :class:`~posenc.runtime.interrupt.Interrupted` after the checkpoint of ``step`` was saved."""
    stop.signum = stop.signum or signal.SIGTERM  # under DDP: another rank's signal
    stop.check(lambda sig: f"interrupted by {sig} at step {step} of {cfg.steps}: saved a checkpoint in {run_dir}; "
                           f"run the same command again to resume from it")


def _train(cfg, progress, on_step, run_dir, rank, world, device, prepare, tqdm, stop) -> dict:
    t_start = time.perf_counter()
    resume = ckpt.has_checkpoint(run_dir)
    if resume:
        meta = ckpt.read_config(run_dir)
        _compatible(meta.get("extra", {}).get("train", {}), cfg)
        state = ckpt.load_checkpoint(run_dir, restore_rng=False)["train_state"]  # validates every file
        if state.get("finished"):
            return _summary(run_dir, state, reused=True)
    corpus = prepare(cfg.corpus, cfg.tokenizer)
    if cfg.batch_size % world or cfg.recall_batch % world:
        raise ValueError(f"batch_size ({cfg.batch_size}) and recall_batch ({cfg.recall_batch}) must be divisible by "
                         f"the number of processes ({world})")
    model, opt, state = _model_and_state(cfg, run_dir, resume, corpus.vocab_size, device)
    resumed_from = state["step"] if resume else None
    extra = {"corpus": str(cfg.corpus), "tokenizer": corpus.meta.get("tokenizer", {"name": cfg.tokenizer}),
             "corpus_stats": corpus.stats, "train": cfg.to_dict()}
    net: nn.Module = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    fwd = torch.compile(net) if cfg.compile else net
    model.train()

    def save(finished: bool) -> None:
        if rank == 0:
            state["finished"] = finished
            ckpt.save_checkpoint(run_dir, model, model.cfg, state, opt, extra)
        if world > 1:
            torch.distributed.barrier()

    tokens_per_step = (cfg.batch_size + cfg.recall_batch) * cfg.train_len
    start_step, t_loop = state["step"], time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=start_step, desc=f"train {model.scheme.name}", unit="step",
               disable=not progress or rank != 0, dynamic_ncols=True)
    projected = [m for m in model.modules() if callable(getattr(m, "project_", None))]
    for step in range(start_step, cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss = _training_loss(model, fwd, corpus.train, cfg, step, rank, world, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        for mod in projected:  # parts with constrained parameters (KERPLE r1, r2) project after the step
            mod.project_()
        logged = loss.detach().double()
        if world > 1:  # mean over ranks = loss of the global batch (equal slices)
            torch.distributed.all_reduce(logged)
            logged /= world
        state["history"].append(float(logged))
        state["step"] = step + 1
        done = step + 1 - start_step
        elapsed = time.perf_counter() - t_loop
        state["tokens_per_s"] = done * tokens_per_step / max(elapsed, 1e-9)
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            state["val_history"].append([step + 1, _val_loss(model, corpus.val, cfg, rank, world, device)])
        bar.update(1)
        if cfg.log_every and (done % cfg.log_every == 0 or step + 1 == cfg.steps):
            bar.set_postfix(loss=f"{state['history'][-1]:.4f}", tok_s=f"{state['tokens_per_s']:.0f}",
                            lr=f"{lr_at(step, cfg):.2e}")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            state["wall_time_s"] = state.get("wall_time_s", 0.0) + (time.perf_counter() - t_start)
            t_start = time.perf_counter()
            save(False)
        if on_step is not None:
            on_step(step + 1, state["history"][-1])
        if _stop_now(stop, world, device) and step + 1 < cfg.steps:  # SIGINT/SIGTERM: save this step, then stop
            bar.close()
            state["wall_time_s"] = state.get("wall_time_s", 0.0) + (time.perf_counter() - t_start)
            save(False)
            _stopped(stop, step + 1, cfg, run_dir)
    bar.close()
    state["val_loss"] = _val_loss(model, corpus.val, cfg, rank, world, device)
    state["wall_time_s"] = state.get("wall_time_s", 0.0) + (time.perf_counter() - t_start)
    save(True)
    stop.check(f"the run in {run_dir} had just finished ({cfg.steps} steps) and is saved")
    return _summary(run_dir, state, resumed_from=resumed_from)
