"""posenc.models.checkpoint: the commit protocol (a kill between any two renames leaves the previous or the new
checkpoint loadable, resuming after it gives the uninterrupted run bit for bit, stale temp files go, a damaged
config.json or a full disk is a ValueError/OSError naming the file), the files and config of a run, damaged and
old checkpoints refused with clear errors, the optimizer check and the tokenizer spec."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posenc.models import checkpoint as C
from posenc.models import checkpoint as ckpt
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.runtime.lock import LOCK_NAME
from posenc.scheme.core import PositionScheme
from posenc.training.train import TrainConfig, train
from tests.training.test_train import params_of  # noqa: F401 - corpus is a fixture

ROOT = Path(__file__).resolve().parents[2]

N_RENAMES = 8  # 4 files staged into .pending/ (config.json last: the commit point), then 4 moved into the folder


class Killed(BaseException):
    """Stands for SIGKILL: nothing runs after it in the commit (no cleanup), like a real kill."""


def _stopping_os(at: int):
    """A stand-in for the ``os`` module of posenc.models.checkpoint whose ``replace`` raises :class:`Killed`
    instead of doing rename number ``at`` (1-based; ``N_RENAMES + 1``: after the last one, before the
    staging folder is removed)."""
    calls = []

    def replace_(src, dst):
        calls.append((Path(src).name, Path(dst).parent.name))
        if len(calls) == at:
            raise Killed(f"before rename {at}: {calls[-1]}")
        os.replace(src, dst)

    def fsync_or_kill(*a, **kw):
        if len(calls) == N_RENAMES and at == N_RENAMES + 1:
            raise Killed("after the last rename")
        return None

    fake = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    fake.replace = replace_
    return fake, calls, fsync_or_kill


@pytest.fixture
def runs(corpus, tmp_path):
    """``(cfg, make)``: the uninterrupted run of ``cfg`` (6 steps, a checkpoint every 3), and ``make(name)``,
    which gives a folder holding the same run's checkpoint at step 3 (the previous checkpoint)."""
    cfg = tiny(corpus, tmp_path / "full", steps=6, save_every=3)
    train(cfg, progress=False)
    prev = tmp_path / "prev"

    def stop_at_4(step, loss):
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        train(replace(cfg, out_dir=str(prev)), progress=False, on_step=stop_at_4)
    assert C.read_train_state(prev)["step"] == 3

    def make(name: str):
        shutil.copytree(prev, tmp_path / name)
        return replace(cfg, out_dir=str(tmp_path / name))

    return cfg, make


@pytest.mark.parametrize("at", range(1, N_RENAMES + 2))
def test_a_kill_at_each_rename_of_a_commit_leaves_a_loadable_checkpoint_and_resume_is_exact(runs, monkeypatch, at):
    cfg, make = runs
    run = make(f"killed{at}")
    fake, calls, fsync = _stopping_os(at)
    monkeypatch.setattr(C, "os", fake)
    monkeypatch.setattr(C, "fsync_dir", fsync)
    with pytest.raises(Killed):
        train(run, progress=False)  # resumes at step 3; the commit of step 6 (finished) is killed
    monkeypatch.undo()
    # the previous checkpoint (step 3) until the new one is staged complete, the new one (step 6) after
    state = C.load_checkpoint(run.out_dir, restore_rng=False)["train_state"]
    assert state["step"] == (3 if at <= 4 else 6), (at, calls)
    assert C.load_model(run.out_dir) is not None
    resumed = train(run, progress=False)  # finishes the commit (or the training) and leaves a clean folder
    assert resumed["steps"] == 6
    assert not (Path(run.out_dir) / C.PENDING).exists()
    assert not list(Path(run.out_dir).glob(".*.tmp"))
    full, got = params_of(cfg.out_dir), params_of(run.out_dir)
    assert all(torch.equal(full[k], got[k]) for k in full)
    assert C.read_train_state(run.out_dir)["history"] == C.read_train_state(cfg.out_dir)["history"]


