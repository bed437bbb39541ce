"""The figures, found rather than listed: every module of lnexp/figures with a ``FIGURE`` (a
:class:`lnexp.figures.figure.Figure`) is one, in its report order; ``lnexp figure`` and the report
read them from here, so a new figure is its module, its experiment YAMLs and a Makefile line.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from lnexp.figures.figure import Figure


@cache
def figures() -> dict[str, Figure]:
    import lnexp.figures as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        figure = getattr(importlib.import_module(f"lnexp.figures.{info.name}"), "FIGURE", None)
        if isinstance(figure, Figure):
            found.append(figure)
    return {f.name: f for f in sorted(found, key=lambda f: (f.order, f.name))}
