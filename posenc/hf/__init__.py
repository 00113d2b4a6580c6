"""Layer 7, the Hugging Face integration: extend a transformers RoPE model's context with any posenc
method (``patch``), save and load it, and evaluate it with the lab's metrics (``evaluate``)."""

from posenc.hf.evaluate import evaluate_hf
from posenc.hf.patch import (
    HF_NATIVE,
    extend,
    layer_window,
    load,
    posenc_scheme,
    save,
    scheme_from_config,
    train_len_of,
)

__all__ = ["HF_NATIVE", "evaluate_hf", "extend", "layer_window", "load", "posenc_scheme", "save",
           "scheme_from_config", "train_len_of"]
