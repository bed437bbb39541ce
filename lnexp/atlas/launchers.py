"""How the atlas's cells are trained: a :class:`Launcher` runs one round of cells and reports each
as it ends.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Ended:
    """One cell of a round, ended."""

    index: int  # its position in the round's list of cells
    seconds: float  # wall time from its launch to its end
    status: int  # exit status as lnexp train gives it: 0 ok, 2 user error, 1 crash, 130 interrupted


INTERRUPTED = 130  # Ended.status of a cell stopped by Launcher.stop (lnexp train's exit status then)


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


@dataclass(frozen=True)
class LaunchSetup:
    """What a launcher may need to know besides its cells (fields may be added; a factory reads the
    ones it needs)."""

    runs_root: Path
    scale: str
    gpus: tuple[str, ...] = ()  # the GPUs the cells may use (their CUDA_VISIBLE_DEVICES ids)
    overrides: tuple[str, ...] = ()  # the user's overrides for every cell (a cluster's hydra.launcher.*)
    extra: dict[str, str] = field(default_factory=dict)  # reserved for a launcher's own options


Factory = Callable[..., Launcher]  # (setup: LaunchSetup | None, **options) -> Launcher
LAUNCHERS: dict[str, tuple[str, Factory]] = {}  # name -> (help line, factory)
# Modules that register a launcher when imported (a launcher with its own dependencies lives in
# one, so that lnexp atlas imports it only when asked for)
MODULES: tuple[str, ...] = ("lnexp.atlas.worker", "lnexp.atlas.cluster")


def register(name: str, help_line: str, factory: Factory) -> None:
    LAUNCHERS[name] = (help_line, factory)


def names() -> dict[str, str]:
    """{name: help line} of every launcher, those of :data:`MODULES` included."""
    for module in MODULES:
        try:
            importlib.import_module(module)
        except ImportError as e:  # its dependency (submitit) is not installed: not offered
            if (e.name or "").startswith("lnexp"):
                raise
            continue
    return {n: h for n, (h, _) in LAUNCHERS.items()}


def make(name: str, setup: LaunchSetup | None = None, **options: object) -> Launcher:
    """The launcher called ``name``, made from ``setup`` (None: defaults) and its own ``options``;
    a one-line error naming the choices."""
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
    polls."""

    name = "process"
    TRAIN = (sys.executable, "-m", "lnexp", "train")
    POLL_S = 0.1
    GRACE_S = 60.0  # after stop: a cell still running this long after its SIGTERM is killed

    def __init__(self, gpus: tuple[str, ...] = (), argv: list[str] | None = None) -> None:
        self.gpus = tuple(gpus)
        self.argv = list(argv or self.TRAIN)
        self._stopping = False
        self._stopped_at = 0.0
        self._running: dict[int, subprocess.Popen] = {}

    def run_round(self, cells: list[list[str]], jobs: int, ended: Callable[[Ended], None]) -> None:
        queue = list(enumerate(cells))
        free = list(range(max(jobs, 1)))  # job slots: a slot's GPU is gpus[slot % len(gpus)]
        started: dict[int, tuple[float, int]] = {}
        while (queue and not self._stopping) or self._running:
            while queue and free and not self._stopping:
                i, cell = queue.pop(0)
                slot = free.pop(0)
                env = dict(os.environ)
                if self.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot % len(self.gpus)]
                started[i] = (time.monotonic(), slot)
                self._running[i] = subprocess.Popen([*self.argv, *cell], env=env, process_group=0)
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
                status = 128 - rc if rc < 0 else rc
                if self._stopping and (status == INTERRUPTED or rc < 0):
                    # stopped by stop(), however far it had got: a signal's death then (an abort at
                    # exit, after lnexp train recorded the interruption, too) is the stop's doing
                    status = INTERRUPTED
                ended(Ended(i, time.monotonic() - t0, status))
            if self._running:
                time.sleep(self.POLL_S)

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


register("process", "one `python -m lnexp train` process per cell",
         lambda setup, **options: ProcessLauncher(setup.gpus if setup else (), **options))


def named_in(overrides: list[str]) -> str | None:
    """The launcher that ``hydra/launcher=submitit_slurm`` (or ``submitit_local``) among the atlas's
    overrides asks for, as Hydra's own multirun would read it; None if they name none. (So that
    ``lnexp atlas hydra/launcher=submitit_slurm hydra.launcher.partition=gpu`` means
    ``--launcher submitit_slurm``: issue 43 names both spellings.)"""
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "hydra/launcher" and value.startswith("submitit_") and value in names():
            return value
    return None

