"""Whole models through ``posenc.hf.extend``: random weights of real shapes (nothing can be downloaded on the
device), so the numbers are speeds, not answers. SmolLM2-135M's shape (30 layers, 9 query / 3 key heads of 64,
trained at 8k) and Llama-3.1-8B's (32 layers, 32 / 8 heads of 128, rope theta 5e5, taken as trained at 8k),
prefill at 32k and 128k (the 8B model: the lengths its time budget allows) and greedy decode tokens/s after a 32k
prefill, every main method against the untouched model (transformers' own SDPA attention) in the same run.

A prefill is the forward of the prompt with the cache filled and only the last position's logits computed
(``logits_to_keep=1``: the 8B model's 128k x 128k-vocabulary logits alone would take 33 GB); its time is the
faster of two runs (the first one compiles FlexAttention for a new shape). Decode: ``steps`` single-token forwards
through transformers' ``DynamicCache`` after the prefill.
"""

from __future__ import annotations

import time

import torch

from benchmarks.gpu.common import Run, sync

METHODS = ("none", "yarn", "yarn@engine", "selfextend", "rerope", "dca", "string", "streaming_llm")
SHAPES = {
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                     "num_key_value_heads": 3, "vocab_size": 49152, "rope_theta": 100000.0, "train": 8192},
    "llama-3.1-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "rope_theta": 500000.0, "train": 8192},
}
DRY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 300, "rope_theta": 10000.0, "train": 64}


def build(shape: dict, run: Run):
    """A random-weight ``LlamaForCausalLM`` of ``shape`` on the run's device and dtype (built there directly)."""
    import transformers

    kw = {k: v for k, v in shape.items() if k not in ("train", "rope_theta")}
    cfg = transformers.LlamaConfig(max_position_embeddings=shape["train"], tie_word_embeddings=False, **kw)
    try:  # transformers 5: rope parameters in one dict
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": shape["rope_theta"]}
    except Exception:  # noqa: BLE001 - older configs: the plain attribute
        cfg.rope_theta = shape["rope_theta"]
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(run.dtype)
    try:
        with torch.device(run.device):
            model = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def _params(method: str, shape: dict, length: int) -> tuple[str, dict, bool | None]:
    from posenc.methods import length_defaults

    spec, _, form = method.partition("@")
    if spec == "none":
        return spec, {}, None
    head = shape["hidden_size"] // shape["num_attention_heads"]
    params = length_defaults(spec, shape["train"], length, head_dim=head, base=shape["rope_theta"], hf=True)
    return spec, params, (False if form == "engine" else None)


def _prefill(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=True, logits_to_keep=1)


def _decode(model, out, steps: int, device) -> float:
    """Tokens per second of ``steps`` greedy single-token forwards after the prefill ``out``."""
    cache = out.past_key_values
    tok = out.logits[:, -1:].argmax(-1)
    sync(device)
    t = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            o = model(tok, past_key_values=cache, use_cache=True)
            cache, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
    sync(device)
    return steps / (time.perf_counter() - t)


def whole_model(run: Run, name: str, lengths: tuple[int, ...], decode_at: int | None, methods=METHODS,
                steps: int = 16) -> None:
    """Prefill (and decode) times of ``methods`` on the model ``name`` at ``lengths``; rows in
    ``sections.models.rows``, each with its ratio to the untouched model at the same length."""
    import posenc.hf

    shape = DRY if run.dry_run else SHAPES[name]
    if run.dry_run:
        lengths, decode_at, steps = (256,), 256, 4
    with run.item("models", f"build {name}", need=30) as go:
        if not go:
            return
        model = build(shape, run)
    for n in lengths:
        ids = torch.randint(0, shape["vocab_size"], (1, n), device=run.device)
        base = {}
        for method in methods:
            need = 20 + 40 * (n / 131072) * (shape["hidden_size"] / 4096)
            with run.item("models", f"{name} {method} at {n}", need=need) as go:
                if not go:
                    continue
                spec, params, native = _params(method, shape, n)
                kw = {} if native is None else {"native": native}
                model = posenc.hf.extend(model, spec, **kw, **params) if spec != "none" else model
                try:
                    times, out = [], None
                    for _ in range(2):
                        out = None  # the previous prefill's cache freed before the next one
                        sync(run.device)
                        t = time.perf_counter()
                        out = _prefill(model, ids)
                        sync(run.device)
                        times.append(time.perf_counter() - t)
                    row = {"model": name, "method": method, "params": params, "length": n,
                           "prefill_s": round(min(times), 4), "first_prefill_s": round(times[0], 4)}
                    if decode_at == n:
                        row["decode_tok_s"] = round(_decode(model, out, steps, run.device), 2)
                    del out
                    if run.device.type == "cuda":
                        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
                        torch.cuda.reset_peak_memory_stats()
                    base.setdefault("none", row if method == "none" else None)
                    ref = base.get("none")
                    if ref is not None and method != "none":
                        row["prefill_vs_untouched"] = round(row["prefill_s"] / ref["prefill_s"], 3)
                        if "decode_tok_s" in row and "decode_tok_s" in ref:
                            row["decode_vs_untouched"] = round(row["decode_tok_s"] / ref["decode_tok_s"], 3)
                    run.add("models", "rows", row)
                finally:
                    if spec != "none":
                        model = posenc.hf.unextend(model)
                    if run.device.type == "cuda":
                        torch.cuda.empty_cache()
    del model
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
