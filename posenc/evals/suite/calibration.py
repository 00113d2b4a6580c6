"""Parameters a method takes from the model itself, found once per suite run: a fixed parameter written as
``"calibrate"`` in a preset is resolved here before any cell runs, and stored with the run's cells (so a resumed
run reuses it and every cell key holds the resolved value).

Registered (:data:`CALIBRATIONS`, the procedure a parameter's record names in ``Param.calibration`` -> function):

- ``duo_streaming`` (DuoAttention's ``streaming``): its streaming heads per layer
  (:func:`posenc.evals.calibrate.calibrate_duo`), from one forward pass over a pass-key context at the preset's
  reference length (the needle far back, as DuoAttention calibrates on passkeys in long filler), with the sinks and
  window the method runs with at that length, half of the (layer, KV head) pairs kept retrieving.

A calibration runs the run's model on its device with its dtype (:class:`posenc.evals.suite.spec.ModelFacts`), its
input made there too, so what the engine records stays on that device; its key names the device and dtype as a
cell's key does (:func:`posenc.evals.suite.spec.runs_on`: nothing for float32 on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

__all__ = ["CALIBRATE", "CALIBRATIONS", "resolve"]

CALIBRATE = "calibrate"


def duo_streaming(m, preset, length: int) -> list[list[int]]:
    """Streaming query heads per layer for the model ``m`` (a :class:`posenc.evals.suite.spec.ModelFacts`)."""
    import torch

    from posenc.evals.calibrate import calibrate_duo
    from posenc.evals.suite.spec import method_params
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack

    params = method_params("duo", m.train_len, length, m.head_dim, m.base, {})
    model = m.fresh("duo", {**params, "streaming": []})  # every head retrieving, through posenc's engine
    ctx = build_context(m.tokenizer, make_haystack("noise", m.tokenizer), length, ("passkey",), seed=0,
                        options={"passkey": {"depth": 0.1}})
    n_layers = model.config.num_hidden_layers
    ids = torch.tensor([ctx.ids], device=next(model.parameters()).device)  # what the engine records stays there

    def run():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return calibrate_duo(run, n_layers, n_sinks=params["n_sinks"], window=params["window"], retrieval_fraction=0.5)


CALIBRATIONS: dict[str, Callable] = {"duo_streaming": duo_streaming}


def resolve(preset, m, store, log: Callable[[str], None] = print, *, compute: bool = True):
    """``preset`` with every ``"calibrate"`` parameter replaced by its value for model ``m`` (computed once and
    kept in ``store`` under a calibration key). ``compute=False``: only the values already kept are filled in
    (the others stay ``"calibrate"``, so no finished cell matches their rows)."""
    from posenc.evals.suite.spec import SUITE_VERSION, runs_on
    from posenc.methods import lookup, method_spec

    params = {label: dict(p) for label, p in preset.params.items()}
    for label, fixed in params.items():
        for name, value in fixed.items():
            if value != CALIBRATE:
                continue
            record = lookup(method_spec(label), hf=True).param(name)
            fn = CALIBRATIONS.get(record.calibration) if record is not None else None
            if fn is None:
                raise ValueError(f"{label}.{name}='calibrate': no calibration is registered for it (calibrated "
                                 f"parameters: {_calibrated()})")
            key = {"suite": SUITE_VERSION, "calibration": f"{method_spec(label)}.{name}", "model": m.model_id,
                   "length": preset.reference_length, **runs_on(m.device, m.dtype)}
            got = store.get(key)
            if got is None and not compute:
                continue
            if got is None:
                log(f"calibrating {label}.{name} on {m.model_id} at {preset.reference_length} tokens")
                got = fn(m, preset, preset.reference_length)
                store.put(key, got)
            fixed[name] = got
    return replace(preset, params=params)


def _calibrated() -> list[str]:
    """``method.parameter`` of every parameter whose record names a registered calibration."""
    from posenc.methods import METHODS

    return [f"{m.name}.{p.name}" for m in METHODS.values() for p in m.params if p.calibration in CALIBRATIONS]
