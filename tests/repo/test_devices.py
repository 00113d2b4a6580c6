"""Device-agnostic code, tested on the CPU: the layers above the attention engine run their
device-parameterised paths with ``device="cpu"`` under :class:`StrictDevice`, and every tensor they make must
say where it goes.

Why not simply ``with torch.device("meta"):`` around the call (inputs and model on the CPU, so that a factory call
without ``device=`` makes a meta tensor and mixing it with the CPU tensors raises)? Tried first; it gives false
alarms in code below the layers this test guards, where a host tensor is the design: posenc's frequency tables
(``posenc/parts/frequencies.py`` builds ``inv_freq`` in float64 on the host and checks it with ``.item()``, which
a meta tensor cannot answer; the engine moves the table to the query's device) and the sinks backend's memoised
host-side check of a window band (``posenc/engine/backends/sinks.py``: a Python bool, never mixed with the
activations). It also misses some mixes: indexing a CPU tensor with a meta index returns a CPU tensor.

So :class:`StrictDevice` is a :class:`~torch.overrides.TorchFunctionMode` that applies the meta trick only where
it is meant: a factory call (``torch.arange``, ``zeros``, ``ones``, ``full``, ``tensor``, ``as_tensor`` of a
list, ``empty``, ``eye``, ``linspace``, ``randn``, ... : torch's own list, ``torch.utils._device``) made directly
from posenc's layers from ``models`` up (``models``, ``lab``, ``analysis``, ``hf``, ``tune``, ``cli``) without a
``device=`` and without a default device set by the caller (``with torch.device(...)``) is *recorded* with its
file and line, and *made on "meta"*, so that mixing it with the model's tensors raises there and then. Calls from
torch, transformers, the engine and the parts pass through; every factory call that leaves its device to the
default is also checked to land on the requested device. Each test then asserts that nothing was recorded, that
nothing landed elsewhere, and that the result equals the same run made normally. Run on a machine with CUDA, the
same tests also run with ``device="cuda"``, where a forgotten ``device=`` lands on the CPU and is reported the
same way.

Not seen by the mode: ``torch.Generator()`` without a device (a class, not a torch function) and numpy round
trips (``torch.from_numpy`` has no device); the code these tests run has none (grep), and the generator of
``posenc.hf.layers`` is named ``device="cpu"`` on purpose (the same probe on every device).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.utils._device as torch_device
import transformers
from torch.overrides import TorchFunctionMode

import posenc

PKG = Path(posenc.__file__).resolve().parent
GUARDED = tuple(str(PKG / layer) + os.sep for layer in ("models", "lab", "analysis", "hf", "tune", "cli"))
TORCH_DIR = str(Path(torch.__file__).resolve().parent) + os.sep
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _caller() -> str:
    """``file:line`` of the code that called the torch function (torch's own frames skipped)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(TORCH_DIR):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "?"


class StrictDevice(TorchFunctionMode):
    """Within the block, a factory call from posenc's guarded layers without ``device=`` (and without a default
    device set by the caller) is recorded in :attr:`missing` and made on ``"meta"``; any factory call that leaves
    its device to the default and lands elsewhere than ``device`` is recorded in :attr:`elsewhere` (module
    docstring)."""

    def __init__(self, device="cpu"):
        super().__init__()
        self.device = torch.device(device)
        self.missing: list[str] = []
        self.elsewhere: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func not in torch_device._device_constructors() or (args and isinstance(args[0], torch.Tensor)):
            return func(*args, **kwargs)  # not a factory, or one that follows the tensor it is given
        chosen = kwargs.get("device") is not None or torch_device.CURRENT_DEVICE is not None
        where = _caller()
        if not chosen and where.startswith(GUARDED):
            self.missing.append(f"{where.removeprefix(str(PKG.parent) + os.sep)}: torch.{func.__name__}")
            kwargs["device"] = "meta"
        out = func(*args, **kwargs)
        if not chosen and isinstance(out, torch.Tensor) and out.device.type != self.device.type:
            self.elsewhere.append(f"{where}: torch.{func.__name__} -> {out.device}")
        return out

    def check(self) -> None:
        """``AssertionError`` naming every recorded call."""
        assert not self.missing, f"factory calls without device= (made on meta): {sorted(set(self.missing))}"
        assert not self.elsewhere, f"tensors made on another device than {self.device}: {sorted(set(self.elsewhere))}"


def strictly(device, fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` under :class:`StrictDevice`; then :meth:`StrictDevice.check` (also when ``fn``
    raised: a meta tensor mixed with the model's raises, and the message should name the call that made it)."""
    mode = StrictDevice(device)
    try:
        with mode:
            out = fn(*args, **kwargs)
    except Exception:
        mode.check()
        raise
    mode.check()
    return out


# ------------------------------------------------------------------------------------------ the mode itself
def test_the_mode_records_a_guarded_call_without_a_device_and_passes_the_others():
    """A device-less factory call in a file of ``posenc/hf`` is recorded and made on meta, so adding it to a CPU
    tensor raises; the same call with ``device=`` or from outside the guarded layers passes."""
    scope = {"torch": torch}
    exec(compile("def bad(x):\n    return x + torch.arange(3)\n"
                 "def good(x):\n    return x + torch.arange(3, device=x.device)\n",
                 str(PKG / "hf" / "_probe.py"), "exec"), scope)
    x = torch.zeros(3)
    with pytest.raises(AssertionError, match=r"posenc/hf/_probe\.py:2: torch\.arange"):
        strictly("cpu", scope["bad"], x)
    assert torch.equal(strictly("cpu", scope["good"], x), torch.arange(3.0))
    assert torch.equal(strictly("cpu", lambda: x + torch.arange(3)), torch.arange(3.0))  # this file: not guarded
    mode = StrictDevice("cuda")  # a default-device call that lands on the CPU when CUDA was asked for
    with mode:
        torch.ones(2)
    assert mode.elsewhere and not mode.missing


# ----------------------------------------------------------------------------------- posenc.hf.extend + HF
L = 64


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=L)
    return transformers.LlamaForCausalLM(cfg)


def _qwen2():
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=L)
    return transformers.Qwen2ForCausalLM(cfg)


@pytest.fixture(scope="module")
def weights():
    """One random state per family, so the strict and the normal run load the same model."""
    torch.manual_seed(0)
    return {"llama": _llama().state_dict(), "qwen2": _qwen2().state_dict()}


def _model(family, weights, device):
    model = {"llama": _llama, "qwen2": _qwen2}[family]()
    model.load_state_dict(weights[family])
    return model.to(device).eval()


def _prompt(device):
    """A left-padded batch past the trained length: row 0 has 5 padding tokens."""
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(1, 260, (2, L + 16), generator=g, device="cpu")
    mask = torch.ones_like(ids)
    ids[0, :5], mask[0, :5] = 0, 0
    return ids.to(device), mask.to(device)


def _forward_and_generate(model, method, params, ids, mask):
    from posenc.hf.patch import extend

    extend(model, method, **params)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        new = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    return logits, new


METHODS = [("yarn", {"factor": 4.0}), ("yarn", {"factor": 4.0, "native": False}), ("selfextend", {"group": 4,
           "window": 16}), ("rerope", {"window": 16}), ("dca", {}), ("string", {}),
           ("streaming_llm", {"window": 16, "n_sinks": 2}), ("ntk", {"factor": 4.0}), ("dynamic_yarn", {})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method, params", METHODS, ids=[f"{m}{'-engine' if 'native' in p else ''}"
                                                         for m, p in METHODS])
def test_extend_forward_and_cached_generate_make_nothing_off_device(weights, device, method, params):
    """``extend`` (its layout probe included), a padded forward and HF ``generate`` with its cache, the first
    forward (where the engine builds what it caches per layer) under the strict mode; the same as a normal run."""
    ids, mask = _prompt(device)
    got = strictly(device, _forward_and_generate, _model("llama", weights, device), method, params, ids, mask)
    want = _forward_and_generate(_model("llama", weights, device), method, params, ids, mask)
    assert got[0].device == ids.device and got[1].device == ids.device
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("method, params", [("yarn", {"factor": 4.0}), ("selfextend", {"group": 4, "window": 16})])
def test_extend_on_qwen2_makes_nothing_off_device(weights, method, params):
    ids, mask = _prompt("cpu")
    got = strictly("cpu", _forward_and_generate, _model("qwen2", weights, "cpu"), method, params, ids, mask)
    want = _forward_and_generate(_model("qwen2", weights, "cpu"), method, params, ids, mask)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert torch.equal(got[1], want[1])


# -------------------------------------------------------------------------------- posenc's generate (TinyLM)
def _tiny_lm(device):
    from posenc.models.tinylm import LMConfig, TinyLM
    from posenc.scheme.core import PositionScheme

    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                   scheme=PositionScheme.preset("rope", train_len=32), train_len=32)
    return TinyLM(cfg).to(device).eval()


def _decode(model, method, params, ids, mask):
    from posenc.models.generation import generate, stream_tokens

    m = model.with_scheme(method, **params)
    greedy = generate(m, ids, 6, attention_mask=mask)
    sampled = generate(m, ids, 6, attention_mask=mask, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    stream = model.with_scheme("streaming_llm", window=8, n_sinks=2)
    losses = list(stream_tokens(stream, ids[1].tolist(), chunk=7))
    return greedy, sampled, torch.tensor(losses, dtype=torch.float64, device="cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method, params", [("yarn", {"factor": 4.0}), ("selfextend", {"group": 4, "window": 8})])
def test_posenc_generate_with_the_cache_makes_nothing_off_device(device, method, params):
    """``with_scheme``, greedy and seeded sampling over a left-padded batch with the KV cache, and a stream
    through StreamingLLM's bounded cache."""
    model = _tiny_lm(device)
    g = torch.Generator(device="cpu").manual_seed(2)
    ids = torch.randint(0, 64, (2, 40), generator=g, device="cpu").to(device)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    got = strictly(device, _decode, model, method, params, ids, mask)
    want = _decode(model, method, params, ids, mask)
    assert got[0].device == ids.device and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------------------------------- the suite and tune
N = 512  # a suite cell at 512 tokens of a model trained at 256


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama folder with the byte tokenizer saved as its own (as in tests/evals/suite/test_grid.py)."""
    from posenc.hf.export import byte_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=N // 2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


_TIMES = ("prefill_s", "decode_s", "seconds", "loadavg", "peak_rss_mb", "gflops")


def _untimed(value: dict) -> dict:
    return {k: v for k, v in value.items() if k not in _TIMES}


@pytest.mark.parametrize("device", DEVICES)
def test_a_suite_run_makes_nothing_off_device(tiny, tmp_path, device):
    """``run_suite`` (model facts, a fresh extended model per row, one prefill and its answers per cell, results
    and report) on ``device``: its cells equal the cells computed the normal way."""
    from posenc.evals.suite import ContextSpec, SuitePreset, run_suite
    from posenc.evals.suite.runner import run_cells
    from posenc.evals.suite.spec import load_facts
    from posenc.runtime.cells import CellStore

    preset = SuitePreset(name="devices", description="test", model=str(tiny), lengths=(N,), reference_length=N,
                         methods=("none", "rerope"), contexts=(ContextSpec("noise", ("passkey",)),))
    res = strictly(device, run_suite, preset, tmp_path / "strict", progress=False, log=lambda m: None, device=device)
    dtype = "float32" if device == "cpu" else "bfloat16"  # "auto"
    assert (res["meta"]["device"], res["meta"]["dtype"], res["meta"]["cells"]) == (device, dtype, 2)
    m = load_facts(preset.model, device)
    run_cells(preset, m, CellStore(tmp_path / "normal"), progress=False, log=lambda m: None,
              pruned=lambda *a, **k: None)
    got, want = CellStore(tmp_path / "strict" / "cells"), CellStore(tmp_path / "normal")
    assert len(got) == len(want) == 2
    for key, value in want.items():
        assert _untimed(got.get(key)) == _untimed(value)


@pytest.mark.parametrize("device", DEVICES)
def test_a_tune_evaluation_makes_nothing_off_device(tiny, tmp_path, device):
    """One candidate of ``posenc tune`` (the model loaded on ``device``, extended, a book context prefilled and
    scored, unextended): the same row and cells as a normal evaluation."""
    from posenc.evals.tune.objective import TuneObjective

    def evaluate(folder):
        obj = TuneObjective(str(tiny), N, folder, (("book", "passkey", 0),), target=16, device=device)
        return obj.evaluate("yarn", {"factor": 2.0}), obj

    got, obj = strictly(device, evaluate, tmp_path / "strict")
    want, _ = evaluate(tmp_path / "normal")
    assert obj.forwards == 1 and next(obj._model.parameters()).device.type == device
    assert _untimed(got) == _untimed(want) and got["loss"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_duo_calibration_makes_nothing_off_device(tiny, device):
    """The suite's DuoAttention calibration (a forward through the engine, the calls recorded and replayed):
    its input on the model's device, the same heads as a normal calibration."""
    from posenc.evals.suite.calibration import duo_streaming
    from posenc.evals.suite.spec import load_facts

    m = load_facts(str(tiny), device, "float32")
    got = strictly(device, duo_streaming, m, None, N)
    assert got == duo_streaming(m, None, N) and len(got) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_evaluate_hf_makes_nothing_off_device(tiny, device):
    """``posenc eval`` on a Hugging Face model: target-token losses over windows and a pass-key trial."""
    from posenc.evals.pretrained import evaluate_hf

    tokens = [3 + (i * 7) % 250 for i in range(N + 64)]
    kw = dict(tokens=tokens, lengths=(N // 2, N), methods=("none", "selfextend"), target=16, max_windows=2,
              passkey_trials=1, device=device, dtype="float32")
    got = strictly(device, evaluate_hf, str(tiny), **kw)
    want = evaluate_hf(str(tiny), **kw)
    assert [r["status"] for r in got] == ["ok"] * 4 and got == want
