"""The Hugging Face integration: extend a transformers RoPE model's context with any posenc method (``patch``,
``layers``, ``attention``, ``sparse``), save and load it (``saved``), find a model (``source``: folders, GGUF
files, the bundled SmolLM2), export a lab TinyLM to a plain ``LlamaForCausalLM`` folder (``export``), and check
every transformers family (``compat``, on ``tiny`` models). Evaluating such a model is :mod:`posenc.evals`."""

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

__all__ = ["HF_NATIVE", "export", "extend", "layer_window", "load", "posenc_scheme", "save",
           "scheme_from_config", "train_len_of", "unextend"]
