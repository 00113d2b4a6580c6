"""Running the command line in-process for the CLI tests: the status code and what it printed to stderr, and the
check that an error is one line."""

from __future__ import annotations

from posenc import cli


def run_cli(argv, capsys) -> tuple[int, str]:
    """``posenc ARGV`` in this process: ``(status, stderr)`` without INFO progress lines and old spellings' one-line
    warnings."""
    rc = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith(("[posenc]", "posenc: warning: "))]
    return rc, "\n".join(lines)


def assert_one_line_error(rc, err, match):
    """A user error: status 2, one line ``posenc: error: ...`` holding ``match``, no traceback."""
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("posenc: error: "), err
    assert "Traceback" not in err
    assert match in err, err
