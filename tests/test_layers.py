"""The layers of the package, checked on its source."""

from __future__ import annotations

import re
from pathlib import Path

import posenc

PACKAGE = Path(posenc.__file__).resolve().parent
# any use of argparse: importing it, or the parser calls a module would make with it
ARGPARSE_USE = re.compile(r"\bargparse\b|\.add_argument\(|\.add_parser\(|\badd_subparsers\(")


def test_argparse_only_under_cli():
    """The command line lives in posenc/cli/; the library modules take plain keyword arguments."""
    cli = PACKAGE / "cli"
    sources = sorted(PACKAGE.rglob("*.py"))
    assert PACKAGE / "__init__.py" in sources and PACKAGE / "scheme.py" in sources  # it scans the library
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
                 for path in sources if cli not in path.parents
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if ARGPARSE_USE.search(line)]
    assert not offenders, "argparse outside posenc/cli/:\n" + "\n".join(offenders)
