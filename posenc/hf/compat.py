"""Which transformers model families :func:`posenc.hf.extend` works on, checked on tiny random models.

:func:`scan` walks every model family of the installed transformers whose modeling file has a rotary
embedding (``XxxRotaryEmbedding``) and a ``XxxForCausalLM`` class, builds a tiny random model from the
family's own config class (:func:`posenc.hf.tiny.tiny_config`: hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16;
MoE, MLA and sub-configs shrunk, sizes under ``attribute_map`` aliases too; per-layer lists and
``per_layer_config`` overrides cut to 2 layers that keep every distinct layer type and an attention
layer; a KV-sharing model gets one sharing layer per kept layer; :data:`FAMILY_OVERRIDES` where a
family's default config cannot build or run its own model) and runs :func:`check_model`:

a. ``extend(model, "none")`` leaves the logits of a left-padded batch bit-for-bit unchanged (against a
   deep copy of the untouched model);
b. after ``extend(model, "rerope", window=16)``, greedy ``generate()`` of 8 new tokens on a left-padded
   batch of 2 gives the same tokens with and without the KV cache;
c. (reported, not part of the status) :func:`rope_difference`: the largest logit difference between the
   untouched model and posenc's engine running plain RoPE. (a) and (b) hold for an engine that is
   consistently wrong; (c) is what shows a NoPE layer rotated, attention sinks dropped or an
   interleaved rotary layout read as a half one.

A row per family: ``family``, ``status`` (``pass``; ``refused``: ``extend`` raised posenc's
``ValueError``, whose message is the reason; ``fail``: any other exception or different tokens;
``unbuildable``: the tiny config or model cannot be built (or still has more than :data:`MAX_PARAMS`
parameters: a size field the shrinking does not know), or the *untouched* model cannot run the check
itself), ``reason`` (exception type + first line of its message), ``rope_max_diff`` (c) and
``seconds``. Unbuildable families are not counted in the pass rate (``pass / built``).
:func:`write_table` writes the Markdown report, :func:`write_json` the rows.

:func:`tiny_from_fixture` builds a tiny model from the rope / attention fields of a real model's
``config.json`` (``tests/fixtures/hf_configs/``): everything that decides positions stays as published
(``rope_theta``, ``rope_parameters`` / ``rope_scaling``, ``head_dim``, ``sliding_window``, the
``layer_types`` pattern, ``original_max_position_embeddings``, ...); only width and depth shrink.
"""

from __future__ import annotations

import copy
import datetime
import importlib
import json
import re
import time
from pathlib import Path

import torch

from posenc.hf.tiny import TINY_SIZES, TOKENS, _shrunk_kwargs, tiny_config  # noqa: F401 - tiny_config: public here too

# the check's prompt: 12 tokens, 3 of them left padding in row 0; 8 new tokens; ReRoPE's window
PROMPT_LEN, PAD, NEW_TOKENS, REROPE_WINDOW = 12, 3, 8, 16


# ----------------------------------------------------------------------------- families
def _models_dir() -> Path:
    import transformers.models

    return Path(transformers.models.__file__).parent


# rotary classes of a modality tower (``Inkling2VisionRotaryEmbedding``): they rotate image / audio patches,
# not the tokens of the language model
_TOWER_ROTARY = re.compile(r"Vision|Visual|Audio|Image|Video|Speech")


def _text_rope(src: str) -> bool:
    """Whether a modeling file's language model can have RoPE: it names a rotary embedding, and not
    every rotary class it defines belongs to a modality tower. Inkling 2 is left out that way: its text
    layers position tokens with a learned relative bias per backward distance (``Inkling2RelativeLogits``), only its
    vision tower rotates, so its causal LM has no RoPE to extend."""
    if "RotaryEmbedding" not in src:
        return False
    defined = re.findall(r"^class (\w*RotaryEmbedding)\(", src, re.MULTILINE)
    return not defined or not all(_TOWER_ROTARY.search(name) for name in defined)


def rope_families() -> list[str]:
    """Model families of the installed transformers whose ``modeling_<family>.py`` has a rotary
    embedding for its language model (:func:`_text_rope`) and a ``*ForCausalLM`` class, sorted."""
    out = []
    for d in sorted(_models_dir().iterdir()):
        path = d / f"modeling_{d.name}.py"
        if not path.is_file():
            continue
        src = path.read_text(encoding="utf-8")
        if _text_rope(src) and re.search(r"^class \w+ForCausalLM\(", src, re.MULTILINE):
            out.append(d.name)
    return out


