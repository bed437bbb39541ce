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


# --- the launchers by name (``lnexp atlas --launcher NAME``) ---------------------------------------

LAUNCHERS: dict[str, Callable[..., Launcher]] = {}  # name -> the class (or factory) that makes one
# where each launcher is defined: imported by make() only, so that `lnexp atlas --help` stays light
MODULES = {"worker": "lnexp.atlas.worker", "submitit_local": "lnexp.atlas.cluster",
           "submitit_slurm": "lnexp.atlas.cluster"}


def register(name: str) -> Callable[[Callable[..., Launcher]], Callable[..., Launcher]]:
    """Class decorator: the launcher answers to ``name``."""

    def add(factory: Callable[..., Launcher]) -> Callable[..., Launcher]:
        LAUNCHERS[name] = factory
        return factory

    return add


def make(name: str, **options: object) -> Launcher:
    """The launcher called ``name``, made with ``options``; a one-line error naming the choices."""
    import importlib

    from lnexp.errors import UserError

    if name in MODULES:
        importlib.import_module(MODULES[name])
    if name not in LAUNCHERS:
        raise UserError(f"--launcher {name}: use one of {', '.join(sorted({*LAUNCHERS, *MODULES}))}")
    return LAUNCHERS[name](**options)


def named_in(overrides: list[str]) -> str | None:
    """The launcher that ``hydra/launcher=submitit_slurm`` (or ``submitit_local``) among the atlas's
    overrides asks for, as Hydra's own multirun would read it; None if they name none. (So that
    ``lnexp atlas hydra/launcher=submitit_slurm hydra.launcher.partition=gpu`` means
    ``--launcher submitit_slurm``: issue 43 names both spellings.)"""
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "hydra/launcher" and value.startswith("submitit_") and value in MODULES:
            return value
    return None
