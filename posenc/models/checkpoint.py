"""Checkpoints of a :class:`~posenc.models.tinylm.TinyLM` run: safetensors + JSON, no pickle.

A run directory holds::

    model.safetensors         model weights (state_dict)
    train_state.safetensors   optimizer tensors (``optim.<param index>.<name>``) and RNG states (uint8)
    train_state.json          step, finished flag, optimizer hyper-parameters / scalar state, history
    config.json               LMConfig.to_dict() + posenc version + ``extra`` (corpus, tokenizer, train
                              config) + ``checkpoint``: size and sha256 of every file above

Commit protocol (:func:`_commit`), atomic as a whole: a kill at any instant leaves either the previous or
the new checkpoint loadable, never a mix.

1. Every file of the new checkpoint is written completely (fsynced temp file, then ``os.replace``) into
   the staging folder ``.pending/``, ``config.json`` last. Until ``.pending/config.json`` exists, the
   folder's own files are the previous checkpoint, untouched.
2. ``.pending/config.json`` is the commit point: from then on the new checkpoint is the one that counts.
   Its files are moved into the run folder one ``os.replace`` at a time, ``config.json`` last; each file
   of the new checkpoint is always in exactly one of ``.pending/`` and the run folder.
3. ``.pending/`` is removed.

A reader (:func:`checkpoint_files`) takes ``.pending/config.json`` when it exists, each of its files from
``.pending/`` if still there, else from the run folder; otherwise the run folder's ``config.json``. The
config names the exact size and sha256 of the files it commits to, so a torn or foreign file is reported
as a ``ValueError`` naming it, and loading never deletes or rewrites anything. The writer (the process
holding the folder's :class:`~posenc.runtime.lock.FolderLock`) finishes an interrupted commit and removes the
temp files a killed save left behind (:func:`recover`) before it writes again. A ``config.json`` that
parses but is damaged (``"checkpoint": null``, ``"files": []``, ``"extra": 3``) is a ``ValueError`` naming
the file, as is a full disk while saving (the previous checkpoint stays). ``torch.load`` is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from posenc._version import __version__
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.runtime.atomic import fsync_dir, remove_stale_temps, write_temp

FORMAT = "posenc-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.safetensors"
STATE_JSON = "train_state.json"
CONFIG_FILE = "config.json"
PENDING = ".pending"  # the staging folder of a commit in progress (see the module docstring)
_FILES = (MODEL_FILE, STATE_FILE, STATE_JSON, CONFIG_FILE)
_LM_FIELDS = ("vocab_size", "dim", "n_layers", "n_heads", "scheme", "train_len", "mlp_ratio", "dropout",
              "n_kv_heads")


def _version() -> str:
    return __version__


def _fix(path: Path, what: str) -> str:
    return (f"{path} {what}; the checkpoint in {path.parent} is damaged: delete the run folder (or choose another "
            f"out_dir) and train again, or restore the file from a backup")


def _commit(folder: Path, files: dict[str, bytes]) -> None:
    """Commit ``files`` (the dict's last entry, the commit marker ``config.json``, last) with the protocol of
    the module docstring: staged complete in ``.pending/``, then moved into ``folder`` one by one."""
    folder.mkdir(parents=True, exist_ok=True)
    recover(folder)  # an earlier commit killed half-way is finished first; stale temp files go
    stage = folder / PENDING
    stage.mkdir(exist_ok=True)
    for name, data in files.items():  # 1. staged; the last one (config.json) is the commit point
        tmp = write_temp(stage, name, data)
        os.replace(tmp, stage / name)
    fsync_dir(stage)
    _move_staged(folder, list(files))  # 2. and 3.


def _move_staged(folder: Path, names: list[str]) -> None:
    """Move the staged files into ``folder`` (``config.json`` last), then remove the staging folder."""
    stage = folder / PENDING
    for name in sorted(names, key=lambda n: n == CONFIG_FILE):
        if (stage / name).exists():
            os.replace(stage / name, folder / name)
    for name in set(_FILES) - set(names):  # files of the previous checkpoint that the new one has not
        (folder / name).unlink(missing_ok=True)
    fsync_dir(folder)
    remove_stale_temps(stage)
    try:
        stage.rmdir()
    except OSError:  # something that is not ours was put there: leave it
        pass


def recover(run_dir) -> list[str]:
    """Bring a run folder to a clean committed state; call it only while holding the folder's lock (the
    writer does, before it saves). A commit that reached its commit point (``.pending/config.json``) is
    finished; an earlier, incomplete staging is dropped; temp files of a killed save are removed.
    Returns what was done, one line each (empty when the folder was clean)."""
    folder = Path(run_dir)
    stage = folder / PENDING
    done: list[str] = []
    if (stage / CONFIG_FILE).is_file():
        names = list(_staged_config(folder).get("checkpoint", {}).get("files", {})) + [CONFIG_FILE]
        _move_staged(folder, names)
        done.append(f"finished the interrupted commit of {folder}")
    elif stage.is_dir():
        for p in stage.iterdir():
            if p.name in _FILES or p.name.endswith(".tmp"):
                p.unlink()
        try:
            stage.rmdir()
        except OSError:
            pass
        done.append(f"dropped an incomplete checkpoint staged in {stage}")
    stale = remove_stale_temps(folder, _FILES)
    if stale:
        done.append(f"removed {len(stale)} temp file(s) of a killed save in {folder}")
    return done


def _digest(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# ------------------------------------------------------------------------------------------------ optimizer
def _flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """``optimizer.state_dict()`` -> (tensors for safetensors, JSON-able rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"optim.{idx}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[k] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, v in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = v
    for idx, st in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(st)
    return {"state": state, "param_groups": meta["param_groups"]}


def _optimizer_class(optimizer) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_optimizer(optimizer, meta: dict, path: Path) -> None:
    """Refuse to resume one optimizer's state into another class (torch would load it silently)."""
    saved = meta.get("class")
    if saved is not None and saved != _optimizer_class(optimizer):
        raise ValueError(f"{path} holds the state of optimizer {saved}, not {_optimizer_class(optimizer)}; "
                         f"resume with the same optimizer class (or start a new run)")
    groups = meta.get("param_groups") or [{}]
    own = optimizer.state_dict()["param_groups"] or [{}]
    saved_keys, own_keys = set(groups[0]) - {"params"}, set(own[0]) - {"params"}
    if saved_keys != own_keys:  # checkpoints without "class": the hyper-parameter names tell
        raise ValueError(f"{path} holds optimizer hyper-parameters {sorted(saved_keys)}, but the optimizer "
                         f"to resume has {sorted(own_keys)}: another optimizer class; resume with the same one")


def rng_states() -> dict[str, torch.Tensor]:
    """Current torch RNG states as uint8 tensors (CPU, and every CUDA device when CUDA is initialised)."""
    out = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    return out


def set_rng_states(tensors: dict[str, torch.Tensor]) -> None:
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"].to(torch.uint8))
    cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k].to(torch.uint8) for k in cuda][:torch.cuda.device_count()])


