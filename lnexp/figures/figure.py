"""A figure's registration, in one place: its name, its ``lnexp figure`` help line, its section of
the report, the experiments it draws and what the report shows beside its checks. Each figure
module holds one (``FIGURE``); :mod:`lnexp.figures.registry` finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _none(scale: str) -> list[str]:
    return []


@dataclass(frozen=True)
class Figure:
    """``order``: its place in the report; ``title``: its section there (README's claims block uses
    the words before " (" and before ":"); ``experiments(scale)``: the experiment configs whose runs
    it draws (none: it measures models itself); ``images``: figures it draws beside NAME.png;
    ``summary_columns``: the NAME_summary.csv columns the report tabulates (None: the run
    figures' columns); ``tables``: Markdown files it writes that the report shows as they are."""

    name: str
    help: str
    title: str
    order: int
    experiments: Callable[[str], list[str]] = _none
    images: tuple[str, ...] = ()
    summary_columns: tuple[str, ...] | None = None
    tables: tuple[str, ...] = ()
