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

Both forms also hold ``posenc.json`` (:data:`RECORD_FILE`, :func:`saved_record`): what the model was extended
with, for people and for posenc's commands: the method, the parameters as given and every parameter with the
value it runs with (``resolved``: the defaults filled in), the trained length and the target length (the length
the parameters were chosen for: ``target_length`` given to :func:`posenc.hf.extend`, else the trained length times
``factor``, else the native ``max_position_embeddings``; None when nothing states one). transformers ignores it.

posenc's own commands read a saved folder through :func:`model_config` and :func:`posenc.hf.load`, which build the
model's own config class from ``base_config``: no ``trust_remote_code``, no file of the folder executed. Only
plain transformers code (``from_pretrained(DIR, trust_remote_code=True)``) runs ``posenc_extended.py``: the few
lines of :data:`CUSTOM_CODE` that posenc wrote, or whatever that file holds now.

The weights and the tokenizer files are the model's own, under their own names. We chose this over a
config that merely fails to parse because the custom-code route keeps the folder usable from plain
transformers code (one flag), and over writing posenc's section into the model's own config (what posenc
did before), which plain transformers loaded silently without the method.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["AUTO_MAP", "CODE_FILE", "CUSTOM_CODE", "MODEL_TYPE", "RECORD_FILE", "describe_record", "is_wrapped",
           "model_config", "read_config_json", "saved_record", "unwrap_config", "wrap_config"]

RECORD_FILE = "posenc.json"

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


def read_config_json(folder) -> dict:
    """``folder/config.json`` as a dict; ``ValueError`` naming the file when it is missing or not JSON."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(f"model folder {str(folder)!r} has no config.json (expected a folder written by "
                         "save_pretrained)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): the file is damaged") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds {type(raw).__name__}, not a config object: the file is damaged")
    return raw


def model_config(folder):
    """The transformers config of the model in ``folder``: for a ``posenc_extended`` wrapper, its own config class
    built from ``base_config`` (no custom code asked for, none executed); else ``AutoConfig`` as usual."""
    raw = read_config_json(folder)
    if not is_wrapped(raw):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(folder)
    from transformers import CONFIG_MAPPING

    base, _ = unwrap_config(raw)
    if base["model_type"] not in CONFIG_MAPPING:
        raise ValueError(f"{Path(folder) / 'config.json'}: model type {base['model_type']!r} is not in this "
                         "transformers")
    return CONFIG_MAPPING[base["model_type"]].from_dict(base)


def saved_record(folder) -> dict | None:
    """What the model in ``folder`` was extended with (``posenc.json``, see the module docstring), or None for a
    model posenc did not extend. A wrapper folder of an earlier posenc without ``posenc.json`` gives the wrapper's
    record (method and parameters as given). ``ValueError`` naming the file when it is damaged."""
    path = Path(folder) / RECORD_FILE
    if path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}): the file is damaged") from None
        if not isinstance(record, dict) or not isinstance(record.get("method"), str):
            raise ValueError(f"{path} has no 'method': the file is damaged")
        return record
    if (Path(folder) / "config.json").is_file():
        raw = read_config_json(folder)
        if is_wrapped(raw):
            return dict(unwrap_config(raw)[1])
    return None


def describe_record(record: dict) -> str:
    """One line: ``selfextend (group=8, window=1024; trained 8192, target 32768)``."""
    params = record.get("resolved") or record.get("params") or {}
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    lengths = []
    if record.get("trained_length"):
        lengths.append(f"trained {record['trained_length']}")
    if record.get("target_length"):
        lengths.append(f"target {record['target_length']}")
    inside = "; ".join(x for x in (shown, ", ".join(lengths)) if x)
    return f"{record['method']} ({inside})" if inside else record["method"]
