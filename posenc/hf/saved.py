"""The on-disk form of a model extended on posenc's engine, so that it can never be loaded without its method.

A method transformers implements (YaRN, linear/PI, dynamic NTK, Llama 3, LongRoPE: ``hf_native``) is saved
as a plain transformers folder: ``config.json`` holds transformers' own ``rope_parameters`` and the extended
``max_position_embeddings``, so transformers, vLLM or a llama.cpp conversion serve it as they are.

Every other method runs in posenc's attention function, which a plain ``from_pretrained`` would not call:
the model would load with its original RoPE and say nothing. So :func:`posenc.hf.save` writes such a
model's ``config.json`` as a wrapper that plain transformers refuses, and that transformers' own
custom-code mechanism loads with the method applied::

    {"model_type": "posenc_extended", "architectures": ["PosencExtendedForCausalLM"],
     "auto_map": {"AutoConfig": "posenc_extended.PosencExtendedConfig",
                  "AutoModelForCausalLM": "posenc_extended.PosencExtendedForCausalLM"},
     "posenc": {"method": ..., "params": ..., ...},      # what posenc.hf.extend re-applies
     "base_config": {... the model's own config.json ...}}

next to ``posenc_extended.py`` (:data:`CUSTOM_CODE`, a few lines that call :func:`posenc.hf.load`). Then

- ``posenc.hf.load(DIR)`` (and ``posenc eval --hf-model DIR``) load it extended;
- ``transformers.AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads it extended too
  (posenc must be installed; the custom code says so otherwise);
- ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` refuses: the folder "contains custom code which
  must be executed to correctly load the model", and asks for ``trust_remote_code=True``;
- vLLM and conversion scripts refuse the unknown ``model_type``: these methods need posenc's attention.

The weights and the tokenizer files are the model's own, under their own names. We chose this over a
config that merely fails to parse because the custom-code route keeps the folder usable from plain
transformers code (one flag), and over writing posenc's section into the model's own config (what posenc
did before), which plain transformers loaded silently without the method.
"""

from __future__ import annotations

__all__ = ["AUTO_MAP", "CODE_FILE", "CUSTOM_CODE", "MODEL_TYPE", "is_wrapped", "unwrap_config", "wrap_config"]

MODEL_TYPE = "posenc_extended"
CODE_FILE = "posenc_extended.py"
AUTO_MAP = {"AutoConfig": "posenc_extended.PosencExtendedConfig",
            "AutoModelForCausalLM": "posenc_extended.PosencExtendedForCausalLM"}

CUSTOM_CODE = '''"""A transformers model extended with posenc (written by posenc.hf.save; see posenc/hf/saved.py).

Its positional method runs in posenc's attention function, so the model loads only with posenc:
``posenc.hf.load(DIR)`` or ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)``.
config.json holds the method (``posenc``) and the model's own config (``base_config``).
"""

from transformers import PretrainedConfig, PreTrainedModel


class PosencExtendedConfig(PretrainedConfig):
    model_type = "posenc_extended"


class PosencExtendedForCausalLM(PreTrainedModel):
    config_class = PosencExtendedConfig

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        try:
            from posenc.hf.patch import load
        except ImportError as exc:
            raise ImportError("this model was extended with posenc (its method runs in posenc's attention "
                              "function): pip install posenc, then load it again") from exc
        for key in ("trust_remote_code", "adapter_kwargs", "code_revision"):
            kwargs.pop(key, None)
        return load(pretrained_model_name_or_path, *args, **kwargs)
'''


def wrap_config(config: dict) -> dict:
    """The wrapper ``config.json`` of an engine-extended model whose own config (with its ``posenc``
    section) is ``config``."""
    base = dict(config)
    record = base.pop("posenc")
    return {"model_type": MODEL_TYPE, "architectures": ["PosencExtendedForCausalLM"], "auto_map": dict(AUTO_MAP),
            "posenc": record, "base_config": base,
            "transformers_version": base.get("transformers_version")}


def is_wrapped(config: dict) -> bool:
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def unwrap_config(config: dict) -> tuple[dict, dict]:
    """``(the model's own config dict, the posenc record)`` of a wrapper config; ``ValueError`` naming what is
    missing when the file is damaged."""
    base, record = config.get("base_config"), config.get("posenc")
    if not isinstance(base, dict) or not isinstance(base.get("model_type"), str):
        raise ValueError(f"config.json of a posenc-extended model has no 'base_config' with a model_type, got "
                         f"{base!r}")
    if not isinstance(record, dict) or not isinstance(record.get("method"), str):
        raise ValueError(f"config.json of a posenc-extended model has no 'posenc' record with a method, got {record!r}")
    return base, record
