"""PositionScheme (posenc.scheme.core): presets, composition through the scheme, serialisation, and validation
(bad names and parameters refused at construction, compositions that make no sense, JSON fields type-checked)."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.models.tinylm import LMConfig, TinyLM
from posenc.scheme.core import TRAINED, PositionScheme

REQUIRED = {
    "nope", "sinusoidal", "learned", "hierarchical", "floater", "complex_order", "shaw", "transformer_xl", "t5",
    "deberta", "rope", "xpos", "alibi", "kerple_power", "kerple_log", "sandwich", "infini",
    "pi", "ntk", "ntk_mixed", "dynamic_ntk", "dynamic_ntk_qwen", "yarn", "dynamic_yarn", "llama3", "rope_base",
    "rerope", "leaky_rerope", "selfextend", "logn", "sliding_window", "lm_infinite", "streaming_llm", "bca", "pcw",
}


def test_every_required_preset_exists():
    assert REQUIRED <= set(PositionScheme.presets())


# preset -> (embedding, bias, content-relative, memory, rotary: None | "rope" | "xpos"), as the papers place them
TRAINED_PARTS = {
    "nope": ("nope", None, None, None, None), "sinusoidal": ("sinusoidal", None, None, None, None),
    "learned": ("learned", None, None, None, None), "hierarchical": ("hierarchical", None, None, None, None),
    "floater": ("floater", None, None, None, None), "complex_order": ("complex_order", None, None, None, None),
    "shaw": ("nope", None, "shaw", None, None),
    "transformer_xl": ("nope", None, "transformer_xl", ("xl_recurrence", {"mem_len": 32}), None),
    "t5": ("nope", "t5", None, None, None), "deberta": ("nope", None, "deberta", None, None),
    "rope": ("nope", None, None, None, "rope"), "xpos": ("nope", None, None, None, "xpos"),
    "alibi": ("nope", "alibi", None, None, None), "kerple_power": ("nope", "kerple_power", None, None, None),
    "kerple_log": ("nope", "kerple_log", None, None, None), "sandwich": ("nope", "sandwich", None, None, None),
    "infini": ("nope", None, None, ("infini", {"segment_len": 8}), "rope"),
    "rope_2d": ("nope", None, None, None, "rope"), "rope_mixed": ("nope", None, None, None, "rope"),
    "mrope": ("nope", None, None, None, "rope"),
    "cope": ("nope", None, "cope", None, None), "fox": ("nope", None, None, None, None),
    "fire": ("nope", "fire", None, None, None),
}


# multi-axis presets: their multi-axis part, and whether the mask is causal (ViT-style presets attend both ways)
MULTIAXIS_PARTS = {"rope_2d": ("axial", False), "rope_mixed": ("mixed", False), "mrope": ("mrope", True)}


# layer patterns (irope, local_global, nope_every4) are checked layer by layer in tests/scheme/test_pattern.py
SINGLE = sorted(n for n in TRAINED if PositionScheme.preset(n, train_len=32).layers is None)


@pytest.mark.parametrize("name", SINGLE)
def test_trained_presets_build_the_papers_parts(name):
    """Which part each preset sets, at train_len 32 (XL's memory defaults to one segment of L, Infini's
    segments to L/4), and a mask with no window for all of them, causal but for the ViT-style ones."""
    s = PositionScheme.preset(name, train_len=32)

    def kind(part):
        return None if part is None else part.kind

    rotary = None if s.rope is None else ("xpos" if s.rope.xpos else "rope")
    memory = s.memory and (s.memory.kind, s.memory.params)
    assert (kind(s.embedding), kind(s.bias), kind(s.relative), memory, rotary) == TRAINED_PARTS[name]
    assert (kind(s.multiaxis), s.mask.causal) == MULTIAXIS_PARTS.get(name, (None, True))
    assert s.mask.window is None and s.remap is None and s.train_len == 32


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_trained_presets_roundtrip_json(name):
    s = PositionScheme.preset(name, train_len=32)
    again = PositionScheme.from_json(s.to_json())
    assert again == s
    json.loads(s.to_json())


def test_methods_compose_through_the_scheme():
    base = PositionScheme.preset("rope", train_len=128, base=500.0)
    s = base.extend("rerope+logn", window=32)
    assert s.remap.kind == "rerope" and s.remap.params["window"] == 32 and s.logn
    assert s.rope.base == 500.0 and s.train_len == 128
    s2 = base.extend("ntk_mixed+logn", factor=8)
    assert s2.rope.scaling["rope_type"] == "ntk_mixed" and s2.logn
    y = base.extend("yarn", factor=4)
    assert y.rope.scaling == {"rope_type": "yarn", "original_max_position_embeddings": 128, "factor": 4.0}
    with pytest.raises(ValueError, match="do not stack"):
        base.extend("pi+yarn", factor=2)
    with pytest.raises(ValueError, match="do not stack"):
        base.extend("rerope+selfextend")


def test_streaming_and_lm_infinite_set_mask_and_remap():
    s = PositionScheme.preset("streaming_llm", train_len=64, n_sinks=4, window=20)
    assert (s.mask.window, s.mask.n_sinks, s.remap.kind) == (20, 4, "streaming")
    lm = PositionScheme.preset("lm_infinite", train_len=64)
    assert lm.mask.window == 64 and lm.mask.n_sinks == 10 and lm.remap.kind == "ceiling"
    assert PositionScheme.preset("alibi", train_len=64).extend("streaming_llm").remap.kind == "streaming"


def test_scheme_validation():
    with pytest.raises(ValueError, match="finite"):
        PositionScheme.preset("rope", train_len=16).extend("yarn", factor=float("nan"))
    with pytest.raises(ValueError, match="factor"):
        PositionScheme.preset("pi", train_len=16, factor=0.5)
    with pytest.raises(ValueError, match="unknown scheme fields"):
        PositionScheme.from_dict({"name": "x", "rotary": {}})
    with pytest.raises(ValueError, match="rope.layout"):
        PositionScheme.preset("rope", train_len=16, layout="zigzag")
    with pytest.raises(ValueError, match="train_len"):
        PositionScheme.preset("learned")

P = PositionScheme


def tiny_lm(scheme=None, vocab=32, dim=16, n_layers=1, seed=0):
    torch.manual_seed(seed)
    scheme = scheme or P.preset("rope", train_len=16)
    return TinyLM(LMConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=2, scheme=scheme,
                           train_len=16)).eval()


# ------------------------------------------------------------------------------------------------ presets
@pytest.mark.parametrize("call, match", [
    (lambda: P.preset(None), r"preset name must be a preset name string.*None"),
    (lambda: P.preset(""), r"non-empty"),
    (lambda: P.preset(3), r"preset name string.*3"),
    (lambda: P.preset("rope", train_len=16).extend(None), r"method must be a preset name string"),
    (lambda: P.preset("rope", train_len=16).extend("+"), r"non-empty"),
    (lambda: P.preset("ropee"), r"unknown preset 'ropee'.*'alibi'.*'yarn'"),
    (lambda: P.preset("ropee", train_len=16), r"unknown preset 'ropee'"),
    (lambda: P.preset("yarn+superrope", train_len=16, factor=2), r"unknown preset 'superrope'"),
    (lambda: P.preset("rope", train_len=16).extend("superrope"), r"unknown method 'superrope'.*'yarn'"),
    (lambda: P.preset("yarn", factor=2), r"inference-time method: pass train_len"),
])
def test_preset_and_extend_refuse_bad_names(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_unknown_name_is_not_called_an_inference_time_method():
    with pytest.raises(ValueError) as err:
        P.preset("ropee")
    assert "inference-time method:" not in str(err.value) and "unknown" in str(err.value)


@pytest.mark.parametrize("name, params, match", [
    ("alibi", {"bogus": 1}, r"bias 'alibi' does not take parameter\(s\) \['bogus'\]"),
    ("t5", {"bogus": 1}, r"bias 't5' does not take.*\['bidirectional', 'init_std', 'max_distance'"),
    ("kerple_log", {"bogus": 1}, r"bias 'kerple_log' does not take"),
    ("shaw", {"bogus": 1}, r"relative 'shaw' does not take.*max_distance"),
    ("deberta", {"head_dim": 4}, r"relative 'deberta' does not take parameter\(s\) \['head_dim'\]"),
    ("learned", {"train_len": 16, "bogus": 1}, r"embedding 'learned' does not take.*max_positions"),
    ("sinusoidal", {"bogus": 1}, r"embedding 'sinusoidal' does not take"),
    ("rope", {"bogus": 1}, r"preset 'rope' does not take parameter 'bogus'; it takes \[.*'base'.*'xpos'"),
    ("xpos", {"bogus": 1}, r"preset 'xpos' does not take parameter 'bogus'; it takes \['base', 'scale_base'"),
    ("infini", {"train_len": 64, "bogus": 1}, r"preset 'infini' does not take parameter 'bogus'"),
    ("yarn", {"train_len": 16, "factor": 2, "bogus": 1}, r"parameters \['bogus'\] are not used by method 'yarn'"),
])
def test_unknown_preset_parameters_are_refused_at_construction(name, params, match):
    with pytest.raises(ValueError, match=match):
        P.preset(name, **params)


def test_known_preset_parameters_still_work():
    assert P.preset("t5", num_buckets=16).bias.params == {"num_buckets": 16}
    assert P.preset("infini", train_len=64, segment_len=8).memory.params == {"segment_len": 8}
    assert P.preset("infini", train_len=64, delta_rule=True).memory.params == {"segment_len": 16,
                                                                             "delta_rule": True}
    with pytest.raises(TypeError, match="infini.delta_rule must be a bool"):
        P.preset("infini", train_len=64, delta_rule="yes")
    assert P.preset("transformer_xl", train_len=16).memory.params == {"mem_len": 16}


@pytest.mark.parametrize("method, param", [
    ("sliding_window", "window"), ("streaming_llm", "window"), ("lm_infinite", "window"),
    ("lm_infinite", "ceiling"), ("bca", "block"), ("rerope", "window"),
])
@pytest.mark.parametrize("value", [0, -3])
def test_zero_or_negative_sizes_are_refused_not_defaulted(method, param, value):
    with pytest.raises(ValueError, match=rf"{method}.{param} must be an integer >= 1, got {value}"):
        P.preset(method, train_len=64, **{param: value})


def test_none_still_means_the_default_size():
    assert P.preset("sliding_window", train_len=64).mask.window == 64
    assert P.preset("bca", train_len=64).mask.block == 32


def test_a_shared_parameter_goes_to_every_method_of_a_composition():
    s = P.preset("sliding_window+streaming_llm", train_len=64, window=4)
    assert s.mask.window == 4 and s.mask.n_sinks == 4
    assert s.remap.params == {"n_sinks": 4, "window": 4}  # streaming_llm got it too
    s = P.preset("rope", train_len=64).extend("lm_infinite+sliding_window", window=8)
    assert s.mask.window == 8


@pytest.mark.parametrize("base, method, params, match", [
    ("alibi", "yarn", {"factor": 2}, r"method 'yarn' applies to a RoPE scheme; 'alibi' has no rotary part"),
    ("alibi", "rope_base", {"base": 500.0}, r"applies to a RoPE scheme"),
    ("nope", "rerope", {}, r"'rerope' remaps relative positions; 'nope' has neither"),
    ("sinusoidal", "hierarchical", {}, r"reads a learned absolute table"),
    ("rope", "yarn+pi", {"factor": 2}, r"frequency schedules do not stack"),
    ("rope", "rerope+selfextend", {}, r"remaps do not stack"),
])
def test_compositions_that_make_no_sense_are_refused(base, method, params, match):
    with pytest.raises(ValueError, match=match):
        P.preset(base, train_len=16).extend(method, **params)


# ------------------------------------------------------------------------------------------------ scheme JSON
def _json(**fields) -> str:
    return json.dumps({"name": "x", "train_len": 64, **fields})


@pytest.mark.parametrize("text, match", [
    (_json(logn="no"), r"logn must be true or false, got 'no'"),
    (_json(logn=1), r"logn must be true or false, got 1"),
    (_json(rope=5), r"rope must be an object \(dict\)"),
    (_json(rope=[1]), r"rope must be an object"),
    (_json(rope={"xpos": "no"}), r"rope.xpos must be true or false"),
    (_json(rope={"base": "1e4"}), r"rope.base must be a finite number"),
    (_json(rope={"bogus": 1}), r"rope has unknown field\(s\) \['bogus'\]"),
    (_json(rope={"scaling": {"rope_type": "yarn", "factor": float("nan")}}), r"must be finite"),
    (_json(rope={"scaling": {"rope_type": "superrope"}}), r"rope_type'\] must be one of"),
    (_json(rope={"scaling": {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 64,
                             "low_freq_factor": 4, "high_freq_factor": 1}}), r"high_freq_factor'\] must be >"),
    (_json(embedding={}), r"embedding needs a 'kind'"),
    (_json(embedding=5), r"embedding must be a kind name"),
    (_json(embedding={"kind": "learned", "params": [1]}), r"embedding.params must be a dict"),
    (_json(embedding={"kind": "nope", "extra": 1}), r"embedding has unknown field\(s\) \['extra'\]"),
    (_json(embedding="bogus"), r"embedding kind must be one of"),
    (_json(bias={"kind": "alibi", "params": {"slope": 1}}), r"bias 'alibi' does not take"),
    (_json(bias="nobias"), r"bias kind must be one of"),
    (_json(mask=5), r"mask must be an object"),
    (_json(mask={"window": 0}), r"mask.window must be an integer >= 1"),
    (_json(mask={"causal": "yes"}), r"mask.causal must be a bool"),
    (_json(mask={"bogus": 1}), r"mask has unknown field"),
    (_json(train_len="64"), r"train_len must be an integer >= 1"),
    (_json(softcap=float("inf")), r"softcap must be finite"),
    (json.dumps({"name": 5}), r"scheme name must be a string"),
    (json.dumps({"bogus": 1}), r"unknown scheme fields \['bogus'\]"),
    (json.dumps([1, 2]), r"scheme must be a dict"),
    ("{not json", r"scheme JSON is not valid JSON"),
])
def test_scheme_json_fields_are_type_checked(text, match):
    with pytest.raises(ValueError, match=match):
        P.from_json(text)


def test_from_json_refuses_a_non_string():
    with pytest.raises(ValueError, match="from_json needs a JSON string"):
        P.from_json({"logn": True})


def test_scheme_json_round_trip_still_works():
    for name in ("rope", "alibi", "t5", "learned", "transformer_xl", "infini"):
        s = P.preset(name, train_len=64)
        assert P.from_json(s.to_json()) == s
    s = P.preset("yarn+logn", train_len=64, factor=4)
    assert P.from_json(s.to_json()) == s and P.from_json(s.to_json()).logn is True


def test_odd_head_dim_with_a_rope_scheme_is_refused_at_build():
    with pytest.raises(ValueError, match=r"RoPE needs an even rotary dim; head_dim 7"):
        tiny_lm(dim=14)
