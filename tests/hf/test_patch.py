"""posenc.hf.patch: ``extend`` on tiny randomly initialised Hugging Face models (nothing downloaded): methods
transformers runs equal to transformers, engine methods equal to a reference forward, cached equal to uncached
decoding, bad input refused with nothing changed, unextend, save/load and the export refusals."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import posenc
import posenc.hf
from posenc._util import relative_error

transformers = pytest.importorskip("transformers")

from posenc._util import assert_close  # noqa: E402
from posenc.engine import AttentionParts, run_attention  # noqa: E402
from posenc.hf import patch as hf  # noqa: E402
from tests.support.tiny_hf import ARCHS, L, ids, make_config, make_model  # noqa: E402


def left_padded(n=9, pad=3):
    x, mask = ids(n), torch.ones(2, n, dtype=torch.long)
    x[0, :pad], mask[0, :pad] = 0, 0
    return x, mask


# ===================================================================== method "none" and the identity of the engine
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_none_changes_nothing_and_engine_reproduces_rope(arch):
    model = make_model(arch)
    x = ids()
    with torch.no_grad():
        ref = model(x).logits
        assert torch.equal(hf.extend(model, "none")(x).logits, ref)
        # posenc's engine with a schedule that equals plain RoPE (linear factor 1; rerope window > sequence):
        # un-rotated q/k, partial rotary, GQA, Gemma2 sliding layers -> same logits as transformers' own RoPE
        for method, params in [("pi", {"factor": 1.0}), ("rerope", {"window": 14})]:
            m = hf.extend(copy.deepcopy(model), method, native=False, **params)
            assert m.config._attn_implementation == "posenc"
            assert_close(m(x).logits, ref, rtol=1e-4, atol=1e-4)


# ===================================================================== transformers' own methods
NATIVE = [("linear", {"factor": 2.0}), ("dynamic", {"factor": 2.0}), ("yarn", {"factor": 4.0}),
          ("llama3", {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8}),
          ("longrope", {"short_factor": [1.0 + 0.1 * i for i in range(8)],
                        "long_factor": [2.0 + 0.5 * i for i in range(8)], "original_max_position_embeddings": 8})]


@pytest.mark.parametrize("rope_type,params", NATIVE, ids=[n for n, _ in NATIVE])
def test_native_methods_equal_transformers(rope_type, params):
    x = ids(n=20)  # longer than L: the dynamic / long schedules switch on
    model = hf.extend(make_model("llama"), rope_type, **params)
    assert model.config.rope_parameters["rope_type"] == rope_type
    direct = make_model("llama", rope_parameters={"rope_theta": 10000.0, "rope_type": rope_type, **params})
    with torch.no_grad():
        assert_close(model(x).logits, direct(x).logits, rtol=0, atol=0)


def test_posenc_yarn_equals_transformers_yarn():
    """Second, independent path: posenc's engine running YaRN == transformers' YaRN."""
    x = ids(n=20)
    ours = hf.extend(make_model("qwen2"), "yarn", native=False, factor=4.0)
    theirs = hf.extend(make_model("qwen2"), "yarn", factor=4.0)
    with torch.no_grad():
        assert_close(ours(x).logits, theirs(x).logits, rtol=1e-4, atol=1e-4)


# ===================================================================== engine methods vs a manual reference forward
def _manual_llama(model, scheme, x, mask=None):
    """Llama forward written out with the model's weights and posenc's reference attention."""
    m = model.model
    B, N = x.shape
    valid = torch.ones(B, N, dtype=torch.bool) if mask is None else mask.bool()
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)  # [B,N] original positions of real tokens
    h = m.embed_tokens(x)
    for layer in m.layers:
        a = layer.self_attn
        hn = layer.input_layernorm(h)
        q = a.q_proj(hn).view(B, N, -1, a.head_dim).transpose(1, 2)  # [B,H,N,D]
        k = a.k_proj(hn).view(B, N, -1, a.head_dim).transpose(1, 2)  # [B,Hk,N,D]
        v = a.v_proj(hn).view(B, N, -1, a.head_dim).transpose(1, 2)
        parts = AttentionParts(scheme, q.shape[1], a.head_dim)
        o = run_attention(parts, q, k, v, pos, pos, impl="reference", scale=a.scaling,
                          key_mask=None if mask is None else valid)
        h = h + a.o_proj(o.transpose(1, 2).reshape(B, N, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(m.norm(h))


ENGINE = [("ntk", {"factor": 2.0}), ("ntk_mixed", {"factor": 2.0}), ("dynamic_ntk", {"factor": 2.0}),
          ("dynamic_ntk_qwen", {}), ("dynamic_yarn", {}), ("rerope", {}), ("leaky_rerope", {}),
          ("selfextend", {"group": 2, "window": 4}), ("logn", {}), ("sliding_window", {"window": 6}),
          ("lm_infinite", {"window": 6, "n_global": 2}), ("streaming_llm", {"window": 6, "n_sinks": 2}),
          ("bca", {}), ("pcw", {"window": 8}), ("rerope+logn", {}), ("ntk_mixed+logn", {"factor": 2.0}),
          ("dca", {"chunk": 8, "local": 2}), ("p_rope", {"p": 0.5})]


@pytest.mark.parametrize("method,params", ENGINE, ids=[m for m, _ in ENGINE])
def test_engine_methods_equal_reference(method, params):
    model = make_model("llama")
    model_ext = hf.extend(copy.deepcopy(model), method, **params)
    scheme = hf.posenc_scheme(model_ext)
    x = ids(n=24)
    with torch.no_grad():
        assert_close(model_ext(x).logits, _manual_llama(model, scheme, x), rtol=1e-4, atol=1e-4)
        xp, mask = left_padded(n=20, pad=5)  # left padding: positions count real tokens only
        got = model_ext(xp, attention_mask=mask).logits
        want = _manual_llama(model, scheme, xp, mask)
        assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-4)


# ===================================================================== generate with the HF KV cache
@pytest.mark.parametrize("arch,method,params", [
    ("llama", "rerope", {}), ("qwen2", "dynamic_ntk", {"factor": 2.0}), ("mistral", "selfextend+logn", {}),
    ("gemma2", "streaming_llm", {"window": 8, "n_sinks": 2}), ("gpt_neox", "leaky_rerope", {}),
    ("phi3", "lm_infinite", {"window": 6, "n_global": 2}),
])
def test_generate_cache_equals_no_cache(arch, method, params):
    model = hf.extend(make_model(arch), method, **params)
    x, mask = left_padded()
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False)  # grows to 21 > L = 16
    with torch.no_grad():
        cached = model.generate(x, use_cache=True, **kw)
        full = model.generate(x, use_cache=False, **kw)
        one = model.generate(x[1:], attention_mask=mask[1:], max_new_tokens=12, do_sample=False)
    assert torch.equal(cached, full)
    assert torch.equal(cached[1:], one)  # the left-padded neighbour does not change the unpadded row


def _decode_vs_full(model, n_prompt=6, n_total=26):
    """Max |cached step logits - full forward logits at that position| while the sequence grows."""
    x = ids(n=n_total, batch=1)
    diffs = []
    with torch.no_grad():
        out = model(x[:, :n_prompt], use_cache=True)
        cache = out.past_key_values
        for t in range(n_prompt, n_total):
            out = model(x[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            full = model(x[:, :t + 1], use_cache=False).logits[:, -1]
            diffs.append(float((out.logits[:, -1] - full).abs().max()))
    return diffs


def test_dynamic_ntk_consistent_past_trained_length_unlike_transformers():
    ours = _decode_vs_full(hf.extend(make_model("llama"), "dynamic_ntk", factor=4.0))
    theirs = _decode_vs_full(hf.extend(make_model("llama"), "dynamic", factor=4.0))
    assert max(ours) < 1e-5  # keys are rotated at read time with the current query's schedule
    assert max(theirs[: L - 6]) < 1e-5  # inside the trained length both are plain RoPE
    # past it HF's cached keys keep the base they were rotated with (random tiny logits are ~1e-2 in size,
    # so the gap is ~5e-4 here; it is >100x our float error)
    assert max(theirs[L - 6:]) > max(1e-4, 100 * max(ours))


def test_dynamic_schedules_get_a_default_step_through_extend_and_the_exact_form_on_request():
    """extend's default step for dynamic schedules is train_len // 16 (one engine call per step of queries, not
    per query); step=1 (the exact per-token form) is kept when asked for; both are recorded."""
    from posenc.hf.patch import default_dynamic_step

    assert (default_dynamic_step(8192), default_dynamic_step(16), default_dynamic_step(8)) == (512, 1, 1)
    for method, params in (("dynamic_ntk", {"factor": 2.0}), ("dynamic_yarn", {})):
        big = make_model("llama", max_position_embeddings=64)
        hf.extend(big, method, **params)
        assert big._posenc_extended["params"]["step"] == 4
        assert all(st["scheme"].rope.dynamic_step == 4 for st in _states(big))
        exact = hf.extend(make_model("llama", max_position_embeddings=64), method, step=1, **params)
        assert exact._posenc_extended["params"]["step"] == 1
        assert all(st["scheme"].rope.dynamic_step == 1 for st in _states(exact))


def _states(model):
    return [m._posenc for m in model.modules() if getattr(m, "_posenc", None) is not None]


# ===================================================================== config / CLI round trip
def test_errors_and_scheme_from_config():
    cfg = make_config("gpt_neox")
    s = hf.scheme_from_config(cfg)
    assert s.rope.partial_rotary_factor == 0.5 and s.train_len == L
    with pytest.raises(ValueError, match="unknown method"):
        hf.extend(make_model("llama"), "nonsense")
    with pytest.raises(ValueError, match="already extended"):
        hf.extend(hf.extend(make_model("llama"), "rerope"), "logn")


def test_gemma2_softcapping_runs_through_the_engine():
    """Gemma 2 soft-caps attention logits (c tanh(s/c)); a small cap makes it matter. The engine path
    with a schedule equal to plain RoPE reproduces the untouched model."""
    torch.manual_seed(0)
    base = make_model("gemma2", attn_logit_softcapping=0.02)
    x = ids(n=20)
    with torch.no_grad():
        ref = base(x).logits
        ext = hf.extend(make_model("gemma2", attn_logit_softcapping=0.02), "pi", native=False, factor=1.0)
        assert_close(ext(x).logits, ref, rtol=1e-4, atol=1e-5)
        uncapped = make_model("gemma2", attn_logit_softcapping=None)
        assert not torch.allclose(uncapped(x).logits, ref, atol=1e-4)  # the cap changes the logits

LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0)


def _llama(cfg=None):
    torch.manual_seed(0)
    cfg = cfg or transformers.LlamaConfig(**LLAMA)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


# ===================================================================== item 8: shared config
@pytest.mark.parametrize("method", ["rerope", "yarn"])
def test_extend_does_not_touch_a_model_sharing_the_config(method):
    cfg = transformers.LlamaConfig(**LLAMA)
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


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=64, num_hidden_layers=2, num_attention_heads=9,
                                   num_key_value_heads=3, vocab_size=120, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("spec, kw", [("string", {}), ("resonance+yarn", dict(factor=2.0)), ("retrieval", {}),
                                      ("dca", dict(temperature="qwen")), ("duo", dict(streaming=[[0, 1, 2], []]))])
def test_hf_gqa_llama_cached_equals_full(spec, kw):
    """A tiny LlamaForCausalLM with SmolLM2's head layout (9 query heads, 3 KV heads, head_dim 64), read at 3x its
    trained length: transformers' own cache gives the logits of the full forward."""
    model = posenc.hf.extend(_tiny_llama(), spec, **kw)
    ids = torch.randint(0, 120, (1, 96), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :40], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(40, 96):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
    assert relative_error(torch.cat(steps, dim=1), full) <= 1e-5


def test_a_mistyped_method_says_did_you_mean_and_changes_nothing():
    """``posenc.hf.extend(m, "yran")`` in Python says what the CLI says: the closest known name."""
    model = make_model("llama")
    config = model.config.to_dict()
    x = ids()
    with torch.no_grad():
        before = model(x).logits
    for spec, hint in (("yran", "yarn"), ("rerope+lgn", "logn"), ("lineer", "linear")):
        with pytest.raises(ValueError, match=rf"unknown method '{spec.split('+')[-1]}' \(did you mean '{hint}'\?\)"):
            posenc.hf.extend(model, spec, factor=2.0)
    assert model.config.to_dict() == config and not getattr(model, "_posenc_extended", None)
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
