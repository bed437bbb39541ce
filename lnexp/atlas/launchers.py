"""How the atlas's cells are trained: a :class:`Launcher` runs one round of cells (each an
:class:`lnexp.atlas.outcomes.Cell`, trained as ``lnexp train`` of its command line,
:meth:`LaunchSetup.command`) and reports each as it ends.

Why a protocol: the driver's rounds (which cells, within what budget, when to stop) are the same
whether a cell is a ``lnexp train`` process, a cell of a long-lived worker process, or a job of a
SLURM array; only the launching differs, so each way of launching is one class behind this door.
``lnexp atlas --launcher NAME`` picks one from :data:`LAUNCHERS`; a launcher in a module of its own
registers itself there (:func:`register`) when the module, listed in :data:`MODULES`, is imported.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lnexp import overrides as override
from lnexp.atlas.grid import experiment_name
from lnexp.atlas.outcomes import Cell
from lnexp.exit_status import Exit, of_process


@dataclass(frozen=True)
class Ended:
    """One cell of a round, ended."""

    index: int  # its position in the round's list of cells
    seconds: float  # wall time from its launch to its end
    # as lnexp train exits (lnexp.exit_status.Exit; INTERRUPTED: stopped by stop()), or 128 + N for
    # a process killed by signal N
    status: int


class Launcher(Protocol):
    """Trains rounds of cells, each as ``lnexp train`` of its :meth:`LaunchSetup.command`."""

    name: str

    def run_round(self, cells: Sequence[Cell], jobs: int, ended: Callable[[Ended], None]) -> None:
        """Train every cell, at most ``jobs`` at once; call ``ended`` in the calling thread as each
        ends; return when all have ended, or promptly after :meth:`stop`."""
        ...

    def stop(self) -> None:
        """Safe to call from a signal handler: queued cells are never started, and running ones stop
        as ``lnexp train`` stops on SIGINT/SIGTERM (status ``interrupted``, work kept)."""
        ...


@dataclass(frozen=True)
class LaunchSetup:
    """What a launcher knows besides its cells: where they run, on which GPUs, and the rest of their
    command line (fields may be added; a factory reads the ones it needs)."""

    runs_root: Path
    scale: str | None = None  # the cells' experiment is atlas_SCALE (None: the cells set none)
    gpus: tuple[str, ...] = ()  # the GPUs the cells may use (their CUDA_VISIBLE_DEVICES ids), round robin
    overrides: tuple[str, ...] = ()  # every cell's, after its own and runs_root: the user's
    settings: tuple[str, ...] = ()  # the launcher's own: a cluster's hydra/launcher=..., hydra.launcher.*

    def command(self, cell: Cell) -> list[str]:
        """The cell's ``lnexp train`` overrides: its own, the runs root, then every cell's."""
        experiment = experiment_name(self.scale) if self.scale else None
        return [*cell.overrides(experiment), f"runs_root={self.runs_root}", *self.overrides]

    def gpu(self, slot: int) -> dict[str, str]:
        """The environment that pins job slot ``slot`` to its GPU (none without GPUs)."""
        return {"CUDA_VISIBLE_DEVICES": self.gpus[slot % len(self.gpus)]} if self.gpus else {}


Factory = Callable[..., Launcher]  # (setup: LaunchSetup, **options) -> Launcher
LAUNCHERS: dict[str, tuple[str, Factory]] = {}  # name -> (help line, factory)
# Modules that register a launcher when imported (a launcher with its own dependencies lives in
# one, so that lnexp atlas imports it only when asked for)
MODULES: tuple[str, ...] = ("lnexp.atlas.worker", "lnexp.atlas.cluster")


def register(name: str, help_line: str, factory: Factory) -> None:
    LAUNCHERS[name] = (help_line, factory)


def names() -> dict[str, str]:
    """{name: help line} of every launcher, those of :data:`MODULES` included, this module's first,
    then in MODULES' order (whichever was imported first)."""
    for module in MODULES:
        try:
            importlib.import_module(module)
        except ImportError as e:  # its dependency (submitit) is not installed: not offered
            if (e.name or "").startswith("lnexp"):
                raise
            continue
    order = (__name__, *MODULES)
    ranked = sorted(LAUNCHERS.items(), key=lambda kv: order.index(kv[1][1].__module__)
                    if kv[1][1].__module__ in order else len(order))
    return {n: h for n, (h, _) in ranked}


