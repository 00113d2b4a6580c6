"""posenc.evals.lab.presets: preset validation, scheme entries with their parameters, YaRN's two-stage fine-tune
schedule, and a fine-tune's learning-rate schedule."""

from __future__ import annotations

import pytest

from posenc.evals.lab import bench
from posenc.evals.lab.bench import yarn_schedule
from posenc.training.train import TrainConfig, lr_at
from tests.training.test_train import tiny  # noqa: F401  (the fixture)


def test_preset_validation():
    with pytest.raises(ValueError, match="passkey_factors"):
        bench.BenchPreset("bad", "", eval_factors=(1, 2), passkey_factors=(4,))
    with pytest.raises(ValueError, match="recall_factors"):
        bench.BenchPreset("bad", "", eval_factors=(1, 2), recall_factors=(1, 4))
    with pytest.raises(ValueError, match="preset must be one of"):
        bench.run_bench("nope", "/nonexistent", progress=False)


def test_scheme_entries_carry_preset_parameters():
    assert bench.scheme_spec("rope") == ("rope", {})
    assert bench.scheme_spec("local_global:every=2,window=16,local_base=1e4") == (
        "local_global", {"every": 2, "window": 16, "local_base": 10000.0})
    with pytest.raises(ValueError, match="key=value"):
        bench.scheme_spec("irope:every")
    from posenc.scheme.core import PositionScheme

    for entry in bench.PRESETS["hybrid"].schemes:  # every entry builds a 2-layer pattern the preset can train
        name, params = bench.scheme_spec(entry)
        scheme = PositionScheme.preset(name, train_len=64, **params)
        assert scheme.layers is None or len(scheme.layers) <= bench.PRESETS["hybrid"].n_layers


def test_finetune_schedule_warms_up_again_and_decays_from_the_lower_peak():
    """A bench fine-tune (FineTune.schedule): linear warmup to a tenth of the pretraining peak, then cosine decay
    to a tenth of that, never above the lower peak."""
    from posenc.evals.lab.bench import FineTune

    ft = FineTune("ft", "pi", {"factor": 2.0}, steps=150)
    sched = ft.schedule(3e-3)
    assert sched == pytest.approx({"lr": 3e-4, "min_lr": 3e-5, "warmup": 15})
    cfg = TrainConfig(out_dir="x", steps=150, **sched)
    lrs = [lr_at(s, cfg) for s in range(150)]
    assert lrs[0] == pytest.approx(3e-4 / 15) and max(lrs) == pytest.approx(3e-4) == lrs[14]
    assert all(a < b for a, b in zip(lrs[:14], lrs[1:15]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[14:], lrs[15:]))  # then decays
    assert lr_at(150, cfg) == pytest.approx(3e-5)
    with pytest.raises(ValueError, match="lr_factor"):
        FineTune("ft", "pi", lr_factor=2.0)


# ------------------------------------------------------------------------------------------------ YaRN + bench
def test_yarn_schedule_is_two_stages_the_second_from_the_first():
    first, second = yarn_schedule(2.0, 150)
    assert (first.method, first.params, first.steps, first.len_factor, first.base) == \
        ("yarn", {"factor": 2.0}, 150, 2, "rope")
    assert (second.params, second.steps, second.len_factor, second.base) == ({"factor": 4.0}, 75, 2, first.name)
    assert second.scheme_from == "rope"  # re-scaled from the plain RoPE scheme: frequency schedules do not stack


def test_yarn_schedule_refuses_a_fractional_factor():
    with pytest.raises(ValueError, match="factor must be an integer > 1"):
        yarn_schedule(1.5)
