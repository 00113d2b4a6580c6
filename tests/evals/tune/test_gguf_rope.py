"""posenc.evals.tune.gguf_rope: llama.cpp's GGUF rope keys for YaRN, written and read back, and the refusals."""

from __future__ import annotations

import pytest

from posenc.evals.tune.gguf_rope import read_rope_gguf, write_rope_gguf


def test_gguf_rope_keys_for_yarn_and_refusals(tmp_path):
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 1024,
           "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                               "original_max_position_embeddings": 256}}
    back = read_rope_gguf(write_rope_gguf(tmp_path / "y.gguf", cfg))
    assert (back["scaling_type"], back["factor"], back["original_context_length"], back["context_length"]) == \
        ("yarn", 4.0, 256, 1024)
    assert back["long_factor"] is None and back["rope_theta"] == pytest.approx(5e5)
    with pytest.raises(ValueError, match="rope_type must be one of"):
        write_rope_gguf(tmp_path / "d.gguf", {**cfg, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})