def make(name: str, setup: LaunchSetup, **options: object) -> Launcher:
    """The launcher called ``name``, made from ``setup`` and its own ``options``; a one-line error
    naming the choices."""
    from lnexp.errors import UserError

    known = names()
    if name not in known:
        raise UserError(f"--launcher {name}: not a launcher; use one of {', '.join(known)}")
    return LAUNCHERS[name][1](setup, **options)


class ProcessLauncher:
    """One ``python -m lnexp train`` process per cell, ``jobs`` at a time.

    Each process is the leader of its own process group, so that a terminal's Ctrl-C reaches the
    driver alone and :meth:`stop` gives each cell exactly one signal. That signal is SIGTERM: lnexp
    train takes it as Ctrl-C (status ``interrupted``, work kept), and a process still starting, before
    lnexp train's handler is set, ends quietly where a SIGINT would print a KeyboardInterrupt
    traceback. With GPUs, each job slot gets one of them (CUDA_VISIBLE_DEVICES), round robin. The
    round waits by polling (no threads): a signal handler that calls :meth:`stop` runs between two
    polls. ``argv``: the command a cell's overrides follow (``python -m lnexp train``)."""

    name = "process"
    TRAIN = (sys.executable, "-m", "lnexp", "train")
    POLL_S = 0.1
    GRACE_S = 60.0  # after stop: a cell still running this long after its SIGTERM is killed

    def __init__(self, setup: LaunchSetup, argv: list[str] | None = None) -> None:
        self.setup = setup
        self.argv = list(argv or self.TRAIN)
        self._stopping = False
        self._stopped_at = 0.0
        self._running: dict[int, subprocess.Popen] = {}

    def run_round(self, cells: Sequence[Cell], jobs: int, ended: Callable[[Ended], None]) -> None:
        queue = list(enumerate(cells))
        free = list(range(max(jobs, 1)))  # job slots: a slot's GPU is setup.gpu(slot)
        started: dict[int, tuple[float, int]] = {}
        while (queue and not self._stopping) or self._running:
            while queue and free and not self._stopping:
                i, cell = queue.pop(0)
                slot = free.pop(0)
                started[i] = (time.monotonic(), slot)
                env = {**os.environ, **self.setup.gpu(slot)}
                self._running[i] = subprocess.Popen([*self.argv, *self.setup.command(cell)], env=env,
                                                    process_group=0)
                if self._stopping:  # stop() came while it was being started
                    self._signal(self._running[i], signal.SIGTERM)
            for i, p in list(self._running.items()):
                rc = p.poll()
                if rc is None:
                    if self._stopping and time.monotonic() - self._stopped_at > self.GRACE_S:
                        self._signal(p, signal.SIGKILL)
                    continue
                del self._running[i]
                t0, slot = started.pop(i)
                free.append(slot)
                ended(Ended(i, time.monotonic() - t0, self._status(rc)))
            if self._running:
                time.sleep(self.POLL_S)

    def _status(self, rc: int) -> int:
        """A cell's status from its process's return code. Once stopped, any death by signal (an
        abort at exit too, after lnexp train recorded the interruption) is the stop's doing."""
        if self._stopping and (rc < 0 or rc == Exit.INTERRUPTED):
            return Exit.INTERRUPTED
        return of_process(rc)

    def stop(self) -> None:
        if not self._stopping:
            self._stopping, self._stopped_at = True, time.monotonic()
            for p in list(self._running.values()):
                self._signal(p, signal.SIGTERM)

    @staticmethod
    def _signal(p: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(p.pid, sig)  # the cell and any process it started
        except (ProcessLookupError, PermissionError):
            pass


register("process", "one `python -m lnexp train` process per cell", ProcessLauncher)


def named_in(overrides: list[str]) -> str | None:
    """The launcher that ``hydra/launcher=submitit_slurm`` (or ``submitit_local``) among the atlas's
    overrides asks for, as Hydra's own multirun would read it; None if they name none. (So that
    ``lnexp atlas hydra/launcher=submitit_slurm hydra.launcher.partition=gpu`` means
    ``--launcher submitit_slurm``: issue 43 names both spellings.)"""
    value = override.value(overrides, override.LAUNCHER_GROUP)
    return value if isinstance(value, str) and value.startswith("submitit_") and value in names() else None