# ------------------------------------------------------------------------------------------------ save
def save_checkpoint(run_dir, model: TinyLM, cfg: LMConfig, train_state: dict | None = None, optimizer=None,
                    extra: dict | None = None) -> Path:
    """Save ``model`` (+ optimizer and RNG states and ``train_state``) to ``run_dir`` atomically.

    ``train_state`` is a JSON-able dict (``step``, ``finished``, history ...); with ``optimizer`` its
    state is stored too, and the current torch RNG states always are, so :func:`load_checkpoint` can
    resume bit-exactly. ``extra`` (corpus, tokenizer, train config ...) goes into ``config.json``.
    Returns the run folder.
    """
    run_dir = Path(run_dir)
    model = getattr(model, "module", model)  # unwrap DDP
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    files: dict[str, bytes] = {MODEL_FILE: st_save(weights, metadata={"format": FORMAT})}
    if train_state is not None or optimizer is not None:
        tensors = dict(rng_states())
        meta = {"train_state": dict(train_state or {}), "optimizer": None}
        if optimizer is not None:
            opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
            opt_meta["class"] = _optimizer_class(optimizer)
            tensors.update(opt_tensors)
            meta["optimizer"] = opt_meta
        files[STATE_FILE] = st_save(tensors, metadata={"format": FORMAT})
        files[STATE_JSON] = json.dumps(meta, indent=1, sort_keys=True, default=str).encode()
    config = {**cfg.to_dict(), "posenc_version": _version(), "extra": dict(extra or {}),
              "checkpoint": {"format": FORMAT, "format_version": FORMAT_VERSION,
                             "files": {name: _digest(data) for name, data in files.items()}}}
    files[CONFIG_FILE] = json.dumps(config, indent=2, sort_keys=True, default=str).encode()  # commit marker
    _commit(run_dir, files)
    return run_dir


