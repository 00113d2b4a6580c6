"""posenc.hf on bad input and on sliding-window models (a MoE, shared configs): tiny random models only."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf import patch as hf  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0)


def _llama(cfg=None):
    torch.manual_seed(0)
    cfg = cfg or transformers.LlamaConfig(**SMALL)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _prompts():
    x = torch.randint(1, 128, (2, 80), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    x[1, :10], mask[1, :10] = 0, 0  # the second prompt left-padded by 10
    return x, mask


def _cached_equals_uncached(model):
    x, mask = _prompts()
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        return torch.equal(model.generate(x, use_cache=True, **kw), model.generate(x, use_cache=False, **kw))


# ===================================================================== item 4: sliding-window layers
def test_phimoe_sliding_window_cached_equals_uncached():
    """Phi-MoE's attention ignores sliding_window (only its mask and its cache apply it): the engine path
    takes each layer's window from the config as transformers' cache does."""
    cfg = transformers.PhimoeConfig(**SMALL, sliding_window=32, num_local_experts=4, num_experts_per_tok=2)
    model = hf.extend(_llama(cfg), "rerope", window=16)
    assert {m._posenc_window for m in hf._attention_modules(model)} == {32}
    assert _cached_equals_uncached(model)


def test_mistral_sliding_window_control():
    cfg = transformers.MistralConfig(**SMALL, sliding_window=32)
    assert _cached_equals_uncached(hf.extend(_llama(cfg), "rerope", window=16))


def test_moshi_decoder_sliding_window_cached_equals_uncached():
    cfg = transformers.MoshiConfig(**SMALL, sliding_window=32, audio_vocab_size=32, num_codebooks=2,
                                   depth_hidden_size=32, depth_num_hidden_layers=1, depth_num_attention_heads=2,
                                   depth_ffn_dim=64)
    torch.manual_seed(0)
    model = hf.extend(transformers.MoshiForCausalLM(cfg).eval(), "rerope", window=16)
    assert _cached_equals_uncached(model)


def test_layer_window_follows_layer_types():
    cfg = transformers.Gemma2Config(**SMALL, sliding_window=6)
    model = hf.extend(_llama(cfg), "rerope")
    assert [m._posenc_window for m in hf._attention_modules(model)] == [6, None]  # sliding, full
    assert [m._posenc_window for m in hf._attention_modules(hf.extend(_llama(), "rerope"))] == [None, None]


# ===================================================================== item 8: shared config
@pytest.mark.parametrize("method", ["rerope", "yarn"])
def test_extend_does_not_touch_a_model_sharing_the_config(method):
    cfg = transformers.LlamaConfig(**SMALL)
    a, b = _llama(cfg), _llama(cfg)
    x = torch.randint(1, 128, (1, 20))
    with torch.no_grad():
        before = b(x).logits
        hf.extend(a, method, factor=4.0) if method == "yarn" else hf.extend(a, method)
        assert torch.equal(b(x).logits, before)
    assert b.config is cfg and a.config is not cfg
    assert all(m.config is a.config for m in a.modules() if hasattr(m, "config") and m is not a)
    assert cfg.rope_parameters.get("rope_type", "default") == "default" and not getattr(cfg, "posenc", None)
    hf.extend(b, method, factor=4.0) if method == "yarn" else hf.extend(b, method)  # not "already extended"


# ===================================================================== item 5: native path validates like posenc's
BAD_NATIVE = [
    ("yarn", {"factor": 0}, "factor"), ("yarn", {"factor": math.nan}, "factor"), ("yarn", {"factor": 0.5}, "factor"),
    ("pi", {"factor": -2}, "factor"), ("linear", {"factor": math.inf}, "factor"),
    ("dynamic", {"factor": 0.5}, "factor"),
    ("yarn", {"factor": "4"}, "factor"), ("yarn", {}, "factor"),
    ("llama3", {"factor": 4.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}, "high_freq_factor"),
    ("yarn", {"factor": 4.0, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast"),
    ("yarn", {"factor": 4.0, "bogus": 1}, "bogus"),
    ("yarn", {"factor": 4.0, "mscale": -100.0, "mscale_all_dim": 1.0}, "mscale"),
    ("longrope", {"short_factor": [1.0] * 3, "long_factor": [2.0] * 8}, "short_factor"),
    ("longrope", {"short_factor": [1.0] * 8, "long_factor": [2.0] * 9}, "long_factor"),
]


@pytest.mark.parametrize("method,params,word", BAD_NATIVE,
                         ids=[f"{m}-{w}-{i}" for i, (m, _, w) in enumerate(BAD_NATIVE)])
def test_native_bad_values_refused_and_nothing_changes(method, params, word):
    model = _llama()
    x = torch.randint(1, 128, (1, 20))
    with torch.no_grad():
        before = model(x).logits
    rope_before, config_before = dict(model.config.rope_parameters), model.config
    with pytest.raises((ValueError, TypeError), match=word):
        hf.extend(model, method, **params)
    assert model.config is config_before and dict(model.config.rope_parameters) == rope_before
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
    hf.extend(model, "yarn", factor=4.0)  # a corrected retry works
    assert model.config.rope_parameters["rope_type"] == "yarn"


@pytest.mark.parametrize("cls,cfg", [(transformers.GPT2LMHeadModel, transformers.GPT2Config),
                                     (transformers.BertModel, transformers.BertConfig)])
@pytest.mark.parametrize("method", ["yarn", "pi", "rerope"])
def test_extend_without_rope_refused(cls, cfg, method):
    model = cls(cfg(n_embd=32, n_layer=1, n_head=2, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, vocab_size=64))
    with pytest.raises(ValueError, match="no rotary embedding"):
        hf.extend(model, method, factor=4.0) if method != "rerope" else hf.extend(model, method)


@pytest.mark.parametrize("first,second", [("yarn", "rerope"), ("rerope", "yarn"), ("rerope", "logn")])
def test_extend_twice_refused(first, second):
    model = hf.extend(_llama(), first, **({"factor": 4.0} if first == "yarn" else {}))
    with pytest.raises(ValueError, match="already extended"):
        hf.extend(model, second, **({"factor": 4.0} if second == "yarn" else {}))


def test_load_names_the_path(tmp_path):
    with pytest.raises(ValueError, match="/nope"):
        hf.load("/nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=str(tmp_path)):
        hf.load(tmp_path)


# ===================================================================== the CLI: non-zero exit and the message
@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    _llama().save_pretrained(d)
    return d


def test_cli_missing_model_in_a_process(tmp_path):
    r = subprocess.run([sys.executable, "-m", "posenc", "extend", "--model", "/nope", "--method", "yarn",
                        "--factor", "4", "--save", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "/nope" in r.stderr and "Traceback" not in r.stderr


def _cli(capsys, *args):
    from posenc.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing_model", "missing_hf_model", "nan_factor", "gpt2", "string_factor"])
def test_cli_bad_input(case, tmp_path, gpt2_dir, llama_dir, capsys):
    out = tmp_path / "out"
    args, word = {
        "missing_model": (["extend", "--model", "/nope", "--method", "yarn", "--factor", "4", "--save", out], "/nope"),
        "missing_hf_model": (["eval", "--hf-model", "/nope", "--text", __file__, "--lengths", "16"], "/nope"),
        "nan_factor": (["extend", "--model", llama_dir, "--method", "yarn", "--factor", "nan", "--save", out],
                       "factor"),
        "gpt2": (["extend", "--model", gpt2_dir, "--method", "yarn", "--factor", "4", "--save", out], "rotary"),
        "string_factor": (["extend", "--model", llama_dir, "--method", "yarn", "--param", 'factor="4"', "--save", out],
                          "factor"),
    }[case]
    rc, err = _cli(capsys, *args)
    assert rc != 0 and word in err
    assert not out.exists()


# ============================================================ round 3: no silent NoPE, no silent unextended save
X = torch.randint(1, 128, (1, 100), generator=torch.Generator().manual_seed(2))  # beyond the trained 64


def _logits(model, x=X):
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("switch", ["sdpa", "eager", "config_eager"])
def test_switching_the_attention_implementation_raises_instead_of_running_nope(switch):
    model = hf.extend(_llama(), "rerope", window=16)
    ext = _logits(model)
    if switch == "config_eager":
        model.config._attn_implementation = "eager"
    else:
        model.set_attn_implementation(switch)
    impl = "eager" if switch == "config_eager" else switch
    with pytest.raises(ValueError, match=rf"extended by posenc with method 'rerope' \(params \{{'window': 16\}}\).*"
                                         rf"now '{impl}'.*no position information.*set_attn_implementation\('posenc'\)"
                                         rf".*posenc.hf.unextend\(model\)"):
        model(X)
    with pytest.raises(ValueError, match="no position information"):
        model.generate(X[:, :8], max_new_tokens=2, do_sample=False)
    model.set_attn_implementation("posenc")
    assert torch.equal(_logits(model), ext)  # switching back restores it


def test_unextend_gives_the_plain_model_back_and_it_can_be_extended_again():
    plain = _logits(_llama())
    model = hf.extend(_llama(), "rerope", window=16)
    hf.unextend(model)
    assert model.config._attn_implementation != "posenc" and not getattr(model.config, "posenc", None)
    torch.testing.assert_close(_logits(model), plain, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="not extended by posenc"):
        hf.unextend(model)
    yarn = hf.extend(model, "yarn", factor=4.0)  # a native method after the engine one
    assert yarn.config.max_position_embeddings == 256
    hf.unextend(yarn)
    assert yarn.config.max_position_embeddings == 64 and yarn.config.rope_parameters["rope_type"] == "default"
    torch.testing.assert_close(_logits(yarn), plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method, params, max_pos", [
    ("yarn", {"factor": 4.0}, 256), ("llama3", {"factor": 2.0}, 128), ("pi", {"factor": 2.0}, 128),
    ("dynamic", {"factor": 4.0}, 64),  # transformers' dynamic NTK reads max_position_embeddings as the trained length
])
def test_native_methods_write_rope_parameters_and_max_position_embeddings(method, params, max_pos, tmp_path):
    model = hf.extend(_llama(), method, **params)
    assert model.config.max_position_embeddings == max_pos and hf.train_len_of(model.config) == 64
    hf.save(model, tmp_path / method)
    cfg = json.loads((tmp_path / method / "config.json").read_text())
    assert cfg["max_position_embeddings"] == max_pos and cfg["rope_parameters"]["factor"] == params["factor"]
    assert "posenc" not in cfg and "auto_map" not in cfg
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / method, attn_implementation="eager").eval()
    assert hf.train_len_of(plain.config) == 64  # the trained length stays readable after the round trip
    torch.testing.assert_close(_logits(plain), _logits(model), rtol=1e-5, atol=1e-5)


def test_engine_methods_save_in_a_form_plain_transformers_refuses_and_custom_code_loads(tmp_path):
    from posenc.hf.saved import CODE_FILE, MODEL_TYPE

    model = hf.extend(_llama(), "rerope+logn", window=16)
    out = hf.save(model, tmp_path / "rerope")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == MODEL_TYPE and cfg["posenc"]["method"] == "rerope+logn"
    assert cfg["base_config"]["model_type"] == "llama" and (out / CODE_FILE).is_file()
    for kw in ({}, {"trust_remote_code": False}):  # plain transformers: refused, never loaded unextended
        with pytest.raises(ValueError, match="(?s)contains custom code which must be executed.*trust_remote_code=True"):
            transformers.AutoModelForCausalLM.from_pretrained(out, **kw)
    want = _logits(model)
    for loaded in (hf.load(out), transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)):
        assert loaded.config.posenc["method"] == "rerope+logn"
        torch.testing.assert_close(_logits(loaded.eval()), want, rtol=1e-5, atol=1e-5)


def test_the_earlier_save_format_still_loads(tmp_path):
    """A config with the posenc section inside the model's own config (posenc before this format) loads extended."""
    model = hf.extend(_llama(), "rerope", window=16)
    out = hf.save(model, tmp_path / "old")
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg["base_config"], "posenc": cfg["posenc"]}))
    torch.testing.assert_close(_logits(hf.load(out)), _logits(model), rtol=1e-5, atol=1e-5)


def test_cli_extend_prints_how_to_load_the_result(tmp_path, capsys):
    from posenc.cli import main

    _llama().save_pretrained(tmp_path / "base")
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "rerope", "--window", "16",
                 "--save", str(tmp_path / "e")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "posenc.hf.load(" in out["load"] and "trust_remote_code=True" in out["load"]
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "yarn", "--factor", "4",
                 "--save", str(tmp_path / "n")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["max_position_embeddings"] == 256 and "trust_remote_code" not in out["load"]


def test_save_and_export_into_an_existing_file_are_refused(tmp_path):
    from posenc.hf.export import export
    from posenc.models.tinylm import LMConfig, TinyLM
    from posenc.scheme.core import PositionScheme

    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a folder"):
        hf.save(hf.extend(_llama(), "rerope", window=16), target)
    tiny = TinyLM(LMConfig(vocab_size=257, dim=32, n_layers=1, n_heads=2, train_len=16,
                           scheme=PositionScheme.preset("rope", train_len=16)))
    with pytest.raises(ValueError, match="out_dir .*file' exists and is not a folder"):
        export(tiny, target)
    assert target.read_text() == "x"
