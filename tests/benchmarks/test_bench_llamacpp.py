"""benchmarks/bench_llamacpp_*: the agreement statistics on hand-made logits, and the speed benchmark's refusal to
time a loaded machine."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_llamacpp_agreement import cell
from benchmarks.bench_llamacpp_selfextend import compare


def test_agreement_statistics_on_hand_made_logits():
    ref = np.array([[3.0, 1.0, 0.0], [1.0, 1.2, 0.0]])
    got = np.array([[3.0, 1.0, 0.0], [1.3, 1.2, 0.0]])  # the second position's top token flips (margin 0.2)
    c = cell(ref, got)
    assert c["agree"] == 0.5 and c["margins_where_disagree"] == [0.2] and c["min_margin_agree"] == 2.0
    assert c["max_abs"] == pytest.approx(0.3) and c["kl_max"] > 0 and c["kl_mean"] == pytest.approx(c["kl_max"] / 2)
    same = compare(ref, ref)
    assert same["top1_agree"] == 1.0 and same["kl_max"] == pytest.approx(0.0, abs=1e-12) and same["positions"] == 2
    assert compare(ref, got)["top1_agree"] == 0.5


def test_the_speed_benchmark_refuses_a_loaded_machine(monkeypatch):
    from benchmarks import bench_llamacpp_speed

    monkeypatch.setattr(bench_llamacpp_speed.os, "getloadavg", lambda: (3.2, 3.0, 2.9))
    with pytest.raises(SystemExit, match=r"not idle \(1-minute load average 3.20\)"):
        bench_llamacpp_speed.run([2048], 4, 2, 1, force=False)


def test_the_speed_table_prints_each_engines_seconds_and_posencs_ratio_to_it():
    from benchmarks.bench_llamacpp_speed import table

    res = {"rows": [{"length": 16384, "method": "yarn",
                     "cells": {"posenc": {"prefill_s": 80.0, "decode_tok_s": 6.0},
                               "llama.cpp fa=off": {"prefill_s": 160.0, "decode_tok_s": 12.0},
                               "llama.cpp fa=on": {"prefill_s": 40.0, "decode_tok_s": 3.0}},
                     "posenc_over_llama": {"llama.cpp fa=off": {"prefill": 0.5, "decode": 0.5},
                                           "llama.cpp fa=on": {"prefill": 2.0, "decode": 2.0}}}]}
    lines = table(res).splitlines()
    assert lines[0].count("|") == 9 and "llama.cpp fa=on: prefill s (posenc / it)" in lines[0]
    assert lines[2] == "| 16k | yarn | 80.0 | 6.0 | 160.0 (0.50x) | 12.0 (0.50x) | 40.0 (2.00x) | 3.0 (2.00x) |"