# ------------------------------------------------------------------------------------------------ load
def has_checkpoint(run_dir) -> bool:
    """True when ``run_dir`` holds a committed checkpoint (its ``config.json``, or a commit past its commit
    point in ``.pending/``)."""
    run_dir = Path(run_dir)
    return (run_dir / CONFIG_FILE).is_file() or (run_dir / PENDING / CONFIG_FILE).is_file()


def is_run_folder(path) -> bool:
    """True when ``path`` holds a posenc checkpoint (its config has a ``scheme``, a Hugging Face one a
    ``model_type``); a checkpoint whose config does not parse counts, so that its loader names the damage."""
    folder = Path(path)
    if not folder.is_dir() or not has_checkpoint(folder):
        return False
    config = folder / CONFIG_FILE if (folder / CONFIG_FILE).is_file() else folder / PENDING / CONFIG_FILE
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return True
    return not (isinstance(data, dict) and "model_type" in data and "scheme" not in data)


def _parse_config(path: Path) -> dict:
    """``path`` parsed and checked: a JSON object with a model config and, when present, a well-formed
    ``checkpoint`` section and ``extra`` object; ``ValueError`` naming the file otherwise."""
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(_fix(path, f"is not valid JSON ({exc})")) from None
    if isinstance(config, dict) and "model_type" in config and "scheme" not in config:  # not damaged: not a run
        raise ValueError(f"{path.parent} holds a Hugging Face model ({path.name} has model_type "
                         f"{config['model_type']!r}), not a run of `posenc train`; the commands that take a MODEL "
                         f"(generate, eval, extend, tune) read it as it is")
    if not isinstance(config, dict) or "scheme" not in config:
        raise ValueError(_fix(path, "does not hold a model config (no 'scheme' key)"))
    if "extra" in config and not isinstance(config["extra"], dict):
        raise ValueError(_fix(path, f"has 'extra' {config['extra']!r}, not an object"))
    if not isinstance(config.get("extra", {}).get("train", {}), dict):
        raise ValueError(_fix(path, "has 'extra.train' that is not an object"))
    if "checkpoint" in config:  # absent in checkpoints of early posenc versions: no digests to check
        ck = config["checkpoint"]
        files = ck.get("files") if isinstance(ck, dict) else None
        if not isinstance(files, dict) or MODEL_FILE not in files:
            raise ValueError(_fix(path, f"has a damaged 'checkpoint' section ({ck!r}); it must be an object whose "
                                        f"'files' maps {MODEL_FILE} (and the train-state files) to their bytes "
                                        f"and sha256"))
        for name, d in files.items():
            if name not in _FILES or not isinstance(d, dict) or not isinstance(d.get("bytes"), int) \
                    or not isinstance(d.get("sha256"), str):
                raise ValueError(_fix(path, f"has a damaged 'checkpoint.files' entry {name!r}: {d!r}"))
    return config


def _staged_config(run_dir: Path) -> dict:
    return _parse_config(run_dir / PENDING / CONFIG_FILE)


def checkpoint_files(run_dir) -> tuple[dict, dict[str, Path]]:
    """``(config, {file name: path})`` of the checkpoint that counts in ``run_dir`` (see the module
    docstring: a commit past its commit point is read from ``.pending/`` and the run folder together);
    ``ValueError`` naming the file when there is none or its ``config.json`` is damaged."""
    run_dir = Path(run_dir)
    stage = run_dir / PENDING
    if (stage / CONFIG_FILE).is_file():
        config = _staged_config(run_dir)
        return config, {n: stage / n if (stage / n).is_file() else run_dir / n for n in _committed(config, stage)}
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist: {run_dir} is not a posenc checkpoint folder "
                         f"(expected {MODEL_FILE} + {CONFIG_FILE}, written by `posenc train`)")
    config = _parse_config(path)
    return config, {n: run_dir / n for n in _committed(config, run_dir)}


