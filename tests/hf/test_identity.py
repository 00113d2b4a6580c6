"""posenc.hf.identity: a model is named by its content, not by its folder's name: two models in ``a/model`` and
``b/model`` differ, one model copied elsewhere is the same, a large weights file is read in samples and still
told apart, and a folder posenc converted keeps the key the committed benchmark cells were written under."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import posenc.hf.identity as identity
from posenc.hf.identity import content_digest, model_id
from tests.support.tiny_hf import make_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The same tiny Llama architecture with two seeds, saved as ``a/model`` and ``b/model``, and ``a`` copied to
    ``c/elsewhere``."""
    root = tmp_path_factory.mktemp("two")
    for name, seed in (("a", 0), ("b", 1)):
        make_model("llama", seed=seed).save_pretrained(root / name / "model")
    shutil.copytree(root / "a" / "model", root / "c" / "elsewhere")
    return root


def _id(folder: Path) -> str:
    return model_id(folder, folder, "llama")


def test_two_models_in_folders_of_one_name_get_different_ids_and_a_copy_the_same(two):
    a, b, c = _id(two / "a" / "model"), _id(two / "b" / "model"), _id(two / "c" / "elsewhere")
    assert a != b  # same config, same safetensors header, other weights
    assert a == c  # the content, not the path or the folder's name
    assert a.startswith("hf-") and a.endswith(":llama") and "model" not in a


def test_a_large_weights_file_is_sampled_and_still_tells_models_apart(two, tmp_path, monkeypatch):
    """Above WHOLE_FILE_BYTES the weights are read as header + the first bytes of each tensor + spread blocks: a
    seed apart, or one tensor's first value changed, is another model; the copy is the same one."""
    monkeypatch.setattr(identity, "WHOLE_FILE_BYTES", 1024)
    a, b, c = (content_digest(two / p) for p in ("a/model", "b/model", "c/elsewhere"))
    assert a != b and a == c
    d = tmp_path / "d"
    shutil.copytree(two / "a" / "model", d)
    w = d / "model.safetensors"
    header = json.loads(w.read_bytes()[8:8 + int.from_bytes(w.read_bytes()[:8], "little")])
    name = sorted(k for k in header if k != "__metadata__")[-1]  # the last tensor in the digest's order
    start = 8 + int.from_bytes(w.read_bytes()[:8], "little") + header[name]["data_offsets"][0]
    raw = bytearray(w.read_bytes())
    raw[start] ^= 0xFF
    w.write_bytes(bytes(raw))
    assert content_digest(d) != a


def test_a_converted_folder_keeps_its_name_as_its_id(tmp_path):
    """A folder posenc converted (a GGUF file, a bundled name, a lab run) is named by its folder, whose name holds
    the digest of what it came from; its files are not read."""
    folder = tmp_path / "cache" / "m.Q4_1-0123456789abcdef"
    folder.mkdir(parents=True)
    assert model_id(tmp_path / "m.Q4_1.gguf", folder, "llama") == "m.Q4_1-0123456789abcdef:llama"
    assert model_id("smollm2", folder, "llama") == "m.Q4_1-0123456789abcdef:llama"


@pytest.mark.slow
def test_the_bundled_models_id_is_the_one_its_committed_cells_are_keyed_by():
    """The committed SmolLM2 suite results were written under this id: it must not change."""
    from posenc.evals.suite.spec import load_facts

    committed = json.loads((ROOT / "benchmarks/results/suite-smollm2-full/results.json").read_text())
    assert load_facts("smollm2").model_id == committed["meta"]["model_id"] == \
        "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f:llama"