def causal_lm_class(family: str):
    """The family's ``*ForCausalLM`` class (the shortest name when there are several)."""
    name = f"transformers.models.{family}.modeling_{family}"
    module = importlib.import_module(name)
    classes = [c for n, c in vars(module).items()
               if n.endswith("ForCausalLM") and isinstance(c, type) and c.__module__ == name]
    if not classes:
        raise ValueError(f"transformers family {family!r} defines no *ForCausalLM class")
    return min(classes, key=lambda c: (len(c.__name__), c.__name__))


MAX_PARAMS = 5_000_000  # a tiny model above this kept a size field :data:`TINY_SIZES` does not know


def instantiate(cls, config, seed: int = 0):
    """``cls(config)`` in float32 eval mode, seeded; first built on the meta device to refuse a model
    with more than :data:`MAX_PARAMS` parameters (a size field the shrinking missed) before any memory
    is spent on it."""
    with torch.device("meta"):
        n = sum(p.numel() for p in cls._from_config(config, dtype=torch.float32).parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"tiny config still has {n:,} parameters (> {MAX_PARAMS:,}): a size field was not shrunk")
    torch.manual_seed(seed)
    return cls._from_config(config, dtype=torch.float32).eval()


# families whose RoPE is a config switch that is off by default: the tiny config turns it on, so the scan
# checks the family on its RoPE path (off, the model builds no rotary module and has nothing to extend).
# Zamba2: use_mem_rope (RoPE in its shared attention blocks; default False, a checkpoint's config sets it).
ROPE_SWITCHES = {"zamba2": {"use_mem_rope": True}}


def build_tiny(family: str, seed: int = 0):
    """A tiny random ``*ForCausalLM`` of ``family`` (:func:`tiny_config` with the family's
    :data:`ROPE_SWITCHES`, :func:`instantiate`)."""
    cls = causal_lm_class(family)
    return instantiate(cls, tiny_config(cls.config_class, **ROPE_SWITCHES.get(family, {})), seed)


