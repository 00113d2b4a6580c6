"""posenc.hf.export: a lab TinyLM written as a plain transformers LlamaForCausalLM gives the same logits, under
the trained scheme and under every inference-time method posenc.hf.extend accepts; layer patterns export as
SmolLM3 (NoPE every 4th) and Llama 4 (iRoPE), the others are refused."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace

import pytest
import torch

from posenc._util import relative_error

transformers = pytest.importorskip("transformers")

from posenc import hf  # noqa: E402
from posenc._util import assert_close  # noqa: E402
from posenc.hf.export import check_exportable, export  # noqa: E402
from posenc.methods import hf_methods  # noqa: E402
from posenc.models.tinylm import LMConfig, TinyLM  # noqa: E402
from posenc.scheme.core import TRAINED, PositionScheme  # noqa: E402

L, DIM, HEADS, KV_HEADS = 16, 64, 4, 2  # trained length; methods are read at 4 L

HEAD_DIM = DIM // HEADS


# fp32. Methods posenc's engine runs inside transformers give bit-identical logits here; transformers' own RoPE
# (plain, and the hf_native schedules) differs by ~3e-6: it forms position * inv_freq in float32 from an
# inv_freq up to 2 ulp off, where posenc forms the angles in float64 (with transformers' rotary module patched
# to float64 angles from posenc's inv_freq the fp32 logits are identical).
TOL = dict(rtol=1e-5, atol=1e-5)


def tiny(scheme=None, n_kv_heads=KV_HEADS, seed=0) -> TinyLM:
    """A random TinyLM whose attention is sharp enough for positions to matter (weights ~N(0, 0.1), norm
    gains around 1; logits up to ~4), so a wrong rotation or schedule moves the logits far beyond the
    tolerance (every method changes them by > 1 at 4 L)."""
    scheme = scheme or PositionScheme.preset("rope", train_len=L)
    torch.manual_seed(seed)
    model = TinyLM(LMConfig(257, DIM, 2, HEADS, scheme, L, n_kv_heads=n_kv_heads)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name
                    else 0.1 * torch.randn_like(p))
    return model


def ids(n=4 * L, batch=2, seed=1):
    return torch.randint(0, 257, (batch, n), generator=torch.Generator().manual_seed(seed))


def exported(model, tmp_path, **kw):
    out = export(model, tmp_path / "hf", **kw)
    return transformers.AutoModelForCausalLM.from_pretrained(out).eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(TinyLM with GQA, the LlamaForCausalLM loaded from its export)."""
    model = tiny()
    return model, exported(model, tmp_path_factory.mktemp("gqa"))


# ===================================================================== the trained scheme
@pytest.mark.parametrize("layout,n_kv_heads,base", [("half", KV_HEADS, 10000.0), ("half", None, 500.0),
                                                    ("interleaved", KV_HEADS, 10000.0)])
def test_from_pretrained_gives_the_tinylm_logits(tmp_path, layout, n_kv_heads, base):
    model = tiny(PositionScheme.preset("rope", train_len=L, layout=layout, base=base), n_kv_heads)
    llama = exported(model, tmp_path)
    assert type(llama).__name__ == "LlamaForCausalLM"
    cfg = llama.config
    assert cfg.num_key_value_heads == (n_kv_heads or HEADS) and cfg.head_dim == HEAD_DIM
    assert cfg.tie_word_embeddings and cfg.intermediate_size == model.cfg.mlp_hidden
    assert cfg.rope_parameters == {"rope_type": "default", "rope_theta": base}
    x = ids()
    with torch.no_grad():
        ours, theirs = model(x), llama(x).logits
    assert_close(theirs, ours, **TOL)
    assert float(ours.abs().max()) > 1.0  # not a near-zero model where everything agrees


def test_generate_with_transformers_cache_gives_the_tinylm_tokens(pair):
    from posenc.models.generation import generate

    model, llama = pair
    prompt = ids(n=8, batch=1)
    with torch.no_grad():
        theirs = llama.generate(prompt, max_new_tokens=24, do_sample=False)  # to 32 = 2 L, HF's own KV cache
        ours = generate(model, prompt, max_new_tokens=24)
    assert torch.equal(theirs, ours) and len(set(ours[0, 8:].tolist())) > 1


