"""posenc.hf.gguf_export: llama.cpp's RoPE keys for the methods it serves (checked against posenc's schedule), the
copy of a GGUF with them (the same quantised bytes), the flags, and the refusals by reason."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from posenc.hf.gguf_export import (
    NotServable,
    check_servable_method,
    llama_cpp_flags,
    llama_cpp_rope,
    read_gguf_rope,
    served_frequencies,
    write_served_gguf,
)
from posenc.parts.frequencies import rope_frequencies

gguf = pytest.importorskip("gguf")

BASE = {"hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 4096, "rope_theta": 1e5}
L, N, D = 1024, 4096, 64


def _cfg(**rp):
    return {**BASE, "rope_parameters": {"rope_theta": 1e5, **rp}}


LONG = [1.0 + i / 16 for i in range(D // 2)]
CASES = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": L},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": L,
                 "short_factor": [1.0] * (D // 2), "long_factor": LONG},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_served_schedule_equals_posencs(name):
    """llama.cpp's frequencies and magnitude, recomputed from the keys with its own formulas, are posenc's."""
    rope = llama_cpp_rope(_cfg(**CASES[name]))
    got, mag = served_frequencies(rope)
    want = rope_frequencies(D, 1e5, {"max_position_embeddings": N, **CASES[name]}, seq_len=N)
    np.testing.assert_allclose(got, want.inv_freq.double().numpy(), rtol=1e-6)
    assert mag == pytest.approx(want.attention_scale, rel=1e-6)


def test_keys_per_method():
    y = llama_cpp_rope(_cfg(**CASES["yarn"]))
    assert (y.scaling_type, y.factor, y.original_context_length, y.context_length, y.attn_factor) == \
        ("yarn", 4.0, L, N, pytest.approx(1.0))
    # a stated magnitude a: llama.cpp multiplies the key by 1 + 0.1 ln s itself
    a = llama_cpp_rope(_cfg(**CASES["yarn"], attention_factor=1.5))
    assert a.attn_factor == pytest.approx(1.5 / (1 + 0.1 * math.log(4.0)))
    assert llama_cpp_flags(a)[0] is None and "overwrites --yarn-attn-factor" in llama_cpp_flags(a)[1]
    # other betas, or no truncation: not llama.cpp's YaRN, but a fixed schedule, so its exact per-pair divisors
    for other in ({"beta_fast": 16.0}, {"truncate": False}):
        r = llama_cpp_rope(_cfg(**CASES["yarn"], **other))
        assert (r.scaling_type, r.ext_factor, r.attn_factor) == ("none", 0.0, pytest.approx(1 + 0.1 * math.log(4)))
        assert r.freqs is not None and llama_cpp_flags(r)[0] is None
    assert llama_cpp_flags(y)[0] == f"-c {N} --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx {L}"
    lin = llama_cpp_rope(_cfg(**CASES["linear"]))
    assert (lin.scaling_type, lin.factor, lin.attn_factor) == ("linear", 4.0, None)
    l3 = llama_cpp_rope(_cfg(**CASES["llama3"]))  # baked in as rope_freqs, as convert_hf_to_gguf.py does
    assert l3.scaling_type == "none" and l3.factor is None and l3.freqs[0] == pytest.approx(1.0)
    assert l3.freqs[-1] == pytest.approx(4.0)
    lr = llama_cpp_rope(_cfg(**CASES["longrope"]))  # no .factor: llama.cpp would divide by it once more
    assert (lr.scaling_type, lr.factor, lr.long) == ("longrope", None, tuple(LONG))
    assert lr.attn_factor == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(L)))
    # llama.cpp picks LongRoPE's factors by the context size, not by the prompt
    short, _ = served_frequencies(lr, n_ctx=L)
    np.testing.assert_allclose(short, rope_frequencies(D, 1e5, CASES["longrope"], seq_len=L).inv_freq.double(),
                               rtol=1e-6)


@pytest.mark.parametrize("rp", [{"rope_type": "dynamic", "factor": 2.0},
                                {"rope_type": "dynamic_yarn", "original_max_position_embeddings": L}])
def test_a_dynamic_schedule_is_refused_naming_the_reason(rp):
    with pytest.raises(NotServable, match="fixes them when the context is made"):
        llama_cpp_rope({**_cfg(**rp), "original_max_position_embeddings": L})


def test_per_layer_type_schedules_and_engine_methods_are_refused():
    per_type = {**BASE, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    with pytest.raises(NotServable, match="one RoPE schedule per model"):
        llama_cpp_rope(per_type)
    for spec in ("selfextend", "rerope", "yarn+logn", "streaming_llm", "ntk"):
        with pytest.raises(NotServable, match="runs on posenc's engine"):
            check_servable_method(spec)
    for spec in ("yarn", "pi", "linear", "longrope", "llama3"):
        check_servable_method(spec)


def _tiny_gguf(path, with_rope_freqs: bool):
    """A small llama GGUF: keys, one float32 and one Q8_0 tensor (and Llama 3's rope_freqs when asked)."""
    from gguf.quants import quantize

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(L)
    w.add_rope_freq_base(1e5)
    w.add_rope_dimension_count(D)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((8, 64), dtype=np.float32))
    q = quantize(rng.standard_normal((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    if with_rope_freqs:
        w.add_tensor("rope_freqs.weight", np.full(D // 2, 3.0, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _digests(path):
    r = gguf.GGUFReader(str(path))
    return {t.name: (int(t.tensor_type), hashlib.sha256(t.data.tobytes()).hexdigest()) for t in r.tensors}


@pytest.mark.parametrize("name", ["yarn", "longrope"])
def test_the_copy_keeps_every_tensor_byte_and_key_and_replaces_the_rope(tmp_path, name):
    src = _tiny_gguf(tmp_path / "src.gguf", with_rope_freqs=True)
    out = write_served_gguf(src, llama_cpp_rope(_cfg(**CASES[name])), tmp_path / "out.gguf",
                            {"posenc.method": name})
    before, after = _digests(src), _digests(out)
    kept = {k: v for k, v in before.items() if k != "rope_freqs.weight"}  # the old schedule's tensor goes
    assert {k: after[k] for k in kept} == kept and kept["blk.0.attn_q.weight"][0] == gguf.GGMLQuantizationType.Q8_0
    back = read_gguf_rope(out)
    assert back["scaling_type"] == name and back["context_length"] == N and back["original_context_length"] == L
    assert back["rope_freqs"] is None
    if name == "yarn":
        assert back["factor"] == 4.0 and back["long_factor"] is None
    else:
        assert back["factor"] is None and back["long_factor"] == pytest.approx(LONG)
    r = gguf.GGUFReader(str(out))
    assert r.get_field("general.name").contents() == "tiny" and r.get_field("posenc.method").contents() == name
    assert r.get_field("tokenizer.ggml.tokens").contents() == ["a", "b", "c"]


def test_a_failed_copy_leaves_no_file(tmp_path, monkeypatch):
    src = _tiny_gguf(tmp_path / "src.gguf", with_rope_freqs=False)

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", full)
    with pytest.raises(OSError, match=r"out\.gguf"):
        write_served_gguf(src, llama_cpp_rope(_cfg(**CASES["yarn"])), tmp_path / "out.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.gguf"]