# ----------------------------------------------------------------------------- the check
def left_padded_batch(vocab_size: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[2, 12]``: random tokens, row 0 left-padded by 3 pad tokens (0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (2, PROMPT_LEN), generator=g)
    mask = torch.ones(2, PROMPT_LEN, dtype=torch.long)
    ids[0, :PAD], mask[0, :PAD] = 0, 0
    return ids, mask


def greedy(model, ids, mask, use_cache: bool) -> torch.Tensor:
    """Greedy ``generate()`` of :data:`NEW_TOKENS` tokens (no EOS stop), with or without the KV cache."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                           pad_token_id=0, use_cache=use_cache)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)


class Refused(Exception):
    """``posenc.hf.extend`` refused the model (its ``ValueError`` is the cause)."""


class Unbuildable(Exception):
    """The tiny model cannot be built, or the untouched model cannot run the check."""


def _logits(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def check_model(model, method: str = "rerope", **params) -> float:
    """Run checks (a) and (b) of the module docstring on ``model`` (changed in place), then (c): the
    engine under a scheme equal to the model's own RoPE (``rerope`` with a window past the sequence)
    on a fresh copy; returns (c)'s largest logit difference from the untouched model (real tokens).
    Raises :class:`Refused`, :class:`Unbuildable` (the untouched model fails on its own) or
    ``AssertionError``."""
    from posenc.hf.patch import extend

    ids, mask = left_padded_batch(int(model.config.get_text_config().vocab_size))
    untouched = copy.deepcopy(model)
    try:
        ref = _logits(untouched, ids, mask)
    except Exception as exc:
        raise Unbuildable(f"untouched model forward: {_reason(exc)}") from exc
    if not torch.equal(_logits(extend(model, "none"), ids, mask), ref):
        raise AssertionError("extend(model, 'none') changed the logits")
    try:
        extend(model, method, **(params or {"window": REROPE_WINDOW}))
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    try:
        cached, uncached = greedy(model, ids, mask, True), greedy(model, ids, mask, False)
    except Exception:  # the model's own generate() may not run standalone (CSM's depth decoder needs
        _untouched_generate_is_cache_consistent(untouched, ids, mask)  # its backbone's state): unbuildable
        raise
    if not torch.equal(cached, uncached):
        same_untouched = _untouched_generate_is_cache_consistent(untouched, ids, mask)
        n = int((cached != uncached).sum())
        raise AssertionError(f"cached and uncached generate differ in {n} tokens after {method}"
                             + ("" if same_untouched else " (the untouched model's differ too)"))
    return rope_difference(untouched, ids, mask, ref)


def _untouched_generate_is_cache_consistent(untouched, ids, mask) -> bool:
    """Whether the untouched model's greedy tokens are the same with and without the KV cache;
    raises :class:`Unbuildable` when its ``generate()`` itself fails (the check cannot run on it)."""
    try:
        return torch.equal(greedy(untouched, ids, mask, True), greedy(untouched, ids, mask, False))
    except Exception as exc:
        raise Unbuildable(f"untouched model generate: {_reason(exc)}") from exc


def rope_difference(model, ids, mask, ref=None) -> float:
    """Largest |logit difference| on real tokens between ``model`` and a copy extended with ``rerope``
    at a window past the sequence (posenc's engine computing plain RoPE): 0 up to float rounding when
    the engine reproduces the model's attention (NoPE layers, attention sinks, interleaved rotary
    layouts and chunked attention are what it can miss)."""
    from posenc.hf.patch import extend

    ref = _logits(model, ids, mask) if ref is None else ref
    engine = extend(copy.deepcopy(model), "rerope", window=4 * ids.shape[1])
    return float((_logits(engine, ids, mask) - ref).abs()[mask.bool()].max())


def _reason(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip().rstrip(":")


def check_family(family: str, seed: int = 0) -> dict:
    """One row of :func:`scan` for ``family`` (never raises)."""
    start = time.perf_counter()
    status, reason, diff = "pass", "", None
    try:
        try:
            model = build_tiny(family, seed)
        except Exception as exc:
            raise Unbuildable(_reason(exc)) from exc
        diff = check_model(model)
    except Refused as exc:
        status, reason = "refused", str(exc).strip().splitlines()[0] if str(exc).strip() else "ValueError"
    except Unbuildable as exc:
        status, reason = "unbuildable", str(exc)
    except Exception as exc:  # one family's failure never stops the scan
        status, reason = "fail", _reason(exc)
    return {"family": family, "status": status, "reason": reason,
            "rope_max_diff": None if diff is None else float(f"{diff:.3g}"),
            "seconds": round(time.perf_counter() - start, 2)}


def scan(families=None, *, progress: bool = True, seed: int = 0) -> list[dict]:
    """Check every family of :func:`rope_families` (or ``families``); one row each (module docstring)."""
    import warnings

    from tqdm.auto import tqdm
    from transformers.utils import logging as hf_logging

    if isinstance(families, str):  # "llama,gemma3" is two families, not eleven letters
        families = [f.strip() for f in families.split(",") if f.strip()]
    names = rope_families() if families is None else list(families)
    if families is not None and not names:
        raise ValueError("families must name at least one transformers family (None checks every family)")
    unknown = [f for f in names if not (_models_dir() / f / f"modeling_{f}.py").is_file()]
    if unknown:
        raise ValueError(f"unknown transformers model families {unknown}")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    rows = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bar = tqdm(names, disable=not progress, desc="hf compat", unit="family")
            for family in bar:
                bar.set_postfix_str(family)
                rows.append(check_family(family, seed))
    finally:
        hf_logging.set_verbosity(level)
    return rows


# ----------------------------------------------------------------------------- report
STATUSES = ("pass", "refused", "fail", "unbuildable")


ROPE_TOLERANCE = 1e-4  # check (c): the engine reproduces the model's RoPE logits within this


def summary(rows: list[dict]) -> dict:
    """Counts per status, ``built`` (every status but unbuildable), ``pass_rate`` = pass / built, and
    ``pass_exact``: passing families whose check (c) difference is within :data:`ROPE_TOLERANCE`."""
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    built = len(rows) - counts["unbuildable"]
    exact = sum(r["status"] == "pass" and r.get("rope_max_diff") is not None
                and r["rope_max_diff"] <= ROPE_TOLERANCE for r in rows)
    return {"families": len(rows), "built": built, **counts, "pass_exact": exact,
            "pass_rate": round(counts["pass"] / built, 4) if built else None}


def _versions() -> dict:
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "date": datetime.date.today().isoformat()}


def table_markdown(rows: list[dict]) -> str:
    """The Markdown report: a title, what was checked, the summary line, one table row per family."""
    s, v = summary(rows), _versions()
    rate = "n/a" if s["pass_rate"] is None else f"{100 * s['pass_rate']:.1f}%"
    lines = [f"# posenc.hf compatibility: transformers {v['transformers']} (torch {v['torch']}, {v['date']})", "",
             "Tiny random model per family (hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16): "
             "(a) `extend(model, \"none\")` leaves the logits unchanged; (b) after "
             f"`extend(model, \"rerope\", window={REROPE_WINDOW})`, greedy `generate()` of {NEW_TOKENS} tokens "
             "on a left-padded batch of 2 gives the same tokens with and without the KV cache. "
             "Column *engine vs RoPE* (c, not part of the status): the largest logit difference between the "
             "untouched model and posenc's engine running plain RoPE (`rerope` with a window past the "
             "sequence); above float rounding the engine misses part of the model's attention.", "",
             f"**{s['pass']} pass / {s['built']} built = {rate}** ({s['families']} families: {s['pass']} pass, "
             f"{s['refused']} refused, {s['fail']} fail, {s['unbuildable']} unbuildable; unbuildable families "
             f"are not counted). Of the passing families, {s['pass_exact']} reproduce the model's own RoPE "
             f"logits within {ROPE_TOLERANCE:g} (c).", "",
             "| family | status | engine vs RoPE | seconds | reason |", "| --- | --- | ---: | ---: | --- |"]
    for r in rows:
        reason = str(r["reason"]).replace("|", "\\|").replace("\n", " ")
        diff = r.get("rope_max_diff")
        cell = "" if diff is None else f"{diff:.1e}"
        lines.append(f"| {r['family']} | {r['status']} | {cell} | {r['seconds']:.2f} | {reason} |")
    return "\n".join(lines) + "\n"


def write_table(rows: list[dict], path) -> Path:
    """Write :func:`table_markdown` of ``rows`` to ``path`` atomically (folders created); returns the path."""
    from posenc.runtime.atomic import atomic_write_text

    return atomic_write_text(path, table_markdown(rows))


def write_json(rows: list[dict], path) -> Path:
    """``{"versions", "summary", "rows"}`` as JSON at ``path``, written atomically."""
    from posenc.runtime.atomic import atomic_write_text

    return atomic_write_text(path, json.dumps({"versions": _versions(), "summary": summary(rows), "rows": rows},
                                              indent=1) + "\n")


# ----------------------------------------------------------------------------- real configs, shrunk
# what tiny_from_fixture shrinks: width and depth only (head dims, rope and attention fields stay real)
FIXTURE_SIZES = {k: v for k, v in TINY_SIZES.items()
                 if k not in ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "num_key_value_heads")}


# published configs that predate a field's type in transformers 5 (Llama 4 ships attn_temperature_tuning: 4,
# a flag transformers now types as bool); converted with the type before the config is built
LEGACY_FIELD_TYPES = {"attn_temperature_tuning": bool}


def load_fixture(path) -> dict:
    """A fixture of ``tests/fixtures/hf_configs/``: the published config fields plus ``_source``."""
    fields = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ValueError(f"{path}: a fixture is a JSON object with model_type")
    if not fields.get("_source"):
        raise ValueError(f"{path}: a fixture names its _source")
    return fields


def tiny_from_fixture(path, **overrides):
    """The tiny config of a real model's fixture: its rope and attention fields (``rope_theta``,
    ``rope_parameters``/``rope_scaling``, ``head_dim``, ``sliding_window``, ``layer_types`` pattern,
    ``original_max_position_embeddings``, ``query_pre_attn_scalar``, ...) as published; width and
    depth shrunk (:data:`FIXTURE_SIZES`; 2 layers keeping two distinct layer kinds; 4 heads and 2 KV
    heads, or 4 where the model has as many KV heads as heads). Configs without a ``head_dim`` field
    get ``hidden_size = 4 * head_dim`` so the head dimension (and LongRoPE's factor lists) stay real."""
    from transformers import AutoConfig

    fields = {k: v for k, v in load_fixture(path).items() if not k.startswith("_")}
    model_type = fields.pop("model_type")
    for k, kind in LEGACY_FIELD_TYPES.items():
        if k in fields:
            fields[k] = kind(fields[k])
    full = AutoConfig.for_model(model_type, **fields)
    d = full.to_dict()
    out = _shrunk_kwargs(full, FIXTURE_SIZES)
    heads, kv = int(d["num_attention_heads"]), int(d.get("num_key_value_heads") or d["num_attention_heads"])
    n_heads = FIXTURE_SIZES["num_attention_heads"]
    out["num_attention_heads"] = n_heads
    if "num_key_value_heads" in d:
        out["num_key_value_heads"] = n_heads if kv == heads else 2
    if not d.get("head_dim"):
        out["hidden_size"] = n_heads * (int(d["hidden_size"]) // heads)
    tokens = {k: v for k, v in TOKENS.items() if k in d}
    config = type(full)(**{**fields, **out, **tokens, **overrides})
    config._attn_implementation = "eager"
    return config


def build_from_fixture(path, seed: int = 0):
    """A tiny random ``AutoModelForCausalLM`` of :func:`tiny_from_fixture` in float32 eval mode (seeded)."""
    from transformers import AutoModelForCausalLM

    config = tiny_from_fixture(path)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