def test_interleaved_layout_needs_the_row_permutation(tmp_path):
    """Without the q/k row permutation the interleaved model's logits differ: the check above can fail."""
    model = tiny(PositionScheme.preset("rope", train_len=L, layout="interleaved"))
    as_half = model.with_scheme(PositionScheme.preset("rope", train_len=L))  # same rows, Llama's pairs
    llama = exported(model, tmp_path)
    x = ids()
    with torch.no_grad():
        assert_close(llama(x).logits, model(x), **TOL)
        assert float((as_half(x) - model(x)).abs().max()) > 1e-2


@pytest.mark.parametrize("preset,params,dynamic", [
    ("pi", {"factor": 2.0}, "query"), ("yarn", {"factor": 4.0}, "query"), ("llama3", {"factor": 4.0}, "query"),
    ("dynamic_ntk", {"factor": 2.0}, "sequence")])
def test_trained_with_a_native_frequency_scaling(tmp_path, preset, params, dynamic):
    """A scheme trained with a schedule transformers has keeps it in rope_parameters."""
    scheme = PositionScheme.preset(preset, train_len=L, **params)
    scheme = replace(scheme, rope=replace(scheme.rope, dynamic=dynamic))
    model = tiny(scheme)
    llama = exported(model, tmp_path)
    assert llama.config.rope_parameters["rope_type"] == scheme.rope.scaling["rope_type"]
    x = ids()
    with torch.no_grad():
        assert_close(llama(x).logits, model(x), **TOL)


