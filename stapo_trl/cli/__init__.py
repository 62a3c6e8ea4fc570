"""The commands `stapo-train` (`train`, `args`, `prepare`, `dry_run`, `run`), `stapo-eval`, `stapo-plot`."""

from __future__ import annotations

import argparse
from importlib import metadata


def version_text(prog: str) -> str:
    """`PROG (stapo_trl X; trl Y, transformers Z, torch W)`."""
    from .. import __version__

    names = ("trl", "transformers", "torch")
    found = [f"{n} {next((d.version for d in metadata.distributions(name=n)), 'not installed')}" for n in names]
    return f"{prog} (stapo_trl {__version__}; {', '.join(found)})"


class VersionAction(argparse.Action):
    """`--version`: [`version_text`] on one line, then exit 0."""

    def __init__(self, option_strings, dest, **kwargs):
        help = "Print the versions of stapo_trl, TRL, transformers and torch, and exit."
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text(parser.prog))
        parser.exit()
