"""What makes ``posenc bench`` resumable: training that resumes mid-scheme, evaluations kept as cells.

- :func:`save_every`: the bench's training runs save a checkpoint every tenth of their steps (and on
  SIGINT/SIGTERM, :mod:`posenc.runtime.interrupt`); :func:`train_or_reuse` reuses a finished checkpoint, resumes
  an unfinished one from its last step, or trains from 0, and logs which.
- :class:`BenchCells`: each (model, length, probe) evaluation is one cell of a
  :class:`~posenc.runtime.cells.CellStore` in ``OUT/cells/``. Its key names everything the result depends on:
  the exact weights (the sha256 ``config.json`` records for ``model.safetensors``), the methods, the length,
  the probe, the preset's settings, the test tokens (their sha256), the device and the posenc version. A
  finished cell is read back instead of computed; after each new cell a recorded SIGINT/SIGTERM stops the
  run with every finished cell kept.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["BenchCells", "finished", "save_every", "train_or_reuse"]


def save_every(steps: int) -> int:
    """A checkpoint every tenth of the steps: a run killed without warning (SIGKILL, a power cut) resumes
    from the last one; SIGINT and SIGTERM save the current step anyway."""
    return max(1, steps // 10)


def finished(run_dir: Path) -> bool:
    """A committed checkpoint whose train_state says finished (a damaged one is not: training says why)."""
    from posenc.models.checkpoint import has_checkpoint, read_train_state

    if not has_checkpoint(run_dir):
        return False
    try:
        return bool(read_train_state(run_dir).get("finished", False))
    except ValueError:
        return False


def train_or_reuse(label: str, plan: str, run_dir: Path, steps: int, log, train, /, *args, **kwargs) -> None:
    """Reuse a finished checkpoint in ``run_dir``, or run ``train(*args, **kwargs)``, which resumes an
    unfinished one from its last saved step (:func:`posenc.training.train.train`) or trains from 0; log lines
    say which (``plan``: what training means)."""
    from posenc.models.checkpoint import has_checkpoint, read_train_state

    if finished(run_dir):
        log(f"{label}: reusing {run_dir}")
        return
    log(f"{label}: {plan}")
    if has_checkpoint(run_dir):
        try:
            done = int(read_train_state(run_dir).get("step", 0))
        except ValueError:
            done = 0  # damaged: train() refuses it with the reason
        if done:
            log(f"{label}: resuming at step {done} of {steps} from {run_dir} (steps 1-{done} are not trained again)")
    train(*args, **kwargs)


class BenchCells:
    """The evaluation cells of one bench run, in ``folder`` (see the module docstring). :meth:`model`
    selects the model the following :meth:`get` calls are about."""

    def __init__(self, folder: Path, preset, data, device: str, stop, *, tidy: bool = True):
        import numpy as np

        from posenc._version import __version__
        from posenc.runtime.atomic import remove_stale_temps
        from posenc.runtime.cells import CellStore

        self.store, self.stop = CellStore(folder), stop
        if tidy:  # of cells a killed run was writing (the bench holds the folder's lock; its workers do not tidy)
            remove_stale_temps(folder)
        config = {k: v for k, v in preset.to_dict().items() if k not in ("name", "description", "threads", "jobs")}
        tokens = hashlib.sha256(np.ascontiguousarray(data.test).tobytes()).hexdigest()
        self.base = json.loads(json.dumps({"preset": config, "test_tokens": tokens, "device": device,
                                           "posenc": __version__}, default=str))
        self.current: dict = {}
        self.reused = self.computed = 0

    def model(self, name: str, run_dir: Path, methods):
        """Select the model ``name`` (weights in ``run_dir``) under ``methods``; returns a loader that loads it
        once, on first use (a model whose cells are all finished is never loaded)."""
        from posenc.models.checkpoint import load_model, model_digest

        self.current = {"model": name, "weights": model_digest(run_dir), "methods": list(methods)}
        loaded: list = []

        def load():
            if not loaded:
                loaded.append(load_model(run_dir, device=self.base["device"]))
            return loaded[0]

        return load

    def get(self, probe: str, length, compute, /, *args, **kwargs):
        """The cell ``(probe, length)`` of the selected model: read back, or ``compute(*args, **kwargs)`` (plain
        JSON), stored, and returned as a later run reads it back."""
        key = {**self.base, **self.current, "probe": probe, "length": length}
        value = self.store.get(key)
        if value is not None:
            self.reused += 1
            return value
        value = json.loads(json.dumps(compute(*args, **kwargs), default=str))  # exactly what a resume reads
        self.store.put(key, value)
        self.computed += 1
        self.stop.check(lambda sig: f"interrupted by {sig} during the evaluation of {self.current['model']}: "
                                    f"{len(self.store)} finished evaluation cell(s) are kept in {self.store.folder}; "
                                    f"run the same command again to continue from there")
        return value