# ===================================================================== every inference-time method
# parameters a method requires and the lab gives no per-length default for (transformers-only methods)
REQUIRED = {"factor": 4.0, "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
            "long_factor": [2.0 + 0.5 * i for i in range(HEAD_DIM // 2)]}


# every name posenc.hf.extend accepts whose method applies to a RoPE model ("hierarchical" reads a
# learned position table: a RoPE model has none)
ROPE_METHODS = sorted(n for n, m in hf_methods().items() if m.base_preset == "rope")


def _params(method) -> dict:
    p = method.length_defaults(L, 4 * L, HEAD_DIM, 10000.0)
    return {**{q.name: REQUIRED[q.name] for q in method.params if q.required and q.name not in p}, **p}


def _posenc_side(model, method, params):
    """The TinyLM under the method. Methods of transformers' own names (``HF_ONLY``: ``hf.extend`` runs them on
    transformers' code; LongRoPE also has a posenc form, per query) are their schedule in ``rope.scaling`` with
    transformers' rule, one schedule for the whole call (``dynamic="sequence"``), and the lengths of the exported
    config (LongRoPE's default factor is their ratio)."""
    from posenc.methods import HF_ONLY

    if method.name not in HF_ONLY:
        return model.with_scheme(method.name, **params)
    lengths = {"original_max_position_embeddings": L, "max_position_embeddings": L}
    rope = replace(model.scheme.rope, dynamic="sequence",
                   scaling={"rope_type": method.scaling_type, **lengths, **params})
    return model.with_scheme(replace(model.scheme, rope=rope))


@pytest.mark.parametrize("name", ROPE_METHODS)
def test_every_method_on_the_export_equals_the_tinylm(pair, name):
    model, llama = pair
    method = hf_methods()[name]
    params = _params(method)
    x = ids()
    with torch.no_grad():
        plain = model(x)
        ours = _posenc_side(model, method, params)(x)
        theirs = hf.extend(copy.deepcopy(llama), name, **params)(x).logits
    assert_close(theirs, ours, **TOL, name=name)
    assert float((ours - plain).abs().max()) > 1e-2  # the method changes the logits at 4 L


def test_all_rope_methods_are_covered():
    assert len(ROPE_METHODS) == len(hf_methods()) - 1 and "yarn" in ROPE_METHODS and "longrope" in ROPE_METHODS


# ===================================================================== refusals
@pytest.mark.parametrize("name", sorted(n for n in TRAINED if n != "rope"
                                         and PositionScheme.preset(n, train_len=L).layers is None))
def test_every_other_trained_scheme_is_refused_by_name(tmp_path, name):
    scheme = PositionScheme.preset(name, train_len=L)
    model = TinyLM(LMConfig(257, 32, 1, 2, scheme, L))
    with pytest.raises(ValueError, match=rf"scheme {name!r} does not export to LlamaForCausalLM: \S"):
        export(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("scheme,why", [
    (PositionScheme.preset("alibi"), "adds an attention bias that LlamaForCausalLM has no place for"),
    (PositionScheme.preset("nope"), "transformers has no NoPE mode"),
    (PositionScheme.preset("rope", partial_rotary_factor=0.5), "rotates the whole head"),
    (PositionScheme.preset("rerope", train_len=L), "'rerope' position remap is an inference-time method"),
    (PositionScheme.preset("rerope+logn", train_len=L), "posenc.hf.extend"),
    (PositionScheme.preset("ntk", train_len=L, factor=2.0), "'ntk' has no transformers rope_type"),
    (PositionScheme.preset("dynamic_ntk", train_len=L), "one schedule for the whole call"),
    (PositionScheme.preset("sliding_window", train_len=L), "attention mask"),
])
def test_refusals_say_why(scheme, why):
    with pytest.raises(ValueError, match=re.escape(f"scheme {scheme.name!r}") + ".*" + re.escape(why)):
        check_exportable(scheme)


# ===================================================================== command line on a lab run folder
def test_cli_export_of_a_run_folder(tmp_path, capsys):
    from posenc.cli import main
    from posenc.models.checkpoint import load_model, save_checkpoint

    model = tiny(n_kv_heads=None)
    save_checkpoint(tmp_path / "run", model, model.cfg, extra={"tokenizer": {"name": "byte", "bos": True}})
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["architectures"] == ["LlamaForCausalLM"] and "model.safetensors" in printed["files"]
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok("abc").input_ids == [97, 98, 99] and tok.bos_token_id == 256
    text = "héllo, wörld\n"
    assert tok(text).input_ids == list(text.encode()) and tok.decode(tok(text).input_ids) == text
    llama = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert llama.config.bos_token_id == 256
    x = torch.tensor([[256, *tok("The grass is green.").input_ids]])
    with torch.no_grad():
        assert_close(llama(x).logits, load_model(tmp_path / "run")(x), **TOL)
    # a run whose scheme has no Llama form: one line naming it, status 2
    alibi = TinyLM(LMConfig(257, 32, 1, 2, PositionScheme.preset("alibi"), L))
    save_checkpoint(tmp_path / "alibi", alibi, alibi.cfg)
    assert main(["export", str(tmp_path / "alibi"), "--out", str(tmp_path / "no")]) == 2
    assert "'alibi' adds an attention bias" in capsys.readouterr().err


def test_cli_export_refuses_an_out_folder_holding_a_model_and_keeps_it(tmp_path, capsys):
    """``export --out DIR`` into a folder holding a model replaced its weights (exit 0). Now one line
    naming --out, status 2, the old files byte for byte, and no staging folder beside it; the run folder as --out
    (the source) is refused the same way."""
    from posenc.cli import main
    from posenc.models.checkpoint import save_checkpoint

    model = tiny(n_kv_heads=None)
    save_checkpoint(tmp_path / "run", model, model.cfg, extra={"tokenizer": {"name": "byte", "bos": True}})
    old = tmp_path / "hf"
    old.mkdir()
    (old / "config.json").write_text('{"model_type": "llama"}')
    (old / "model.safetensors").write_bytes(b"old weights")
    run_files = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    for out in (old, tmp_path / "run"):
        capsys.readouterr()
        assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--out {str(out)!r} already holds files" in err, err
    assert (old / "config.json").read_text() == '{"model_type": "llama"}'
    assert (old / "model.safetensors").read_bytes() == b"old weights"
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == run_files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]


def test_a_bpe_tokenizer_is_written_as_its_tokenizers_json(tmp_path):
    from posenc.data.tokenizer import BPETokenizer

    bpe = BPETokenizer.train(["the quick brown fox jumps over the lazy dog. "] * 30, vocab_size=300, min_frequency=1)
    model = TinyLM(LMConfig(bpe.vocab_size, 32, 1, 2, PositionScheme.preset("rope", train_len=L), L))
    tok = transformers.AutoTokenizer.from_pretrained(export(model, tmp_path / "hf", tokenizer=bpe))
    text = "the lazy fox jumps"
    assert tok(text).input_ids == bpe.encode(text) and tok.bos_token_id == bpe.bos_id
    assert tok.decode(bpe.encode(text)) == text
    small = TinyLM(LMConfig(bpe.vocab_size - 1, 32, 1, 2, PositionScheme.preset("rope", train_len=L), L))
    with pytest.raises(ValueError, match=f"tokenizer has {bpe.vocab_size} tokens but the model only"):
        export(small, tmp_path / "small", tokenizer=bpe)
    assert not (tmp_path / "small").exists()

L = 16

PATTERNS = {"irope": {"every": 2}, "local_global": {"every": 2}, "nope_every4": {"every": 2}}


def pattern(name, **kw):
    return PositionScheme.preset(name, train_len=L, **{**PATTERNS[name], **kw})


def pattern_model(scheme, n_layers=4, seed=0, dim=32):
    torch.manual_seed(seed)
    return TinyLM(LMConfig(vocab_size=64, dim=dim, n_layers=n_layers, n_heads=4, scheme=scheme, train_len=L)).eval()


# ===================================================================== export
def test_nope_every4_exports_to_smollm3(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from posenc.hf.export import export

    m = pattern_model(PositionScheme.preset("nope_every4", train_len=L), n_layers=4)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    export(m, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "SmolLM3ForCausalLM" and hf.config.no_rope_layers == [1, 1, 1, 0]
    ids = torch.randint(0, 64, (2, 3 * L))
    with torch.no_grad():
        assert relative_error(hf(ids).logits, m(ids)) <= 1e-5


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_irope_exports_to_llama4(tmp_path, layout):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from posenc.hf.export import export

    m = pattern_model(PositionScheme.preset("irope", train_len=L, chunk=5, floor_scale=3.0, layout=layout))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    export(m, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "Llama4ForCausalLM" and hf.config.no_rope_layers == [1, 1, 1, 0]
    assert hf.config.layer_types == ["chunked_attention"] * 3 + ["full_attention"]
    ids = torch.randint(0, 64, (2, 23))
    with torch.no_grad():
        assert relative_error(hf(ids).logits, m(ids)) <= 1e-5


def test_other_patterns_are_refused(tmp_path):
    from posenc.hf.export import check_exportable, export

    with pytest.raises(ValueError, match="scheme 'local_global' does not export to SmolLM3ForCausalLM: .*restricted"):
        export(pattern_model(pattern("local_global")), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="does not export to Llama4ForCausalLM: .*floor_scale 2.5 is not an integer"):
        check_exportable(pattern("irope", floor_scale=2.5))
    windowed = pattern("irope").extend("sliding_window", window=3)
    with pytest.raises(ValueError, match="Llama4ForCausalLM: .*masks other than one chunk size"):
        check_exportable(windowed)
    bases = PositionScheme(name="two_bases", train_len=L, layers=(
        PositionScheme.preset("rope", train_len=L), PositionScheme.preset("rope", train_len=L, base=1e6)))
    with pytest.raises(ValueError, match="RoPE layers differ"):
        check_exportable(bases)
    rope = PositionScheme.preset("rope", train_len=L)
    temp = PositionScheme(name="t", train_len=L, layers=(rope.extend("temperature_tuning"), rope))
    with pytest.raises(ValueError, match="Llama 4 tunes only its NoPE layers"):
        check_exportable(temp)