KILL_CHILD = """
import os, signal, sys
from pathlib import Path
from dataclasses import replace
from posenc.models import checkpoint as C
from posenc.training.train import TrainConfig, train
import json
cfg = TrainConfig(**json.loads(sys.argv[1]))
at = int(sys.argv[2])
import torch
torch.set_num_threads(int(sys.argv[3]))  # the parent's: bit-for-bit equality needs the same reduction order
real, n = os.replace, [0]
def replace_(src, dst):
    n[0] += 1
    if n[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
class OS:  # the checkpoint module's os, with replace counted
    def __getattr__(self, k):
        return getattr(os, k)
o = OS()
o.replace = replace_
C.os = o
train(cfg, progress=False)
"""


@pytest.mark.parametrize("at", [3, 6])
def test_a_real_sigkill_inside_a_commit_leaves_a_loadable_checkpoint(runs, at):
    """The same as above with the process really killed (SIGKILL) before rename ``at``; its lock goes with it.
    The child trains with the parent's torch thread count: at ``at`` = 6 the child commits step 6 and the
    comparison is with the parent's uninterrupted run, which is bit for bit only under the same reduction order
    (with one thread in the child and two here, larger batches differed in the last bits)."""
    cfg, make = runs
    run = make(f"sigkill{at}")
    threads = torch.get_num_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", KILL_CHILD, json.dumps(run.to_dict()), str(at), str(threads)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert C.read_train_state(run.out_dir)["step"] == (3 if at <= 4 else 6)
    assert train(run, progress=False)["steps"] == 6  # the lock died with the process
    full, got = params_of(cfg.out_dir), params_of(run.out_dir)
    assert all(torch.equal(full[k], got[k]) for k in full)


def test_a_kill_while_writing_a_file_leaves_the_previous_checkpoint_and_the_temp_file_is_cleaned(runs, monkeypatch):
    cfg, make = runs
    run = make("torn")
    real = C.write_temp

    def torn(folder, name, data, mode=0o644):
        if name == C.STATE_FILE:  # half written, then killed: the temp file stays behind
            (Path(folder) / f".{name}.abc123.tmp").write_bytes(data[: len(data) // 2])
            raise Killed
        return real(folder, name, data, mode)

    monkeypatch.setattr(C, "write_temp", torn)
    with pytest.raises(Killed):
        train(run, progress=False)
    monkeypatch.undo()
    folder = Path(run.out_dir)
    assert list((folder / C.PENDING).glob(".*.tmp"))  # what a kill leaves
    assert C.read_train_state(folder)["step"] == 3
    (folder / ".model.safetensors.zz9.tmp").write_bytes(b"partial")  # another stale one, in the folder itself
    train(run, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [".posenc.lock", "config.json", "model.safetensors", "train_state.json", "train_state.safetensors"])
    full, got = params_of(cfg.out_dir), params_of(folder)
    assert all(torch.equal(full[k], got[k]) for k in full)


def test_reading_never_changes_an_interrupted_commit(runs, monkeypatch):
    """Loading a folder whose commit stopped half-way reads the new checkpoint from both places and writes
    nothing; only the writer (under the lock) finishes the commit."""
    _, make = runs
    run = make("readonly")
    fake, _, fsync = _stopping_os(6)
    monkeypatch.setattr(C, "os", fake)
    monkeypatch.setattr(C, "fsync_dir", fsync)
    with pytest.raises(Killed):
        train(run, progress=False)
    monkeypatch.undo()
    folder = Path(run.out_dir)
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert C.has_checkpoint(folder) and C.read_config(folder)["extra"]["train"]["steps"] == 6
    C.load_checkpoint(folder, restore_rng=False)
    C.model_digest(folder)
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert C.recover(folder) == [f"finished the interrupted commit of {folder}"]
    assert C.recover(folder) == []


@pytest.mark.parametrize("damage, expect", [
    ({"checkpoint": None}, "damaged 'checkpoint' section"),
    ({"checkpoint": {"files": []}}, "damaged 'checkpoint' section"),
    ({"checkpoint": {"files": {"model.safetensors": {"bytes": "x"}}}}, "damaged 'checkpoint.files' entry"),
    ({"extra": 3}, "'extra' 3, not an object"),
    ({"extra": {"train": None}}, "'extra.train'"),
])
def test_a_damaged_config_json_is_a_value_error_naming_it(corpus, tmp_path, damage, expect):
    cfg = tiny(corpus, tmp_path / "run", steps=2)
    train(cfg, progress=False)
    path = Path(cfg.out_dir) / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **damage}))
    for load in (C.load_model, C.load_checkpoint, C.read_train_state):
        with pytest.raises(ValueError, match=rf"config\.json has .*{expect}"):
            load(cfg.out_dir)
    with pytest.raises(ValueError, match=rf"config\.json has .*{expect}"):
        train(cfg, progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "posenc", "train", "--out", cfg.out_dir, "--corpus", corpus,
                           "--steps", "2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "config.json has" in proc.stderr


def test_a_full_disk_while_saving_names_the_file_and_keeps_the_previous_checkpoint(runs, monkeypatch):
    """ENOSPC simulated at the write of the weights (a real full file system: tests/runtime/test_atomic.py)."""
    _, make = runs
    run = make("nospace")
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd, *a, **kw):
        return Full(real_fdopen(fd, *a, **kw))

    import posenc.runtime.atomic as A

    monkeypatch.setattr(A.os, "fdopen", fdopen)
    with pytest.raises(OSError, match=r"could not write .*\.pending/model\.safetensors: No space left on device"):
        train(run, progress=False)
    monkeypatch.undo()
    assert C.read_train_state(run.out_dir)["step"] == 3
    assert not list(Path(run.out_dir).rglob("*.tmp"))