def _committed(config: dict, folder: Path) -> list[str]:
    """The data files a config commits to: those its ``checkpoint`` section lists (missing ones are
    reported when read; a file of an earlier checkpoint that the new one does not list is not part of it),
    or, for a config of an early version without that section, the weights and whichever state files exist."""
    files = config.get("checkpoint", {}).get("files")
    if files is not None:
        return [n for n in files if n != CONFIG_FILE]
    return [MODEL_FILE] + [n for n in (STATE_FILE, STATE_JSON) if (folder / n).is_file()]


def read_config(run_dir) -> dict:
    """The parsed ``config.json`` of a run; ``ValueError`` naming the file when it is missing or corrupt."""
    return checkpoint_files(run_dir)[0]


def read_train_state(run_dir) -> dict:
    """The ``train_state`` (step, finished, history ...) of a run's checkpoint, checked against its digest;
    ``{}`` for a checkpoint without one (weights only)."""
    config, paths = checkpoint_files(run_dir)
    if STATE_JSON not in paths:
        return {}
    meta = _state_meta(paths, config)
    return meta.get("train_state", {})


def model_digest(run_dir) -> str:
    """The sha256 of a run's ``model.safetensors`` as its ``config.json`` records it (computed for a
    checkpoint of an early version without digests): names the exact weights, e.g. in a cell key."""
    config, paths = checkpoint_files(run_dir)
    recorded = config.get("checkpoint", {}).get("files", {}).get(MODEL_FILE)
    return recorded["sha256"] if recorded else hashlib.sha256(_read_file(paths, MODEL_FILE, config)).hexdigest()


def tokenizer_spec(config: dict) -> tuple[str, dict]:
    """``(name, options)`` of the tokenizer a run's ``config.json`` records (``tokenizer`` or
    ``extra.tokenizer``: a name such as ``"byte"`` or ``{"name": ..., **options}``); ``"byte"`` if none."""
    extra = config.get("extra") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"config.json 'extra' must be an object, got {extra!r}")
    tok = config.get("tokenizer") or extra.get("tokenizer") or "byte"
    if isinstance(tok, str):
        return tok, {}
    if isinstance(tok, dict) and isinstance(tok.get("name", "byte"), str):
        options = dict(tok)
        return options.pop("name", "byte"), options
    raise ValueError(f"config.json extra.tokenizer must be a tokenizer name or an object with a 'name', got {tok!r}")


def lm_config(config: dict) -> LMConfig:
    """The :class:`LMConfig` part of a ``config.json`` dict."""
    try:
        return LMConfig.from_dict({k: config[k] for k in _LM_FIELDS if k in config})
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"config.json holds an invalid model config: {exc}") from None


def _read_file(paths: dict[str, Path], name: str, config: dict) -> bytes:
    path = paths.get(name) or paths[MODEL_FILE].parent / name
    if not path.is_file():
        raise ValueError(_fix(path, "is missing"))
    data = path.read_bytes()
    expected = config.get("checkpoint", {}).get("files", {}).get(name)
    if expected is not None:
        if len(data) != expected["bytes"]:
            raise ValueError(_fix(path, f"has {len(data)} bytes but config.json recorded {expected['bytes']} "
                                        f"(truncated or from another save)"))
        if hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise ValueError(_fix(path, "does not match the sha256 recorded in config.json (corrupt)"))
    return data


def _load_tensors(paths: dict[str, Path], name: str, config: dict) -> dict[str, torch.Tensor]:
    data = _read_file(paths, name, config)
    try:
        return st_load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(_fix(paths.get(name) or paths[MODEL_FILE].parent / name,
                              f"is not a readable safetensors file ({exc})")) from None


