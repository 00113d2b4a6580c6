"""Tiny randomly initialised Hugging Face causal LMs of several families (nothing downloaded), the inputs they read,
shared by the tests of ``posenc.hf``, ``posenc extend`` and ``posenc.evals.pretrained``."""

from __future__ import annotations

import torch
import transformers

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
    """The config of a tiny ``arch`` model (eager attention)."""
    cls, extra = ARCHS[arch]
    args = {**COMMON, **extra, **kw}
    args = {k: v for k, v in args.items() if not (k == "num_key_value_heads" and v is None)}
    cfg = cls(**args)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(arch="llama", seed=0, **kw):
    """A tiny ``arch`` model with seeded random weights, in eval mode."""
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(make_config(arch, **kw)).eval()


def ids(n=12, batch=2, seed=1):
    """``[batch, n]`` token ids (no padding id)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 300, (batch, n), generator=g)
