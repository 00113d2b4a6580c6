"""Rotated keys kept across the forward calls of an extended Hugging Face model (``posenc.hf.keys``): carried only
while transformers' cache provably holds the same keys, and giving exactly the lean form's answers either way."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from posenc.hf import extend, unextend
from posenc.hf.keys import stored_bytes
from posenc.hf.tiny import tiny_config

N = 40


def _pair(method="selfextend", **params):
    """The same tiny Llama (trained length 16) extended twice: with rotated keys and in the lean form."""
    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_config(LlamaConfig, max_position_embeddings=16)).eval()
    lean = copy.deepcopy(base)
    params = params or {"window": 8, "group": 4}
    return extend(base, method, **params), extend(lean, method, rotated_keys=False, **params)


def _store(model, layer=0):
    return model.model.layers[layer].self_attn._posenc_keys.store


def _steps(model, ids, cache, n):
    """``n`` greedy cached steps after ``ids`` (already in ``cache``): the logits of each."""
    out = []
    tok = ids[:, -1:]
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=tok, cache=cache, use_cache=True).logits[:, -1]
            out.append(logits)
            tok = logits.argmax(-1, keepdim=True)
    return out


def _prefill(model, ids):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :-1], cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("method, params", [("selfextend", {"window": 8, "group": 4}), ("rerope", {"window": 8}),
                                            ("dca", {"chunk": 12, "local": 2}), ("string", {"shift": 6, "local": 2}),
                                            ("yarn", {"factor": 4.0, "native": False}), ("dynamic_yarn", {"step": 4}),
                                            ("streaming_llm", {"window": 12, "n_sinks": 2})])
def test_decoding_with_rotated_keys_equals_the_lean_form(method, params):
    model, lean = _pair(method, **params)
    ids = torch.randint(0, 256, (2, N), generator=torch.Generator().manual_seed(1))
    got = _steps(model, ids, _prefill(model, ids), 12)
    want = _steps(lean, ids, _prefill(lean, ids), 12)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert not hasattr(lean.model.layers[0].self_attn, "_posenc_keys")


def test_a_decode_step_rotates_only_its_new_keys():
    model, _ = _pair()
    ids = torch.randint(0, 256, (1, N), generator=torch.Generator().manual_seed(2))
    cache = _prefill(model, ids)
    store = _store(model)
    after_prefill = store.rotated_rows
    assert after_prefill == (N - 1) + (N - 1 - 8)  # the prefill: near, every key at n; far, n // 4 of distance >= 8
    _steps(model, ids, cache, 10)
    assert store.rotated_rows - after_prefill == 2 * 10  # then one key per rotation and step
    assert stored_bytes(model) > 0


@pytest.mark.parametrize("change", ["crop", "reorder", "new cache", "written in place", "no cache"])
def test_a_cache_that_changed_is_not_carried(change):
    """Whatever was done to the cache between two forwards, the store starts again and the answer is the lean
    form's (beam search reorders, crop cuts, an in-place write moves the version counter)."""
    model, lean = _pair()
    ids = torch.randint(0, 256, (2, N), generator=torch.Generator().manual_seed(3))
    caches = [_prefill(m, ids) for m in (model, lean)]
    for m, c in zip((model, lean), caches):
        _steps(m, ids, c, 3)
    before = _store(model).rotated_rows
    for c in caches:
        if change == "crop":
            c.crop(-5)
        elif change == "reorder":
            c.reorder_cache(torch.tensor([1, 0]))
        elif change == "written in place":
            c.layers[0].keys.mul_(0.5)
    if change == "new cache":
        caches = [_prefill(m, ids[:, :30]) for m in (model, lean)]
    tok = ids[:, -1:]
    with torch.no_grad():
        if change == "no cache":
            got, want = model(input_ids=ids, use_cache=False).logits, lean(input_ids=ids, use_cache=False).logits
        else:
            got, want = (m(input_ids=tok, cache=c, use_cache=True).logits for m, c in zip((model, lean),
                                                                                             caches))
    assert torch.equal(got, want)
    rotated = _store(model).rotated_rows - before
    assert rotated == 0 if change == "no cache" else rotated > 2  # rotated from the start, not one key
    if change == "no cache":
        assert stored_bytes(model) == 0  # a forward without a cache keeps nothing


def test_beam_search_with_rotated_keys_equals_the_lean_form():
    model, lean = _pair()
    ids = torch.randint(0, 256, (1, N), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a = model.generate(ids, max_new_tokens=8, num_beams=3, do_sample=False)
        b = lean.generate(ids, max_new_tokens=8, num_beams=3, do_sample=False)
    assert torch.equal(a, b)


def test_rotated_keys_is_a_flag_and_unextend_removes_the_stores():
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(LlamaConfig, max_position_embeddings=16)).eval()
    with pytest.raises(TypeError, match="rotated_keys"):
        extend(model, "selfextend", rotated_keys="yes", window=8, group=4)
    extend(model, "selfextend", window=8, group=4)
    hooks = len(model.model.layers[0].self_attn._forward_pre_hooks)
    assert hooks >= 1
    unextend(model)
    attn = model.model.layers[0].self_attn
    assert not hasattr(attn, "_posenc_keys") and len(attn._forward_pre_hooks) == hooks - 1


def test_under_inference_mode_nothing_is_carried_and_the_answer_is_the_lean_forms():
    """Inference-mode tensors keep no version counter, so an in-place write to the cache cannot be ruled out: the
    store carries nothing (and does not fail), and decoding equals the lean form."""
    model, lean = _pair()
    ids = torch.randint(0, 256, (1, N), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        caches = [_prefill(m, ids) for m in (model, lean)]
        before = _store(model).rotated_rows
        got, want = (_steps(m, ids, c, 3) for m, c in zip((model, lean), caches))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert _store(model).rotated_rows - before > 3 * 2  # every step rotated more than its new keys