def _state_meta(paths: dict[str, Path], config: dict) -> dict:
    raw = _read_file(paths, STATE_JSON, config)
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(_fix(paths[STATE_JSON], f"is not valid JSON ({exc})")) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("train_state", {}), dict):
        raise ValueError(_fix(paths[STATE_JSON], "does not hold a train_state object"))
    return meta


_OLD_MLP = re.compile(r"blocks\.\d+\.mlp\.\d+\.")  # nn.Sequential(Linear, GELU, Linear) of posenc < SwiGLU


def _check_architecture(weights: dict, path: Path) -> None:
    """A checkpoint of the GELU-MLP TinyLM (keys ``blocks.<i>.mlp.0.weight`` ...) cannot be read by the
    Llama-style TinyLM (SwiGLU ``gate_proj``/``up_proj``/``down_proj``, no biases): say so, instead of
    the state-dict error listing every key."""
    old = sorted(k for k in weights if _OLD_MLP.match(k))
    if old:
        raise ValueError(f"{path} was written by an older posenc whose TinyLM had a GELU MLP with biases "
                         f"({old[0]}, ...); TinyLM's MLP is now Llama's SwiGLU (gate_proj, up_proj, down_proj, "
                         f"no biases), so these weights do not load: train the run again with this version")


def load_model(run_dir, *, device: str | torch.device = "cpu", scheme=None) -> TinyLM:
    """The :class:`TinyLM` saved in ``run_dir`` (in ``eval()`` mode). With ``scheme`` (a
    PositionScheme) the weights are loaded under that scheme instead of the saved one."""
    config, paths = checkpoint_files(run_dir)
    cfg = lm_config(config)
    weights = _load_tensors(paths, MODEL_FILE, config)
    _check_architecture(weights, paths[MODEL_FILE])
    model = TinyLM(cfg)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ValueError(_fix(paths[MODEL_FILE], f"does not fit the model in config.json ({exc})")) from None
    if scheme is not None:
        model = model.with_scheme(scheme)
    return model.to(device).eval()


def load_run(run_dir, *, device: str | torch.device = "cpu") -> tuple[TinyLM, object]:
    """``(model, tokenizer)`` of a run: :func:`load_model` and the tokenizer ``config.json`` records
    (:func:`tokenizer_spec`; a relative ``path`` option is read inside ``run_dir``)."""
    from posenc.data.tokenizer import make_tokenizer

    model = load_model(run_dir, device=device)
    name, options = tokenizer_spec(read_config(run_dir))
    if isinstance(options.get("path"), str) and not Path(options["path"]).is_absolute():
        options["path"] = str(Path(run_dir) / options["path"])
    return model, make_tokenizer(name, **options)


def load_checkpoint(run_dir, model: TinyLM | None = None, optimizer=None, *, restore_rng: bool = True,
                    device: str | torch.device = "cpu") -> dict:
    """Load a run: returns ``{"model", "config" (LMConfig), "meta" (config.json dict), "train_state"}``.

    With ``model`` given, its weights are loaded in place (it must have the saved architecture);
    with ``optimizer`` given, its state is restored; with ``restore_rng`` the torch RNG states too.
    """
    config, paths = checkpoint_files(run_dir)
    cfg = lm_config(config)
    weights = _load_tensors(paths, MODEL_FILE, config)
    _check_architecture(weights, paths[MODEL_FILE])
    target = getattr(model, "module", model) if model is not None else TinyLM(cfg)
    try:
        target.load_state_dict(weights)
    except RuntimeError as exc:
        raise ValueError(_fix(paths[MODEL_FILE], f"does not fit the model ({exc})")) from None
    if model is None:
        target = target.to(device)
    train_state: dict = {}
    if STATE_JSON in paths:
        meta = _state_meta(paths, config)
        train_state = meta.get("train_state", {})
        tensors = _load_tensors(paths, STATE_FILE, config)
        if optimizer is not None:
            if meta.get("optimizer") is None:
                raise ValueError(f"{paths[STATE_JSON]} holds no optimizer state; cannot resume the optimizer")
            _check_optimizer(optimizer, meta["optimizer"], paths[STATE_JSON])
            optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
        if restore_rng:
            set_rng_states(tensors)
    return {"model": target, "config": cfg, "meta": config, "train_state": train_state}
