"""How the atlas's cells are trained: a :class:`Launcher` runs one round of cells and reports each
as it ends.

Why a protocol: the driver's rounds (which cells, within what budget, when to stop) are the same
whether a cell is a ``lnexp train`` process, a cell of a long-lived worker process, or a job of a
SLURM array; only the launching differs, so each way of launching is one class behind this door.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Ended:
    """One cell of a round, ended."""

    index: int  # its position in the round's list of cells
    seconds: float  # wall time from its launch to its end
    status: int  # exit status as lnexp train gives it: 0 ok, 2 user error, 1 crash, 130 interrupted


class Launcher(Protocol):
    """Trains rounds of cells; a cell is the ``lnexp train`` overrides of one run (runs_root and the
    user's overrides included)."""

    name: str

    def run_round(self, cells: list[list[str]], jobs: int, ended: Callable[[Ended], None]) -> None:
        """Train every cell, at most ``jobs`` at once; call ``ended`` in the calling thread as each
        ends; return when all have ended, or promptly after :meth:`stop`."""
        ...

    def stop(self) -> None:
        """Safe to call from a signal handler: queued cells are never started, and running ones stop
        as ``lnexp train`` stops on SIGINT/SIGTERM (status ``interrupted``, work kept)."""
        ...
