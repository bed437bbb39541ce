"""``lnexp figure NAME [options]``: draw one paper figure (each module has its own options)."""

from __future__ import annotations

import importlib
import sys

from lnexp.exit_status import Exit
from lnexp.figures.registry import figures

REPORT = "report/README.md: every figure and claim-by-claim table"


def main(argv: list[str]) -> int:
    commands = {**{name: f.help for name, f in figures().items()}, "report": REPORT}
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: lnexp figure {" + ",".join(commands) + "} [--help]\n")
        for name, help_ in commands.items():
            print(f"  {name:<7} {help_}")
        return Exit.OK
    name = argv[0]
    if name not in commands:
        print(f"lnexp figure: unknown figure {name!r}; use one of {', '.join(commands)}",
              file=sys.stderr)
        return Exit.BAD_INPUT
    return int(importlib.import_module(f"lnexp.figures.{name}").main(argv[1:]) or 0)
