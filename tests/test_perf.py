"""Benchmarks run at tiny sizes and write well-formed JSON; the fused RoPE kernel equals the PyTorch path.

No timing asserts: timings are only reported by ``benchmarks/`` (see ``make perf``).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from posenc.parts.rotary import (
    _KERNEL_MIN_NUMEL,
    _cached_cos_sin,
    _rotate_kernel,
    _rotate_torch,
    apply_rope,
    apply_rope_,
    apply_rope_cos_sin,
    rope_cos_sin,
    rope_kernel,
)

needs_kernel = pytest.mark.skipif(rope_kernel() is None, reason="C++ extension unavailable (pure path is used)")


def _inv(rot: int) -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))



@needs_kernel
def test_a_build_killed_half_way_does_not_hang_later_processes():
    """A killed ``load_inline`` build leaves torch's baton file (``<build dir>/lock``); torch then waits
    for it forever. The kernel's own flock proves the baton stale and removes it, so a new process loads
    the kernel instead of sleeping (without the fix this subprocess never returns)."""
    import os
    import subprocess
    import sys

    from posenc.parts.rotary import _BuildLock, _extension_dir

    build_dir = _extension_dir()
    with _BuildLock(build_dir) as lock:  # no live build can be in progress while we hold it
        open(lock.baton, "w").close()  # what a build killed half-way leaves behind
    code = "from posenc.parts.rotary import rope_kernel; assert rope_kernel() is not None"
    done = subprocess.run([sys.executable, "-c", code], timeout=180, capture_output=True, text=True,
                          env={**os.environ, "POSENC_NO_EXT": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert not os.path.exists(os.path.join(build_dir, "lock"))

def test_each_torch_install_builds_the_kernel_in_its_own_folder(monkeypatch):
    """Two environments (two checkouts, two venvs) must not share a build folder: the build file names
    torch's include paths, so sharing makes each environment rebuild the kernel every time the other ran."""
    from posenc.parts.rotary import _extension_dir

    monkeypatch.setattr(torch, "__file__", "/env_a/site-packages/torch/__init__.py")
    a, a_again = _extension_dir(), _extension_dir()
    monkeypatch.setattr(torch, "__file__", "/env_b/site-packages/torch/__init__.py")
    assert a == a_again and _extension_dir() != a
    assert os.path.basename(a).startswith("posenc_rope_v1-py")


# ---------------------------------------------------------------------------------------------- kernel
@needs_kernel
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rot", [64, 32])
@pytest.mark.parametrize("batch_cos", [False, True])
def test_kernel_bit_identical_to_torch_path(layout, rot, batch_cos):
    g = torch.Generator().manual_seed(0)
    B, H, N, D = 2, 3, 50, 64
    x = torch.randn(B, H, N, D, generator=g) * 10
    pos = torch.randint(0, 100000, (B if batch_cos else 1, N), generator=g)
    cos, sin = rope_cos_sin(pos, _inv(rot))
    got = _rotate_kernel(x.contiguous(), cos, sin, layout, rot, torch.empty_like(x))
    want = _rotate_torch(x, cos, sin, layout, rot)
    assert torch.equal(got, want), (got - want).abs().max()


@needs_kernel
def test_public_api_uses_kernel_and_matches_pure_path():
    x = torch.randn(1, 8, 512, 64)
    assert x.numel() >= _KERNEL_MIN_NUMEL
    pos = torch.arange(3, 515)
    cos, sin = rope_cos_sin(pos, _inv(64))
    want = _rotate_torch(x, cos, sin, "half", 64)
    assert torch.equal(apply_rope(x, pos, _inv(64)), want)
    assert torch.equal(apply_rope_cos_sin(x, cos, sin), want)
    y = x.clone()
    out = apply_rope_(y, pos, _inv(64))
    assert out.data_ptr() == y.data_ptr() and torch.equal(y, want)


def test_cached_cos_sin_equals_direct():
    pos = torch.tensor([[0, 5, 4095, 17], [1, 2, 3, 100]])
    c1, s1 = _cached_cos_sin(pos, _inv(64))
    c2, s2 = rope_cos_sin(pos, _inv(64))
    assert torch.equal(c1, c2) and torch.equal(s1, s2)


def test_inplace_fallbacks_noncontiguous_and_bf16():
    x = torch.randn(1, 64, 4, 32).transpose(1, 2)  # [1,4,64,32] non-contiguous
    want = apply_rope(x.clone(), torch.arange(64), _inv(32))
    y = x.clone()  # clone keeps the strides -> pure path + copy_
    assert torch.equal(apply_rope_(y, torch.arange(64), _inv(32)), want)
    xb = torch.randn(1, 2, 16, 32).bfloat16()
    assert torch.equal(apply_rope_(xb.clone(), torch.arange(16), _inv(32)), apply_rope(xb, torch.arange(16), _inv(32)))


def test_apply_rope_keeps_autograd():
    x = torch.randn(1, 8, 512, 64, requires_grad=True)  # big enough for the kernel, but grad -> torch path
    y = apply_rope(x, torch.arange(512), _inv(64))
    y.sum().backward()
    assert x.grad is not None and math.isfinite(float(x.grad.sum()))


# ---------------------------------------------------------------------------------------------- benchmarks
def _check_json(path, name):
    data = json.loads(path.read_text())
    assert data["benchmark"] == name
    assert {"cpu", "cores", "torch"} <= set(data["machine"])
    assert isinstance(data["summary"], dict) and data["summary"]
    return data


@pytest.mark.parametrize("name", ["bench_rope", "bench_training", "bench_attention", "bench_compile",
                                  "bench_generation", "bench_jobs", "bench_retrieval"])
def test_benchmark_quick_smoke(name, tmp_path):
    import importlib

    from benchmarks.common import write_json

    mod = importlib.import_module(f"benchmarks.{name}")
    res = mod.run(quick=True)
    data = _check_json(write_json(name, res, tmp_path), name)
    if name == "bench_rope":
        assert data["summary"]["shape"] == [1, 4, 256, 64]
    if name == "bench_attention":
        assert data["summary"]["rerope_bojone_vs_posenc_maxdiff"] < 1e-4  # the two ReRoPEs agree
        assert all("extra_mb" in m for m in data["memory"]), data["memory"]
        assert set(data["summary"]["goals"]) >= {"alibi<=1.5x_sdpa", "rerope<=2x_sdpa"}
    if name == "bench_retrieval":  # the two posenc paths compute the same attention
        assert data["summary"]["N=1024"]["max_abs_diff"] < 1e-5
    if name == "bench_jobs":  # the three peers, each against one job on one thread
        assert set(data["rows"]) == {"1 job x 1 thread", f"1 job x {os.cpu_count()} threads",
                                     f"{os.cpu_count()} jobs x 1 thread"}
        assert data["rows"]["1 job x 1 thread"]["speedup"] == 1.0
    if name == "bench_generation":  # the cache stays the same size however long the stream
        assert data["summary"]["streaming_cache_kib"][0] == data["summary"]["streaming_cache_kib"][1]


def test_perf_cli_writes_markdown(tmp_path):
    from posenc.cli import main

    assert main(["perf", "--quick", "--only", "bench_rope", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "perf.md").read_text()
    assert "| metric | value |" in md and "torch" in md
    assert md.count("Machine: ") == 1  # each section names its own JSON's machine; only bench_rope's exists here
    _check_json(tmp_path / "bench_rope.json", "bench_rope")
