"""The shared grammar (posenc/cli/_common.py): a method's parameters checked from the registry's records before a
model is loaded, in one line naming the flag and the method as the user typed them, with nothing written."""

from __future__ import annotations

import pytest

from posenc.cli._common import check_method_flags
from tests.support.cli import assert_one_line_error, run_cli

OUT = "/nonexistent/posenc-extended"


@pytest.mark.parametrize("argv, message", [
    (["--method", "yarn", "--factor", "0.5"], "--factor 0.5 is out of range for yarn: its factor must be >= 1"),
    (["--method", "pi", "--factor", "0.5"], "--factor 0.5 is out of range for pi: its factor must be >= 1"),
    (["--method", "linear", "--factor", "0.5"], "--factor 0.5 is out of range for linear"),
    (["--method", "pi"], "--method pi needs --factor F or --length N (pi's factor has no default)"),
    (["--method", "ntk"], "--method ntk needs --factor F or --param alpha=VALUE or --length N"),
    (["--method", "rerope", "--window", "0"], "--window 0 is out of range for rerope: its window must be integer >= 1"),
    (["--method", "selfextend+logn", "--param", "group=0"], "--param group=0 is out of range for selfextend"),
    (["--method", "longrope"], "--method longrope needs --param short_factor=VALUE (longrope's short_factor"),
])
def test_extend_names_the_flag_and_the_method_as_typed(argv, message, capsys):
    """The user's command on the bundled model: refused before the model is loaded, --out never created."""
    rc, err = run_cli(["extend", "smollm2", *argv, "--out", OUT], capsys)
    assert_one_line_error(rc, err, message)
    assert "scaling[" not in err and "method 'linear' needs" not in err
    assert not __import__("pathlib").Path(OUT).exists()


def test_a_length_supplies_what_a_method_derives_from_it():
    check_method_flags("pi", {}, hf=True, length=16384, length_flag="--length N")
    check_method_flags("yarn", {"factor": 4.0}, hf=True)
    check_method_flags("ntk", {"alpha": 2.0}, hf=True)
    check_method_flags(None, {"factor": 0.5})  # no method: nothing to check here
    with pytest.raises(ValueError, match="--method longrope needs --param short_factor=VALUE"):
        check_method_flags("longrope", {}, hf=True, length=16384, length_flag="--length N")  # no length rule
    with pytest.raises(ValueError, match=r"--method pi needs --factor F \("):
        check_method_flags("pi", {}, hf=True)


def test_a_parameter_is_checked_against_the_method_it_goes_to():
    """In ``a+b`` a parameter goes to the first method that takes it: its range is that method's."""
    check_method_flags("selfextend+rerope", {"window": 8}, hf=True)
    with pytest.raises(ValueError, match="out of range for selfextend"):
        check_method_flags("selfextend+rerope", {"window": 0}, hf=True)
