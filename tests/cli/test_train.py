"""``posenc train``: a missing corpus writes nothing, a mistyped scheme is refused, odd settings warn with the flag
names, the training options are flags, SIGTERM prints one line and exits 143."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from posenc import cli
from posenc.models import checkpoint as C
from tests.support.cli import assert_one_line_error, run_cli
from tests.training.test_train import tiny  # noqa: F401  (the fixture)


def test_train_with_a_missing_corpus_writes_nothing(tmp_path, capsys):
    rc, err = run_cli(["train", "--out", tmp_path / "a" / "run", "--corpus", tmp_path / "no.txt", "--steps", "1"],
                      capsys)
    assert_one_line_error(rc, err, "unknown corpus")
    assert not (tmp_path / "a").exists()


def test_train_with_a_mistyped_scheme_json_is_refused(tmp_path, capsys):
    scheme = tmp_path / "scheme.json"
    scheme.write_text(json.dumps({"name": "x", "rope": {}, "logn": "no", "train_len": 64}))
    rc, err = run_cli(["train", "--out", tmp_path / "run", "--scheme", scheme], capsys)
    assert_one_line_error(rc, err, "logn must be true or false, got 'no'")
    assert not (tmp_path / "run").exists()


def test_posenc_train_warns_with_flag_names(tmp_path, capsys):
    rc = cli.main(["train", "--out", str(tmp_path / "r"), "--steps", "4", "--warmup", "3",
                   "--corpus", str(tmp_path / "none.txt")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "posenc: warning: --warmup (3) is more than half of --steps (4)" in err, err
    assert "TrainConfig" not in err

ROOT = Path(__file__).resolve().parents[2]


def test_cli_train_on_sigterm_prints_one_line_and_exits_143(corpus, tmp_path):
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "posenc", "train", "--out", str(out), "--corpus", corpus,
                             "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--train-len", "32", "--batch-size",
                             "4", "--steps", "100000", "--save-every", "0"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "train rope" not in seen:  # tqdm's bar: the loop runs
            seen += proc.stderr.read(1)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out_text, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 143 and out_text == "", err[-2000:]
    last = err.strip().splitlines()[-1].split("\r")[-1]
    assert "Traceback" not in err and last.startswith("posenc: interrupted by SIGTERM at step ") and \
        last.endswith(f"saved a checkpoint in {out}; run the same command again to resume from it"), err[-2000:]
    step = int(last.split("at step ")[1].split(" ")[0])
    assert C.read_train_state(out)["step"] == step > 0


def test_cli_train_has_the_training_options():
    from posenc.cli import build_parser

    args = build_parser({"train"}).parse_args(["train", "--out", "o", "--positions", "pose", "--position-range",
                                               "512", "--pose-chunks", "3", "--s2-groups", "4"])
    assert (args.positions, args.position_range, args.pose_chunks, args.s2_groups) == ("pose", 512, 3, 4)
