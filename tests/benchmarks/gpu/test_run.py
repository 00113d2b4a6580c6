"""The prepared GPU script (``benchmarks/gpu/run.py``) cannot rot: its dry run (the same script on the CPU at tiny
sizes, CUDA's engine routes simulated by :mod:`posenc.engine.simulate`) runs every section here, and its record,
budget and report logic are checked directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import report
from benchmarks.gpu.common import Run, card_slug
from benchmarks.gpu.run import main, summary

ROOT = Path(__file__).resolve().parents[3]


class _Name:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L40S", "l40s")])
def test_card_slug_names_the_card(monkeypatch, name, slug):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert card_slug(torch.device("cuda")) == slug
    assert card_slug(torch.device("cpu")) == "cpu"


def _run(tmp_path, budget=100.0) -> Run:
    return Run(tmp_path / "r.json", tmp_path / "log.txt", budget, torch.device("cpu"), torch.float32, True)


def test_a_failing_item_is_recorded_and_the_run_goes_on(tmp_path):
    run = _run(tmp_path)
    with run.item("s", "broken") as go:
        assert go
        raise RuntimeError("kernel exploded")
    with run.item("s", "fine") as go:
        run.put("s", "value", 3)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["errors"][0]["item"] == "broken" and "kernel exploded" in data["errors"][0]["error"]
    assert data["sections"]["s"]["value"] == 3 and go


def test_an_item_past_its_share_of_the_budget_is_skipped_and_listed(tmp_path):
    run = _run(tmp_path, budget=100.0)
    with run.share(0.01):  # one second of the budget for this section
        with run.item("s", "needs ten seconds", need=10) as go:
            assert not go
    with run.item("s", "after the section", need=10) as go:
        assert go  # the section's share ended: the whole budget counts again
    data = json.loads((tmp_path / "r.json").read_text())
    assert [s["item"] for s in data["skipped"]] == ["needs ten seconds"]


def test_without_cuda_the_script_asks_for_a_dry_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--out", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_dry_run_of_the_ceilings_writes_the_record_and_summary(tmp_path, capsys):
    assert main(["--dry-run", "--out", str(tmp_path), "--sections", "ceilings"]) == 0
    data = json.loads((tmp_path / "gpu-cpu.json").read_text())
    assert data["dry_run"] and data["posenc_import"]["ok"] and not data["errors"]
    assert data["sections"]["ceilings"]["copy_GBps"] > 0
    assert "ceilings: copy" in capsys.readouterr().out
    assert (tmp_path / "log.txt").read_text().count("done ceilings") == 1


@pytest.mark.slow
def test_the_whole_dry_run_passes_every_check_and_renders(tmp_path):
    """Every section in a fresh interpreter, as the device runs it (``run.sh``): no error, nothing skipped, every
    correctness check within tolerance, every anchor and model row present, and the report renders them."""
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--dry-run", "--out", str(tmp_path),
                           "--budget", "900"], capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-cpu.json").read_text())
    assert not data["errors"] and not data["skipped"], (data["errors"], data["skipped"])
    corr = data["sections"]["correctness"]
    assert corr["engine"] and all(r["pass"] for r in corr["engine"])
    assert {r["method"] for r in corr["decode"]} == {"yarn", "selfextend", "rerope", "dca", "string",
                                                     "streaming_llm", "ntk"} and all(r["pass"] for r in corr["decode"])
    ran = {r["ran"] for r in corr["engine"]}
    assert {"reference", "sdpa", "flex", "blockwise", "band", "chunks", "sinks", "toeplitz"} <= ran, ran
    anchors = data["sections"]["anchors"]
    assert {"rope", "alibi", "remaps", "sliding_window", "training_step"} <= set(anchors)
    assert [r["method"] for r in anchors["remaps"]] == ["rerope", "selfextend", "dca", "string"]
    rows = data["sections"]["models"]["rows"]
    assert {(r["model"], r["method"]) for r in rows} >= {("smollm2-135m", "selfextend"), ("llama-3.1-8b", "dca")}
    assert all("prefill_vs_untouched" in r for r in rows if r["method"] != "none")
    table = report.render(data)
    assert table.count("| smollm2-135m |") == 8 and "| anchor |" in table
    assert summary(data).startswith("card ")
