"""Layer 7, the Hugging Face integration: extend a transformers RoPE model's context with any posenc
method (``patch``), save and load it, evaluate it with the lab's metrics (``evaluate``), and export a lab
TinyLM to a plain ``LlamaForCausalLM`` folder (``export``)."""

from posenc.hf.evaluate import evaluate_hf
from posenc.hf.export import export
from posenc.hf.patch import (
    HF_NATIVE,
    extend,
    layer_window,
    load,
    posenc_scheme,
    save,
    scheme_from_config,
    train_len_of,
    unextend,
)

__all__ = ["HF_NATIVE", "evaluate_hf", "export", "extend", "layer_window", "load", "posenc_scheme", "save",
           "scheme_from_config", "train_len_of", "unextend"]
