"""benchmarks/profile_decode.py: the profile's split of a decode step's attention (kernels, rotations, the rest of the
engine) read from cProfile's records, the table of a hand-made result, and (slow tier) a short run on SmolLM2."""

from __future__ import annotations

import pytest

from benchmarks.profile_decode import split, table


class _Stats:
    """What :func:`split` reads of a ``pstats.Stats``: ``stats[(file, line, name)] = (cc, nc, own, cumulative,
    callers)``."""

    def __init__(self, rows):
        self.stats = {(f, 1, n): (nc, nc, tt, ct, {}) for f, n, nc, tt, ct in rows}


def test_the_split_reads_the_kernels_own_time_and_the_rotations_cumulative_time():
    stats = _Stats([
        ("/x/posenc/hf/attention.py", "posenc_attention", 60, 0.01, 0.30),
        ("~", "<built-in method torch._ops.aten._scaled_dot_product_flash_attention_for_cpu>", 120, 0.12, 0.12),
        ("/x/posenc/engine/rotation.py", "rotate_queries", 120, 0.01, 0.03),
        ("/x/posenc/engine/rotation.py", "rotate_keys", 120, 0.01, 0.06),
        ("/x/posenc/engine/rotation.py", "cos_sin", 240, 0.02, 0.02),  # inside the two above: not counted again
        ("/y/transformers/models/llama/modeling_llama.py", "apply_rotary_pos_emb", 60, 0.006, 0.006),
    ])
    p = split(stats, layer_calls=60)
    assert p["attention_ms"] == pytest.approx(5.0) and p["kernel_ms"] == pytest.approx(2.0)
    assert p["kernel_calls_per_layer"] == 2 and p["rotation_ms"] == pytest.approx(1.5)
    assert p["engine_rest_ms"] == pytest.approx(1.5) and p["hf_rope_ms"] == pytest.approx(0.1)


def test_the_table_gives_each_rows_speed_its_extra_per_layer_and_the_split():
    prof = {"attention_ms": 2.0, "kernel_ms": 1.0, "kernel_calls_per_layer": 2, "rotation_ms": 0.5,
            "engine_rest_ms": 0.5, "hf_rope_ms": 0.0}
    res = {"untouched": {"ms_per_step": [100.0, 102.0], "profile": {**prof, "attention_ms": 0.8, "kernel_ms": 0.7,
                                                                     "kernel_calls_per_layer": 1, "hf_rope_ms": 0.1}},
           "rows": {"selfextend": {"ms_per_step": [130.0, 128.0], "ratio": 0.79, "extra_ms_per_layer": 0.93,
                                   "profile": prof}}}
    lines = table(res).splitlines()
    assert lines[2] == "| untouched | 100.0, 102.0 | 1 | - | 0.80 | 1 | 0.70 | 0.10 | 0.10 |"
    assert lines[3] == "| selfextend | 130.0, 128.0 | 0.79 | 0.93 | 2.00 | 2 | 1.00 | 0.50 | 0.50 |"
    assert len(lines) == 4


@pytest.mark.slow
def test_a_short_run_on_the_real_model_profiles_every_row():
    from benchmarks.profile_decode import run

    res = run(n=8192, steps=2, repeats=1, methods=("selfextend",), log=lambda *_: None)
    row = res["rows"]["selfextend"]
    assert len(row["ms_per_step"]) == 1 and len(res["untouched"]["ms_per_step"]) == 1
    # SelfExtend's decode step runs two pieces (near and far) on the fused kernel in every layer; the untouched
    # model one SDPA call
    assert row["profile"]["kernel_calls_per_layer"] == 2 and res["untouched"]["profile"]["kernel_calls_per_layer"] == 1
    assert row["profile"]["rotation_ms"] > 0 and res["untouched"]["profile"]["hf_rope_ms"] > 0
