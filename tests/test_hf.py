"""posenc.hf on tiny randomly initialised Hugging Face models (nothing downloaded)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc import hf  # noqa: E402
from posenc._util import assert_close  # noqa: E402
from posenc.engine import AttentionParts, run_attention  # noqa: E402

L = 16  # trained length (max_position_embeddings) of every tiny model
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
              intermediate_size=128, max_position_embeddings=L, pad_token_id=0, bos_token_id=None, eos_token_id=None)
ARCHS = {
    "llama": (transformers.LlamaConfig, {}),
    "mistral": (transformers.MistralConfig, {"sliding_window": None}),
    "qwen2": (transformers.Qwen2Config, {}),
    "qwen3": (transformers.Qwen3Config, {"head_dim": 16}),
    "gemma": (transformers.GemmaConfig, {"head_dim": 16}),
    "gemma2": (transformers.Gemma2Config, {"head_dim": 16, "sliding_window": 6, "attn_logit_softcapping": None}),
    "phi3": (transformers.Phi3Config, {"partial_rotary_factor": 0.5}),
    "gpt_neox": (transformers.GPTNeoXConfig, {"rotary_pct": 0.5, "num_key_value_heads": None}),
}


def make_config(arch="llama", **kw):
    cls, extra = ARCHS[arch]
    args = {**COMMON, **extra, **kw}
    args = {k: v for k, v in args.items() if not (k == "num_key_value_heads" and v is None)}
    cfg = cls(**args)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(arch="llama", seed=0, **kw):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(make_config(arch, **kw)).eval()


def ids(n=12, batch=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 300, (batch, n), generator=g)


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


def test_cli_extend_and_hf_eval(tmp_path, capsys):
    from posenc.cli import main
    from posenc.evals.pretrained import evaluate_hf
    from posenc.hf.export import byte_tokenizer

    model = make_model("llama")
    model.save_pretrained(tmp_path / "base")
    byte_tokenizer().save_pretrained(tmp_path / "base")  # the model's own tokenizer (ids < 257 <= vocab 300)
    x = ids(n=20)
    # transformers-native method: the saved dir is plain transformers with rope_parameters
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "yarn", "--factor", "4",
                 "--save", str(tmp_path / "yarn")]) == 0
    cfg = json.loads((tmp_path / "yarn" / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "yarn" and "posenc" not in cfg
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "yarn").eval()
    # engine method: a posenc section that posenc.hf.load re-applies
    assert main(["extend", "--model", str(tmp_path / "base"), "--method", "rerope", "--window", "8",
                 "--save", str(tmp_path / "rerope")]) == 0
    cfg = json.loads((tmp_path / "rerope" / "config.json").read_text())
    assert cfg["posenc"]["method"] == "rerope" and cfg["posenc"]["params"] == {"window": 8}
    loaded = hf.load(tmp_path / "rerope")
    expect = hf.extend(make_model("llama"), "rerope", window=8)
    with torch.no_grad():
        # (plain from_pretrained picks sdpa attention, the tiny models eager: float rounding only)
        yarn = hf.extend(make_model("llama"), "yarn", factor=4.0)
        assert_close(plain(x).logits, yarn(x).logits, rtol=1e-5, atol=1e-5)
        assert_close(loaded(x).logits, expect(x).logits, rtol=1e-5, atol=1e-5)

    text = "The grass is green. The sky is blue. " * 12
    (tmp_path / "t.txt").write_text(text)
    capsys.readouterr()  # drop the extend commands' output
    out_json = tmp_path / "hf.json"
    assert main(["eval", "--hf-model", str(tmp_path / "base"), "--text", str(tmp_path / "t.txt"),
                 "--lengths", "16", "32", "--methods", "none", "dynamic_ntk", "rerope", "--factor", "2",
                 "--max-windows", "1", "--json", str(out_json), "--report", str(tmp_path / "rep")]) == 0
    assert "dynamic_ntk" in capsys.readouterr().out  # the lab's table
    for name in ("results.json", "report.md", "report.html", "ppl_vs_length.png"):  # and the lab's report
        assert (tmp_path / "rep" / name).stat().st_size > 0
    rows = json.loads(out_json.read_text())
    assert [(r["method"], r["eval_len"]) for r in rows] == [(m, n) for m in ("none", "dynamic_ntk", "rerope")
                                                           for n in (16, 32)]
    assert all(r["status"] == "ok" and r["ppl"] > 1 and r["scheme"] == "llama" and r["train_len"] == L
               for r in rows)
    # passkey scoring and error records
    recs = evaluate_hf(tmp_path / "base", text=text, lengths=[400], methods=["yarn", "bogus"],
                       params={"factor": 2.0}, max_windows=1, passkey_trials=1)
    assert recs[0]["status"] == "ok" and recs[0]["passkey"] in (0.0, 1.0)
    assert recs[1]["status"] == "error" and "unknown method" in recs[1]["note"]


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


def test_hf_eval_uses_the_models_own_tokenizer_and_refuses_others(tmp_path):
    """A byte tokenizer on a model that has its own is refused; a model without a tokenizer is refused; the
    text is scored with the model's own tokenizer (the same target tokens at every length)."""
    from posenc.data.tokenizer import make_tokenizer
    from posenc.evals.pretrained import evaluate_hf
    from posenc.hf.export import byte_tokenizer

    make_model("llama").save_pretrained(tmp_path / "bare")
    text = "The grass is green. The sky is blue. " * 12
    with pytest.raises(ValueError, match="no tokenizer of its own"):
        evaluate_hf(tmp_path / "bare", text=text, lengths=[32])
    byte_tokenizer().save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="transformers tokenizer"):
        evaluate_hf(tmp_path / "bare", text=text, lengths=[32], tokenizer=make_tokenizer("byte"))
    a = evaluate_hf(tmp_path / "bare", text=text, lengths=[32, 64], max_windows=2, target=16)
    assert [r["tokens"] for r in a] == [32, 32]  # 2 windows x 16 target tokens at both lengths
    assert a[0]["target_tokens"] == 16 and a[0]["windows"] == 2
    with pytest.raises(ValueError, match="needs more than"):
        evaluate_hf(tmp_path / "bare", text=text[:100], lengths=[200])
