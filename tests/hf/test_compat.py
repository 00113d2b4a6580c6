"""posenc.hf.compat: the family scan, its report, and tiny models of real published configs
(tests/fixtures/hf_configs/: rope and attention fields as released, width and depth shrunk).

Cases that posenc gets wrong or refuses today are strict xfails, so a fix shows up as an XPASS."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf import compat, extend  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"

NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def _model(name):
    return compat.build_from_fixture(FIXTURES / f"{name}.json")


def _cached_equals_uncached(model):
    ids, mask = compat.left_padded_batch(int(model.config.vocab_size))
    cached = compat.greedy(model, ids, mask, True)
    assert cached.shape == (2, compat.PROMPT_LEN + compat.NEW_TOKENS)
    assert torch.equal(cached, compat.greedy(model, ids, mask, False))


# ===================================================================== the fixtures
def test_there_are_twelve_sourced_fixtures():
    assert len(NAMES) >= 12
    for name in NAMES:
        fields = compat.load_fixture(FIXTURES / f"{name}.json")
        assert "/" in fields["_source"] or "file id" in fields["_source"], name  # names where it was read


def test_fixture_without_source_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"model_type": "llama", "rope_theta": 1.0}))
    with pytest.raises(ValueError, match="_source"):
        compat.load_fixture(path)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_none_leaves_logits_unchanged(name):
    model = _model(name)
    ids, mask = compat.left_padded_batch(256)
    with torch.no_grad():
        ref = copy.deepcopy(model)(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(extend(model, "none")(input_ids=ids, attention_mask=mask).logits, ref)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_native_yarn(name):
    """YaRN factor 2 through transformers' own code where the model has no frequency scaling yet;
    a model that already has one (Llama 3.1, GPT-OSS, DeepSeek-V3, ...) is refused and left as it was."""
    model = _model(name)
    before = copy.deepcopy(model.config.rope_parameters)
    scaled = any(isinstance(v, dict) and v.get("rope_type", "default") != "default" for v in before.values()) \
        or before.get("rope_type", "default") != "default"
    if scaled:
        with pytest.raises(ValueError):
            extend(model, "yarn", factor=2.0)
        assert model.config.rope_parameters == before
        return
    extend(model, "yarn", factor=2.0)
    assert model.config.rope_parameters["rope_type"] == "yarn"
    _cached_equals_uncached(model)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_engine_rerope_cached_equals_uncached(name):
    model = extend(_model(name), "rerope", window=16)
    _cached_equals_uncached(model)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_engine_reproduces_the_models_rope(name):
    """Check (c): the engine under a scheme equal to plain RoPE gives the model's own logits."""
    model = _model(name)
    ids, mask = compat.left_padded_batch(256)
    assert compat.rope_difference(model, ids, mask) <= compat.ROPE_TOLERANCE


def test_rope_families_lists_rope_causal_lms():
    families = compat.rope_families()
    assert {"llama", "qwen2", "gemma3", "gpt_neox", "deepseek_v3"} <= set(families)
    assert "gpt2" not in families and "bert" not in families  # no rotary embedding / no causal LM


def test_rope_families_count_language_model_rope_only():
    """Inkling 2's only rotary embedding is its vision tower's (its text layers use a learned relative bias):
    not a RoPE causal LM. Families with a text rotary next to a vision one stay; Zamba2's RoPE is a config
    switch (use_mem_rope, off by default) that the scan's tiny config turns on."""
    families = compat.rope_families()
    assert "inkling2" not in families
    assert {"llama4", "qwen3_5", "zamba2"} <= set(families)
    assert not compat._text_rope("class FooVisionRotaryEmbedding(nn.Module):\n    pass\n")
    assert compat._text_rope("class FooVisionRotaryEmbedding(nn.Module):\n    pass\n"
                             "class FooTextRotaryEmbedding(nn.Module):\n    pass\n")
    assert type(compat.build_tiny("zamba2").model.rotary_emb).__name__ == "Zamba2RotaryEmbedding"


def test_scan_rows_pass_refused_unbuildable(monkeypatch):
    real = compat.build_tiny

    def build(family, seed=0):
        if family == "mistral":
            raise RuntimeError("no tiny model today\nsecond line")
        model = real(family, seed)
        if family == "qwen2":  # a frequency schedule posenc's validation refuses (factor < 1)
            model.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "dynamic", "factor": 0.5}
        return model

    monkeypatch.setattr(compat, "build_tiny", build)
    rows = compat.scan(["llama", "qwen2", "mistral"], progress=False)
    by = {r["family"]: r for r in rows}
    assert [r["family"] for r in rows] == ["llama", "qwen2", "mistral"]
    assert by["llama"]["status"] == "pass" and by["llama"]["reason"] == ""
    assert by["llama"]["rope_max_diff"] <= compat.ROPE_TOLERANCE
    assert by["qwen2"]["status"] == "refused"
    assert by["qwen2"]["reason"] == "scaling['factor'] must be >= 1.0, got 0.5"
    assert by["mistral"] == {**by["mistral"], "status": "unbuildable", "reason": "RuntimeError: no tiny model today"}
    assert all(r["seconds"] >= 0 for r in rows)
    s = compat.summary(rows)
    assert (s["built"], s["pass"], s["refused"], s["unbuildable"], s["pass_rate"]) == (2, 1, 1, 1, 0.5)


def test_scan_refuses_unknown_families():
    with pytest.raises(ValueError, match="unknown transformers model families"):
        compat.scan(["llama", "not_a_family"], progress=False)


@pytest.mark.parametrize("families", [[], "", " , "])
def test_scan_refuses_an_empty_family_list_instead_of_scanning_every_family(families, monkeypatch):
    monkeypatch.setattr(compat, "rope_families", lambda: pytest.fail("an empty list must not mean every family"))
    with pytest.raises(ValueError, match=r"^families must name at least one transformers family"):
        compat.scan(families, progress=False)


def test_write_table_format(tmp_path):
    rows = [{"family": "a", "status": "pass", "reason": "", "rope_max_diff": 0.0, "seconds": 1.234},
            {"family": "b", "status": "fail", "reason": "ValueError: x | y", "rope_max_diff": None, "seconds": 0.5},
            {"family": "c", "status": "unbuildable", "reason": "KeyError: 'z'", "rope_max_diff": None, "seconds": 0.1},
            {"family": "d", "status": "refused", "reason": "no", "rope_max_diff": None, "seconds": 0.2}]
    text = compat.write_table(rows, tmp_path / "sub" / "t.md").read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# posenc.hf compatibility: transformers ")
    assert "**1 pass / 3 built = 33.3%** (4 families: 1 pass, 1 refused, 1 fail, 1 unbuildable" in text
    header = lines.index("| family | status | engine vs RoPE | seconds | reason |")
    assert lines[header + 1] == "| --- | --- | ---: | ---: | --- |"
    assert lines[header + 2:] == ["| a | pass | 0.0e+00 | 1.23 |  |",
                                  "| b | fail |  | 0.50 | ValueError: x \\| y |",
                                  "| c | unbuildable |  | 0.10 | KeyError: 'z' |",
                                  "| d | refused |  | 0.20 | no |"]
    data = json.loads(compat.write_json(rows, tmp_path / "t.json").read_text())
    assert data["rows"] == rows and data["summary"]["pass_rate"] == 0.3333
    assert set(data["versions"]) == {"transformers", "torch", "date"}
