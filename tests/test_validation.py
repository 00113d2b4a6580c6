"""Bad input gets a clear ``ValueError`` naming the argument, and changes nothing.

Each row of a table below is one case a user could try; the test asserts the error type and that the
message names the argument (or the allowed values). CLI cases live in ``test_cli_errors.py``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from posenc.models import checkpoint as ckpt
from posenc.models.cache import KVCache
from posenc.models.generation import generate
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.parts.frequencies import rope_frequencies, validate_rope_scaling
from posenc.parts.rotary import apply_rope, apply_rope_
from posenc.scheme.core import PositionScheme

P = PositionScheme


def tiny_model(scheme=None, vocab=32, dim=16, n_layers=1, seed=0):
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


# ------------------------------------------------------------------------------------------------ rope_scaling
_L = {"original_max_position_embeddings": 64}


@pytest.mark.parametrize("scaling, match", [
    ([1, 2], r"scaling must be a dict"),
    ({"rope_type": "superrope", "factor": 2}, r"rope_type'\] must be one of .*'yarn'.*got 'superrope'"),
    ({"rope_type": "yarn", "factor": 2, "bogus": 1, **_L}, r"keys \['bogus'\] that rope_type 'yarn' does not use"),
    ({"rope_type": "linear"}, r"scaling\['factor'\] is required"),
    ({"rope_type": "llama3", "factor": 8, **_L}, r"scaling\['low_freq_factor'\] is required"),
    ({"rope_type": "dynamic", "factor": 2}, r"original_max_position_embeddings'\] .* is required"),
    ({"rope_type": "longrope", "factor": 2, **_L, "long_factor": [1.0] * 32}, r"short_factor'\] is required"),
    ({"rope_type": "longrope", "factor": 2, **_L, "short_factor": [1.0] * 32, "long_factor": [1.0] * 31},
     r"long_factor'\] must have rotary_dim // 2 = 32 entries, got 31"),
    ({"rope_type": "llama3", "factor": 8, **_L, "low_freq_factor": 4, "high_freq_factor": 1},
     r"high_freq_factor'\] must be > low_freq_factor"),
    ({"rope_type": "yarn", "factor": 4, **_L, "beta_fast": 1, "beta_slow": 32}, r"beta_fast'\] must be > beta_slow"),
    ({"rope_type": "yarn", "factor": 4, **_L, "mscale": -100, "mscale_all_dim": 1}, r"mscale'\] must be >= 0"),
    ({"rope_type": "yarn", "factor": 4, **_L, "attention_factor": -1}, r"attention_factor'\] must be > 0"),
    ({"rope_type": "yarn", "factor": 0, **_L}, r"factor'\] must be >= 1.0, got 0"),
    ({"rope_type": "yarn", "factor": -2, **_L}, r"factor'\] must be >= 1.0"),
    ({"rope_type": "yarn", "factor": 0.5, **_L}, r"factor'\] must be >= 1.0, got 0.5"),
    ({"rope_type": "yarn", "factor": float("nan"), **_L}, r"factor'\] must be finite"),
    ({"rope_type": "linear", "factor": float("inf")}, r"factor'\] must be finite"),
    ({"rope_type": "linear", "factor": "4"}, r"factor'\] must be a finite number, got '4'"),
    ({"rope_type": "ntk", "factor": 1e300}, r"overflows"),
    ({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 0}, r"must be an integer >= 1"),
    ({"rope_type": "yarn", "factor": 2, **_L, "truncate": "no"}, r"truncate'\] must be true or false"),
])
def test_malformed_rope_scaling_is_refused(scaling, match):
    with pytest.raises(ValueError, match=match):
        validate_rope_scaling(scaling, head_dim=64)
    with pytest.raises(ValueError, match=match):
        rope_frequencies(64, scaling=scaling, seq_len=128)


def test_validate_rope_scaling_without_head_dim_checks_longrope_lists_agree():
    bad = {"rope_type": "longrope", "factor": 2, **_L, "short_factor": [1.0] * 4, "long_factor": [1.0] * 3}
    with pytest.raises(ValueError, match=r"long_factor'\] must have rotary_dim // 2 = 4 entries, got 3"):
        validate_rope_scaling(bad)


def test_validate_rope_scaling_returns_the_normalised_dict():
    out = validate_rope_scaling({"type": "yarn", "factor": 4, "beta_fast": None, **_L}, head_dim=64)
    assert out == {"rope_type": "yarn", "factor": 4.0, **_L}
    assert validate_rope_scaling(None) == {"rope_type": "default"}


@pytest.mark.parametrize("head_dim, partial", [(63, 1.0), (7, 1.0), (64, 0.3), (1, 1.0)])
def test_odd_rotary_dims_are_refused(head_dim, partial):
    with pytest.raises(ValueError, match=r"must be an even integer >= 2"):
        rope_frequencies(head_dim, partial_rotary_factor=partial)
    with pytest.raises(ValueError, match=r"must be an even integer >= 2"):
        validate_rope_scaling(None, head_dim=head_dim, partial_rotary_factor=partial)


def test_odd_head_dim_with_a_rope_scheme_is_refused_at_build():
    with pytest.raises(ValueError, match=r"RoPE needs an even rotary dim; head_dim 7"):
        tiny_model(dim=14)


# ------------------------------------------------------------------------------------------------ apply_rope
_INV = rope_frequencies(8).inv_freq


@pytest.mark.parametrize("fn", [apply_rope, apply_rope_])
@pytest.mark.parametrize("x, positions, match", [
    (torch.ones(1, 1, 4, 8, dtype=torch.long), torch.arange(4), r"x must be a floating-point tensor.*int64"),
    (torch.ones(1, 1, 4, 8, dtype=torch.int32), torch.arange(4), r"x must be a floating-point tensor"),
    (torch.ones(1, 1, 4, 8), torch.ones(4, dtype=torch.bool), r"positions must be integers, got a bool"),
    (torch.ones(1, 1, 4, 8), torch.arange(4.0), r"positions must be integers"),
    (torch.ones(1, 1, 4, 8), torch.tensor([0, 1, -2, 3]), r"positions must be >= 0"),
    (torch.ones(4, 8), torch.arange(4), r"x must be a tensor \[batch, heads, seq, head_dim\]"),
])
def test_apply_rope_refuses_bad_inputs(fn, x, positions, match):
    before = x.clone()
    with pytest.raises(ValueError, match=match):
        fn(x, positions, _INV)
    assert torch.equal(x, before)  # nothing changed, even for the in-place version


# ------------------------------------------------------------------------------------------------ TinyLM
@pytest.mark.parametrize("field, value, match", [
    ("dropout", "x", r"LMConfig.dropout must be a finite number, got 'x'"),
    ("dropout", 1.0, r"LMConfig.dropout must be in \[0, 1\)"),
    ("dropout", -0.1, r"LMConfig.dropout must be >= 0.0"),
    ("dropout", float("nan"), r"LMConfig.dropout must be finite"),
    ("vocab_size", 0, r"LMConfig.vocab_size must be an integer >= 1"),
    ("n_layers", "2", r"LMConfig.n_layers must be an integer >= 1"),
    ("n_heads", 3, r"dim \(16\) must be divisible by n_heads \(3\)"),
    ("n_kv_heads", 3, r"n_heads \(2\) must be a multiple of n_kv_heads \(3\)"),
    ("n_kv_heads", 0, r"LMConfig.n_kv_heads must be an integer >= 1"),
    ("scheme", "rope", r"LMConfig.scheme must be a PositionScheme"),
])
def test_lm_config_refuses_bad_values(field, value, match):
    kw = dict(vocab_size=32, dim=16, n_layers=1, n_heads=2, scheme=P.preset("rope", train_len=16), train_len=16)
    kw[field] = value
    with pytest.raises(ValueError, match=match):
        LMConfig(**kw)


@pytest.mark.parametrize("change, match", [
    ({"dropout": "x"}, r"LMConfig.dropout must be a finite number"),
    ({"bogus": 1}, r"unknown fields \['bogus'\]"),
    ({"scheme": {"logn": "no", "train_len": 16}}, r"logn must be true or false"),
])
def test_lm_config_from_dict_refuses_bad_configs(change, match):
    d = {**tiny_model().cfg.to_dict(), **change}
    with pytest.raises(ValueError, match=match):
        LMConfig.from_dict(d)


@pytest.mark.parametrize("ids, match", [
    (torch.tensor([[1, 2, 32]]), r"input_ids must be in \[0, vocab_size=32\), got ids from 1 to 32"),
    (torch.tensor([[1, -1]]), r"input_ids must be in \[0, vocab_size=32\)"),
    (torch.zeros(1, 0, dtype=torch.long), r"at least one row and one token"),
    (torch.zeros(0, 4, dtype=torch.long), r"at least one row and one token"),
    (torch.zeros(1, 4), r"input_ids must be an integer tensor"),
    (torch.zeros(4, dtype=torch.long), r"input_ids must be an integer tensor \[batch, seq\]"),
])
def test_tinylm_refuses_bad_token_ids(ids, match):
    with pytest.raises(ValueError, match=match):
        tiny_model()(ids)


# ------------------------------------------------------------------------------------------------ generate
@pytest.mark.parametrize("kw, match", [
    ({"max_new_tokens": 0}, r"max_new_tokens must be an integer >= 1, got 0"),
    ({"max_new_tokens": -3}, r"max_new_tokens must be an integer >= 1"),
    ({"max_new_tokens": 2.5}, r"max_new_tokens must be an integer"),
    ({"max_new_tokens": 2, "temperature": -1.0}, r"temperature must be >= 0.0"),
    ({"max_new_tokens": 2, "temperature": float("nan")}, r"temperature must be finite"),
    ({"max_new_tokens": 2, "top_k": 0}, r"top_k must be an integer >= 1"),
    ({"max_new_tokens": 2, "top_p": 0.0}, r"top_p must be > 0.0"),
    ({"max_new_tokens": 2, "prefill_chunk": 0}, r"prefill_chunk must be an integer >= 1"),
    ({"max_new_tokens": 2, "attention_mask": torch.tensor([[1, 1, 1], [0, 0, 0]])},
     r"attention_mask must be left padding"),
    ({"max_new_tokens": 2, "attention_mask": torch.tensor([[1, 2, 1], [1, 1, 1]])}, r"only 0 .* and 1"),
])
def test_generate_refuses_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny_model(), torch.ones(2, 3, dtype=torch.long), **kw)


def test_generate_refuses_token_ids_beyond_the_vocabulary():
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, vocab_size=32\)"):
        generate(tiny_model(), torch.full((1, 3), 40), max_new_tokens=1)


# ------------------------------------------------------------------------------------------------ KV cache
@pytest.mark.parametrize("first, second, match", [
    ([0, 1, 2], [2, 3], r"row 0 got position 2 after position 2"),  # repeats
    ([0, 1, 2], [1], r"row 0 got position 1 after position 2"),  # goes backwards
    ([0, 1, 2], [4, 4], r"row 0 got position 4 after position 4"),  # repeats inside the chunk
    ([3, 1, 2], None, r"row 0 got position 1 after position 3"),  # backwards inside the first chunk
])
def test_cache_refuses_positions_that_go_backwards_or_repeat(first, second, match):
    model = tiny_model()
    cache = model.new_cache(1)
    with torch.no_grad():
        if second is None:
            with pytest.raises(ValueError, match=match):
                model(torch.ones(1, len(first), dtype=torch.long), positions=torch.tensor([first]), cache=cache)
            assert cache.length == 0  # nothing committed
            return
        model(torch.ones(1, len(first), dtype=torch.long), positions=torch.tensor([first]), cache=cache)
        with pytest.raises(ValueError, match=match):
            model(torch.ones(1, len(second), dtype=torch.long), positions=torch.tensor([second]), cache=cache)
        assert cache.length == len(first) and int(cache.next_positions()[0]) == first[-1] + 1
        out = model(torch.ones(1, 1, dtype=torch.long), cache=cache)  # the cache still works
    assert out.shape == (1, 1, 32)


def test_cache_accepts_gaps_and_ignores_padding_positions():
    model = tiny_model()
    cache = model.new_cache(2)
    ids = torch.ones(2, 3, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1], [0, 0, 1]])
    pos = torch.tensor([[0, 1, 2], [0, 0, 0]])  # padding positions repeat: they are not keys
    with torch.no_grad():
        model(ids, positions=pos, cache=cache, attention_mask=mask)
        model(torch.ones(2, 1, dtype=torch.long), positions=torch.tensor([[10], [5]]), cache=cache)
    assert cache.next_positions().tolist() == [11, 6]


@pytest.mark.parametrize("window", [10**6, 2**40])
def test_cache_allocates_what_is_used_not_the_window(window):
    model = tiny_model(P.preset("sliding_window", train_len=16, window=window), n_layers=2)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.ones(1, 5, dtype=torch.long), cache=cache)
    assert cache.capacity == 16  # the minimum first allocation, not window + 1
    assert cache.nbytes() < 10_000
    with torch.no_grad():
        for _ in range(20):
            model(torch.ones(1, 1, dtype=torch.long), cache=cache)
    assert cache.capacity == 32 and cache.length == 25  # grown by doubling


def test_cache_refuses_a_bad_initial_capacity():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"initial_capacity must be an integer >= 1"):
        KVCache(1, 1, 2, 8, model.scheme.mask, initial_capacity=0)


# ------------------------------------------------------------------------------------------------ checkpoints
@pytest.fixture()
def run_dir(tmp_path):
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    ckpt.save_checkpoint(tmp_path / "run", model, model.cfg, {"step": 1}, optimizer=opt,
                         extra={"tokenizer": {"name": "byte", "bos": True}})
    return tmp_path / "run"


def _truncate(run):
    data = (run / ckpt.MODEL_FILE).read_bytes()
    (run / ckpt.MODEL_FILE).write_bytes(data[: len(data) // 2])


def _rename(run):
    (run / ckpt.MODEL_FILE).rename(run / "model.bak")


def _pickle(run):
    torch.save(tiny_model().state_dict(), run / ckpt.MODEL_FILE)


def _pickle_unrecorded(run):  # no recorded size/hash: the safetensors reader itself must refuse it
    cfg = json.loads((run / ckpt.CONFIG_FILE).read_text())
    cfg.pop("checkpoint", None)
    (run / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))
    _pickle(run)


def _config_typo(run):
    cfg = json.loads((run / ckpt.CONFIG_FILE).read_text())
    cfg["scheme"]["logn"] = "no"
    (run / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))


def _config_truncated(run):
    text = (run / ckpt.CONFIG_FILE).read_text()
    (run / ckpt.CONFIG_FILE).write_text(text[: len(text) // 2])


def _config_renamed(run):
    (run / ckpt.CONFIG_FILE).rename(run / "config.bak")


@pytest.mark.parametrize("damage, match", [
    (_truncate, r"model.safetensors has \d+ bytes but config.json recorded \d+ \(truncated"),
    (_rename, r"model.safetensors is missing"),
    (_pickle, r"model.safetensors has \d+ bytes but config.json recorded|does not match the sha256"),
    (_pickle_unrecorded, r"model.safetensors is not a readable safetensors file"),
    (_config_typo, r"invalid model config: logn must be true or false"),
    (_config_truncated, r"config.json is not valid JSON"),
    (_config_renamed, r"config.json does not exist"),
])
def test_damaged_checkpoints_give_clear_errors(run_dir, damage, match):
    damage(run_dir)
    with pytest.raises(ValueError, match=match):
        ckpt.load_model(run_dir)


def test_resuming_into_another_optimizer_class_is_refused(run_dir):
    model = tiny_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"optimizer torch.optim.adamw.AdamW, not torch.optim.sgd.SGD"):
        ckpt.load_checkpoint(run_dir, model, sgd)
    assert sgd.state_dict()["state"] == {}  # nothing was loaded
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt.load_checkpoint(run_dir, model, adamw)  # the same class resumes
    assert adamw.state_dict()["state"]


def test_optimizer_check_for_checkpoints_without_a_class_record(run_dir):
    meta = json.loads((run_dir / ckpt.STATE_JSON).read_text())
    meta["optimizer"].pop("class")
    data = json.dumps(meta).encode()
    (run_dir / ckpt.STATE_JSON).write_bytes(data)
    cfg = json.loads((run_dir / ckpt.CONFIG_FILE).read_text())
    cfg["checkpoint"]["files"][ckpt.STATE_JSON] = ckpt._digest(data)  # as such a checkpoint recorded it
    (run_dir / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"optimizer hyper-parameters .*another optimizer class"):
        ckpt.load_checkpoint(run_dir, tiny_model(), torch.optim.SGD(tiny_model().parameters(), lr=0.1))


@pytest.mark.parametrize("config, expected", [
    ({}, ("byte", {})),
    ({"extra": {"tokenizer": "byte"}}, ("byte", {})),
    ({"extra": {"tokenizer": {"name": "bpe", "path": "t.json"}}}, ("bpe", {"path": "t.json"})),
])
def test_tokenizer_spec_reads_names_and_dicts(config, expected):
    assert ckpt.tokenizer_spec(config) == expected


@pytest.mark.parametrize("config, match", [
    ({"extra": "x"}, r"'extra' must be an object"),
    ({"extra": {"tokenizer": 5}}, r"extra.tokenizer must be a tokenizer name"),
    ({"extra": {"tokenizer": {"name": 5}}}, r"extra.tokenizer must be a tokenizer name"),
])
def test_tokenizer_spec_refuses_malformed_entries(config, match):
    with pytest.raises(ValueError, match=match):
        ckpt.tokenizer_spec(config)


def test_generate_cli_loader_accepts_a_plain_tokenizer_name(run_dir):
    cfg = json.loads((run_dir / ckpt.CONFIG_FILE).read_text())
    cfg["extra"]["tokenizer"] = "byte"
    (run_dir / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))
    model, tok = ckpt.load_run(str(run_dir))
    assert tok.vocab_size == 257 and model.cfg.vocab_size == 32


@pytest.mark.parametrize("name, options, match", [
    ("bytes", {}, r"tokenizer must be one of \['bpe', 'byte'\], got 'bytes'"),
    (None, {}, r"tokenizer must be one of"),
    ("byte", {"bogus": 1}, r"tokenizer 'byte' does not take options \['bogus'\]"),
])
def test_make_tokenizer_refuses_bad_names_and_options(name, options, match):
    from posenc.data.tokenizer import make_tokenizer

    with pytest.raises(ValueError, match=match):
        make_tokenizer(name, **options)


# ------------------------------------------------------------------------------------------------ data / eval / train
@pytest.mark.parametrize("corpus", ["/nonexistent/corpus.txt", "no_such_corpus"])
def test_missing_corpus_path_is_a_clear_error(corpus, tmp_path):
    from posenc.data.prepare import prepare

    with pytest.raises(ValueError, match=r"corpus must be one of .* or an existing file/folder"):
        prepare(corpus, "byte", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing cached


@pytest.mark.parametrize("kw, match", [
    ({"lengths": [0]}, r"eval length must be an integer >= 1, got 0"),
    ({"lengths": [8], "batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
    ({"lengths": [8], "max_windows": -1}, r"max_windows must be an integer >= 1, got -1"),
    ({"lengths": [8], "methods": ["superrope"]}, r"unknown method 'superrope'"),
    ({"lengths": [8], "methods": ["yarn+superrope"]}, r"unknown method 'yarn\+superrope'"),
    ({"lengths": [8], "mode": "overlap"}, r"mode must be one of \('nonoverlap', 'sliding', 'tail'\)"),
])
def test_evaluate_model_refuses_bad_settings_up_front(kw, match):
    from posenc.evals.lab.evaluate import evaluate_model

    with pytest.raises(ValueError, match=match):
        evaluate_model(tiny_model(), torch.ones(64, dtype=torch.long), progress=False, **kw)


@pytest.mark.parametrize("device, match", [
    ("bogus", r"TrainConfig.device must be a torch device .* got 'bogus'"),
    ("cuda:99", r"TrainConfig.device 'cuda:99'"),
])
def test_train_config_refuses_unknown_devices(device, match, tmp_path):
    from posenc.training.train import TrainConfig

    with pytest.raises(ValueError, match=match):
        TrainConfig(out_dir=str(tmp_path), device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_config_refuses_cuda_without_cuda(tmp_path):
    from posenc.training.train import TrainConfig

    with pytest.raises(ValueError, match=r"TrainConfig.device 'cuda' is not available on this machine"):
        TrainConfig(out_dir=str(tmp_path), device="cuda")


def test_train_refuses_a_bad_scheme_parameter_before_touching_the_disk(tmp_path):
    from posenc.training.train import TrainConfig, train

    cfg = TrainConfig(out_dir=str(tmp_path / "run"), scheme="alibi", scheme_params={"bogus": 1}, steps=1)
    with pytest.raises(ValueError, match=r"bias 'alibi' does not take parameter\(s\) \['bogus'\]"):
        train(cfg, progress=False)
    assert not (tmp_path / "run").exists()


def test_plot_does_not_create_folders(tmp_path):
    from posenc.analysis.plots import plot_decay

    with pytest.raises(ValueError, match=r"out folder .* does not exist; create it first"):
        plot_decay(tmp_path / "a" / "b" / "x.png", head_dim=8, max_distance=10)
    assert not (tmp_path / "a").exists()


def test_finite_values_everywhere_after_validation():
    """A config that passes validation gives finite frequencies and a positive attention scale."""
    f = rope_frequencies(64, scaling={"rope_type": "yarn", "factor": 4, **_L, "mscale": 0.0, "mscale_all_dim": 0})
    assert bool(torch.isfinite(f.inv_freq).all()) and f.attention_scale > 0 and math.isfinite(f.attention_scale)