def test_two_writers_of_one_run_folder(corpus, tmp_path):
    """A second `posenc train` into a folder that a first one is writing gets one line naming the first."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "two"
    hold = textwrap.dedent(f"""
        import sys, time
        from posenc.training import train as T
        real = T._model_and_state
        def slow(*a, **kw):
            print("training", flush=True)
            time.sleep(60)
        T._model_and_state = slow
        T.train(T.TrainConfig(out_dir={str(out)!r}, corpus={corpus!r}, dim=32, n_layers=1, n_heads=2,
                              train_len=32, batch_size=4, steps=2), progress=False)
    """)
    first = subprocess.Popen([sys.executable, "-c", hold], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "training"
        proc = subprocess.run([sys.executable, "-m", "posenc", "train", "--out", str(out), "--corpus", corpus,
                               "--seed", "1", "--steps", "2"], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"run folder '{out}' is in use by another posenc process (pid {first.pid}" in proc.stderr
        assert not C.has_checkpoint(out)
    finally:
        first.kill()
        first.wait()
    cfg = tiny(corpus, out, steps=2)
    assert train(cfg, progress=False)["steps"] == 2  # the killed holder left no stale lock


def test_a_weights_only_save_over_a_full_checkpoint_drops_the_old_train_state(corpus, tmp_path):
    """Files of the previous checkpoint that the new one does not have are not read as part of it."""
    cfg = tiny(corpus, tmp_path / "run", steps=2)
    train(cfg, progress=False)
    model = C.load_model(cfg.out_dir)
    C.save_checkpoint(cfg.out_dir, model, model.cfg)  # weights only
    assert C.read_train_state(cfg.out_dir) == {} and C.load_checkpoint(cfg.out_dir)["train_state"] == {}
    assert not (Path(cfg.out_dir) / C.STATE_JSON).exists()


def test_a_listed_state_file_that_is_missing_is_an_error_not_a_fresh_start(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "run", steps=4, save_every=2)
    with pytest.raises(Killed):
        train(cfg, progress=False, on_step=lambda step, loss: (_ for _ in ()).throw(Killed) if step == 3 else None)
    (Path(cfg.out_dir) / C.STATE_JSON).unlink()
    with pytest.raises(ValueError, match=r"train_state\.json is missing"):
        train(cfg, progress=False)


def tiny(corpus, out_dir, **kw) -> TrainConfig:
    base = dict(out_dir=str(out_dir), corpus=corpus, dim=32, n_layers=1, n_heads=2, train_len=32, batch_size=4,
                steps=6, warmup=2, lr=3e-3, min_lr=3e-4, save_every=3, eval_batches=1, recall_batch=4)
    return TrainConfig(**{**base, **kw})


def test_checkpoint_files_and_config(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "run", steps=2)
    train(cfg, progress=False)
    run = Path(cfg.out_dir)
    assert sorted(p.name for p in run.iterdir()) == sorted(  # no temp files, no staging folder
        [LOCK_NAME, "config.json", "model.safetensors", "train_state.json", "train_state.safetensors"])
    meta = json.loads((run / "config.json").read_text())
    assert meta["dim"] == 32 and meta["scheme"]["name"] == "rope" and meta["posenc_version"]
    assert meta["extra"]["tokenizer"]["name"] == "byte" and meta["extra"]["train"]["steps"] == 2
    out = C.load_checkpoint(run, restore_rng=False)
    assert out["config"].train_len == 32 and out["train_state"]["finished"]
    x = torch.randint(0, 257, (1, 16))
    torch.testing.assert_close(C.load_model(run)(x), out["model"].eval()(x))


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir()}


def test_corrupt_checkpoints_raise_clear_errors_and_keep_files(corpus, tmp_path):
    cfg = tiny(corpus, tmp_path / "run", steps=2)
    train(cfg, progress=False)
    run = Path(cfg.out_dir)
    good = _snapshot(run)
    # truncated weights
    (run / "model.safetensors").write_bytes(good["model.safetensors"][:1000])
    before = _snapshot(run)
    with pytest.raises(ValueError, match=r"model\.safetensors.*(truncated|bytes).*train again"):
        C.load_model(run)
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        train(cfg, progress=False)
    assert _snapshot(run) == before  # nothing deleted or rewritten
    # corrupt config.json
    (run / "model.safetensors").write_bytes(good["model.safetensors"])
    (run / "config.json").write_bytes(good["config.json"][:50])
    before = _snapshot(run)
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        C.load_model(run)
    with pytest.raises(ValueError, match=r"config\.json"):
        train(cfg, progress=False)
    assert _snapshot(run) == before
    with pytest.raises(ValueError, match="not a posenc checkpoint"):
        C.load_model(tmp_path / "nowhere")


def test_checkpoint_of_the_gelu_mlp_tinylm_says_the_mlp_changed(tmp_path):
    """A run saved before TinyLM's MLP became Llama's SwiGLU: a ValueError saying so, not a key list."""
    from types import SimpleNamespace

    from posenc.models.tinylm import LMConfig, TinyLM
    from posenc.scheme.core import PositionScheme

    cfg = LMConfig(257, 16, 1, 2, PositionScheme.preset("rope", train_len=16), 16)
    weights = {k: v for k, v in TinyLM(cfg).state_dict().items() if ".mlp." not in k}
    weights.update({"blocks.0.mlp.0.weight": torch.zeros(64, 16), "blocks.0.mlp.0.bias": torch.zeros(64),
                    "blocks.0.mlp.2.weight": torch.zeros(16, 64), "blocks.0.mlp.2.bias": torch.zeros(16)})
    C.save_checkpoint(tmp_path / "old", SimpleNamespace(state_dict=lambda: weights), cfg)
    for load in (C.load_model, C.load_checkpoint):
        with pytest.raises(ValueError, match=r"GELU MLP.*now Llama's SwiGLU.*train the run again"):
            load(tmp_path / "old")

P = PositionScheme


def tiny_lm(scheme=None, vocab=32, dim=16, n_layers=1, seed=0):
    torch.manual_seed(seed)
    scheme = scheme or P.preset("rope", train_len=16)
    return TinyLM(LMConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=2, scheme=scheme,
                           train_len=16)).eval()


# ------------------------------------------------------------------------------------------------ checkpoints
@pytest.fixture()
def run_dir(tmp_path):
    model = tiny_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    ckpt.save_checkpoint(tmp_path / "run", model, model.cfg, {"step": 1}, optimizer=opt,
                         extra={"tokenizer": {"name": "byte", "bos": True}})
    return tmp_path / "run"


def _truncate(run):
    data = (run / ckpt.MODEL_FILE).read_bytes()
    (run / ckpt.MODEL_FILE).write_bytes(data[: len(data) // 2])


def _rename(run):
    (run / ckpt.MODEL_FILE).rename(run / "model.bak")


def _pickle(run):
    torch.save(tiny_lm().state_dict(), run / ckpt.MODEL_FILE)


def _pickle_unrecorded(run):  # no recorded size/hash: the safetensors reader itself must refuse it
    cfg = json.loads((run / ckpt.CONFIG_FILE).read_text())
    cfg.pop("checkpoint", None)
    (run / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))
    _pickle(run)


def _config_typo(run):
    cfg = json.loads((run / ckpt.CONFIG_FILE).read_text())
    cfg["scheme"]["logn"] = "no"
    (run / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))


def _config_truncated(run):
    text = (run / ckpt.CONFIG_FILE).read_text()
    (run / ckpt.CONFIG_FILE).write_text(text[: len(text) // 2])


def _config_renamed(run):
    (run / ckpt.CONFIG_FILE).rename(run / "config.bak")


@pytest.mark.parametrize("damage, match", [
    (_truncate, r"model.safetensors has \d+ bytes but config.json recorded \d+ \(truncated"),
    (_rename, r"model.safetensors is missing"),
    (_pickle, r"model.safetensors has \d+ bytes but config.json recorded|does not match the sha256"),
    (_pickle_unrecorded, r"model.safetensors is not a readable safetensors file"),
    (_config_typo, r"invalid model config: logn must be true or false"),
    (_config_truncated, r"config.json is not valid JSON"),
    (_config_renamed, r"config.json does not exist"),
])
def test_damaged_checkpoints_give_clear_errors(run_dir, damage, match):
    damage(run_dir)
    with pytest.raises(ValueError, match=match):
        ckpt.load_model(run_dir)


def test_resuming_into_another_optimizer_class_is_refused(run_dir):
    model = tiny_lm()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"optimizer torch.optim.adamw.AdamW, not torch.optim.sgd.SGD"):
        ckpt.load_checkpoint(run_dir, model, sgd)
    assert sgd.state_dict()["state"] == {}  # nothing was loaded
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt.load_checkpoint(run_dir, model, adamw)  # the same class resumes
    assert adamw.state_dict()["state"]


def test_optimizer_check_for_checkpoints_without_a_class_record(run_dir):
    meta = json.loads((run_dir / ckpt.STATE_JSON).read_text())
    meta["optimizer"].pop("class")
    data = json.dumps(meta).encode()
    (run_dir / ckpt.STATE_JSON).write_bytes(data)
    cfg = json.loads((run_dir / ckpt.CONFIG_FILE).read_text())
    cfg["checkpoint"]["files"][ckpt.STATE_JSON] = ckpt._digest(data)  # as such a checkpoint recorded it
    (run_dir / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"optimizer hyper-parameters .*another optimizer class"):
        ckpt.load_checkpoint(run_dir, tiny_lm(), torch.optim.SGD(tiny_lm().parameters(), lr=0.1))


@pytest.mark.parametrize("config, expected", [
    ({}, ("byte", {})),
    ({"extra": {"tokenizer": "byte"}}, ("byte", {})),
    ({"extra": {"tokenizer": {"name": "bpe", "path": "t.json"}}}, ("bpe", {"path": "t.json"})),
])
def test_tokenizer_spec_reads_names_and_dicts(config, expected):
    assert ckpt.tokenizer_spec(config) == expected


@pytest.mark.parametrize("config, match", [
    ({"extra": "x"}, r"'extra' must be an object"),
    ({"extra": {"tokenizer": 5}}, r"extra.tokenizer must be a tokenizer name"),
    ({"extra": {"tokenizer": {"name": 5}}}, r"extra.tokenizer must be a tokenizer name"),
])
def test_tokenizer_spec_refuses_malformed_entries(config, match):
    with pytest.raises(ValueError, match=match):
        ckpt.tokenizer_spec(config)


def test_generate_cli_loader_accepts_a_plain_tokenizer_name(run_dir):
    cfg = json.loads((run_dir / ckpt.CONFIG_FILE).read_text())
    cfg["extra"]["tokenizer"] = "byte"
    (run_dir / ckpt.CONFIG_FILE).write_text(json.dumps(cfg))
    model, tok = ckpt.load_run(str(run_dir))
    assert tok.vocab_size == 257 and model.cfg.vocab_size == 32


def test_a_hugging_face_folder_is_not_called_a_damaged_run(tmp_path):
    """A good model handed to the run loader (a Hugging Face folder, one ``posenc extend`` wrote) is named as what it
    is; only a damaged run gets the advice to delete the run folder."""
    from tests.support.tiny_hf import make_model

    make_model("llama").save_pretrained(tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    with pytest.raises(ValueError) as err:
        ckpt.load_run(tmp_path / "hf")
    said = "holds a Hugging Face model (config.json has model_type 'llama'), not a run of `posenc train`"
    assert said in str(err.value)
    assert "delete" not in str(err.value) and "damaged" not in str(err.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == before
