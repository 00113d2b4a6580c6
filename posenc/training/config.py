"""The configuration of a training run (:class:`TrainConfig`): every field, its default (the lab's quick recipe) and
its checks. Apart from the training loop (:mod:`posenc.training.train`) so that reading the defaults (``posenc train
--help``) does not import torch."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from posenc._util import check_device

# The lab's quick recipe (posenc.evals.lab.bench.PRESETS["quick"]: 2 layers, L = 64, 2400 steps, 8 text windows and 32
# kv rows of 2 definitions at weight 1 per step, lr 1e-3), so `posenc train` with no flags trains the model the quick
# bench measures (docs/results/quick.md).
DEFAULT_WARMUP = 100
WARMUP_FRACTION = 5  # an unset warmup is at most steps // WARMUP_FRACTION
RECALL_TASKS = ("recall", "kv")  # the recall rows' generators: posenc.tasks.recall / posenc.tasks.kv_recall


class TrainConfigWarning(UserWarning):
    """A :class:`TrainConfig` setting that is allowed but makes little sense (:meth:`TrainConfig.warnings`)."""


@dataclass
class TrainConfig:
    """Everything that defines a training run. ``scheme`` is a preset name (with ``scheme_params``)
    or a ``PositionScheme.to_dict()``; ``init`` is a checkpoint folder to continue from.

    The defaults are the lab's quick recipe (``posenc bench --preset quick``): dim 128, 2 layers, 4 heads,
    ``train_len`` 64, 2400 steps of 8 text windows and 32 key-matching rows (``recall_task="kv"``, 2 definitions
    each, loss weight 1), lr 1e-3.
    ``warmup=None`` (the default) means ``min(100, steps // 5)`` (:attr:`warmup_steps`), so a short run is not
    all warmup."""

    out_dir: str
    corpus: str = "gutenberg"
    tokenizer: str = "byte"
    scheme: str | dict = "rope"
    scheme_params: dict = field(default_factory=dict)
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    train_len: int = 64
    batch_size: int = 8
    steps: int = 2400
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int | None = None
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dropout: float = 0.0
    seed: int = 0
    save_every: int = 500
    eval_every: int = 0
    eval_batches: int = 8
    log_every: int = 10
    init: str | None = None
    device: str = "cpu"
    compile: bool = False
    recall_batch: int = 32  # recall sequences added to each batch (posenc.tasks.kv_recall); 0: text only
    recall_weight: float = 1.0  # weight of their loss next to the text loss
    recall_pairs: int = 2  # key-value pairs (recall) or definitions (kv) per recall row
    recall_task: str = "kv"  # recall rows: "kv" (posenc.tasks.kv_recall) or "recall" (posenc.tasks.recall)
    positions: str = "contiguous"  # training position ids (posenc.training.positions): contiguous | pose | randomized
    position_range: int = 0  # the ids pose / randomized cover, L_t > train_len (required with them)
    pose_chunks: int = 2  # PoSE's chunks per window (the paper's default 2)
    s2_groups: int = 0  # LongLoRA S^2-attention groups per window at training (posenc.training.s2; paper: 4); 0: full

    def __post_init__(self):
        for names, minimum, what in (
                (("dim", "n_layers", "n_heads", "train_len", "batch_size", "steps", "eval_batches"), 1,
                 "a positive integer"),
                (("save_every", "eval_every", "seed", "log_every", "recall_batch"), 0, "a non-negative integer"),
                (("recall_pairs",), 1, "a positive integer")):
            for name in names:
                v = getattr(self, name)
                if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                    raise ValueError(f"TrainConfig.{name} must be {what}, got {v!r}")
        if self.warmup is not None and (isinstance(self.warmup, bool) or not isinstance(self.warmup, int)
                                        or self.warmup < 0):
            raise ValueError(f"TrainConfig.warmup must be a non-negative integer or None (min({DEFAULT_WARMUP}, "
                             f"steps // {WARMUP_FRACTION})), got {self.warmup!r}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip", "dropout", "recall_weight"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"TrainConfig.{name} must be a finite number >= 0, got {v!r}")
        check_device("TrainConfig.device", self.device)
        if self.recall_task not in RECALL_TASKS:
            raise ValueError(f"TrainConfig.recall_task must be one of {list(RECALL_TASKS)}, got {self.recall_task!r}")
        if self.min_lr > self.lr:
            raise ValueError(f"TrainConfig.min_lr ({self.min_lr}) must be <= TrainConfig.lr ({self.lr})")
        self._check_training_options()

    @property
    def warmup_steps(self) -> int:
        """The warmup in use: ``warmup``, or ``min(100, steps // 5)`` when it is None."""
        return min(DEFAULT_WARMUP, self.steps // WARMUP_FRACTION) if self.warmup is None else self.warmup

    def warnings(self) -> list[str]:
        """Settings that are allowed but make little sense, one sentence each (``train`` issues them as
        :class:`TrainConfigWarning`; ``posenc train`` prints them with the flags' names)."""
        out = []
        if self.warmup is not None and self.warmup > self.steps // 2:
            out.append(f"TrainConfig.warmup ({self.warmup}) is more than half of TrainConfig.steps ({self.steps}): "
                       f"the learning rate peaks only at step {min(self.warmup, self.steps)}; leave it unset for "
                       f"min({DEFAULT_WARMUP}, steps // {WARMUP_FRACTION}) = {min(DEFAULT_WARMUP, self.steps // 5)}")
        if self.lr == 0:
            out.append("TrainConfig.lr is 0: the weights never change")
        if not self.recall_batch and (self.recall_weight != 1.0 or self.recall_pairs != 2):
            out.append("TrainConfig.recall_weight and TrainConfig.recall_pairs have no effect with "
                       "TrainConfig.recall_batch 0 (no recall rows)")
        if self.eval_every and self.eval_every >= self.steps:
            out.append(f"TrainConfig.eval_every ({self.eval_every}) is not below TrainConfig.steps ({self.steps}): no "
                       f"validation loss before the final one")
        return out

    def _check_training_options(self) -> None:
        """The training-time extension options: PoSE / randomized ids (:mod:`posenc.training.positions`) and
        S^2-attention (:mod:`posenc.training.s2`)."""
        from posenc.training.positions import POSITION_KINDS

        if self.positions not in POSITION_KINDS:
            raise ValueError(f"TrainConfig.positions must be one of {list(POSITION_KINDS)}, got {self.positions!r}")
        for name in ("position_range", "s2_groups", "pose_chunks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "pose_chunks" else 0):
                what = "positive" if name == "pose_chunks" else "non-negative"
                raise ValueError(f"TrainConfig.{name} must be a {what} integer, got {v!r}")
        if self.positions != "contiguous" and self.position_range <= self.train_len:
            raise ValueError(f"TrainConfig.position_range must be > train_len ({self.train_len}) with positions="
                             f"{self.positions!r}, got {self.position_range}")
        if self.pose_chunks > self.train_len:
            raise ValueError(f"TrainConfig.pose_chunks must be in [1, train_len={self.train_len}], got "
                             f"{self.pose_chunks}")
        if self.s2_groups and (self.train_len % self.s2_groups or (self.train_len // self.s2_groups) % 2):
            raise ValueError(f"TrainConfig.s2_groups must split train_len ({self.train_len}) into groups of an even "
                             f"size, got {self.s2_groups}")

    def to_dict(self) -> dict:
        return asdict(self)
