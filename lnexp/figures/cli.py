"""``lnexp figure NAME [options]``: draw one paper figure (each module has its own options)."""

from __future__ import annotations

import importlib
import sys

FIGURES = {
    "fig2": "warm-up ablation with Post-LN (Xiong et al. Fig. 2), from finished runs",
    "fig3": "gradient norms at initialisation (Fig. 3); measures, no training runs needed",
    "fig4": "convergence speed, Pre-LN without warm-up vs Post-LN (Fig. 4), from finished runs",
    "atlas": "stability atlas: placement x peak lr x warm-up (x dt), trained/stalled/diverged",
    "theory": "the paper's lemmas and hidden-state growth at initialisation",
    "report": "report/README.md: every figure and claim-by-claim table",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: lnexp figure {" + ",".join(FIGURES) + "} [--help]\n")
        for name, help_ in FIGURES.items():
            print(f"  {name:<7} {help_}")
        return 0
    name = argv[0]
    if name not in FIGURES:
        print(f"lnexp figure: unknown figure {name!r}; use one of {', '.join(FIGURES)}",
              file=sys.stderr)
        return 2
    return int(importlib.import_module(f"lnexp.figures.{name}").main(argv[1:]) or 0)
