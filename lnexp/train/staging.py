"""What a launch of ``lnexp train`` may write into a run folder before the run is its to train.

Hydra writes a launch's composed config (``hydra.output_subdir``: ``.hydra-launch-PID``) and opens
the job's log file before lnexp's job starts. A launch that then does not train (the run is
finished, another process holds it, the folder is someone else's) must leave the folder as it was,
so the config becomes ``RUN/.hydra/`` and the log file takes lines only once the run is the
launch's (:func:`publish`, called with the run's lock held); otherwise both are undone
(:func:`undo`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lnexp import rundir
from lnexp.errors import UserError

HYDRA_DIR = ".hydra"  # where the run's composed config stays (results and plot read it)
STAGING_PREFIX = ".hydra-launch-"  # configs/train.yaml's hydra.output_subdir, one per process
LOG_FILE = "lnexp.log"  # Hydra's job log (hydra.job.name)
_HELD: list[tuple[logging.Logger, logging.Handler]] = []  # the log handlers paused


def register_resolver() -> None:
    """``${lnexp_pid:}`` of configs/train.yaml's ``hydra.output_subdir``: each process its own
    staging folder (called by the Hydra app beside :func:`lnexp.run_names.register_resolver`)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("lnexp_pid"):
        OmegaConf.register_new_resolver("lnexp_pid", os.getpid)


class ForeignFolder(UserError):
    """The run's folder holds files of something else."""


@contextmanager
def log_paused(run_dir: Path) -> Iterator[None]:
    """Log records reach no file in ``run_dir`` until :func:`publish` (or the block's end)."""
    where = str(Path(run_dir).resolve())
    for logger in (logging.getLogger(), *map(logging.getLogger, logging.root.manager.loggerDict)):
        for h in list(logger.handlers):
            if isinstance(h, logging.FileHandler) and h.baseFilename.startswith(where):
                logger.removeHandler(h)
                _HELD.append((logger, h))
    try:
        yield
    finally:
        _resume()


def _resume() -> None:
    for logger, h in _HELD:
        logger.addHandler(h)
    _HELD.clear()


def publish(staged: Path | None, run_dir: Path) -> None:
    """The launch trains the run: its Hydra files become RUN/.hydra/ (each replaced whole) and
    the log file takes its lines."""
    if staged is not None and staged.is_dir():
        final = run_dir / HYDRA_DIR
        final.mkdir(exist_ok=True)
        for f in staged.iterdir():
            os.replace(f, final / f.name)
        staged.rmdir()
    _resume()


def undo(staged: Path | None, run_dir: Path) -> None:
    """The launch did not train the run: its Hydra files go, and the log file Hydra opened if it
    is empty."""
    if staged is None or not staged.is_dir():
        return  # published (or none)
    shutil.rmtree(staged, ignore_errors=True)
    log_file = run_dir / LOG_FILE
    if log_file.is_file() and log_file.stat().st_size == 0:
        log_file.unlink()


def refuse_foreign(run_dir: Path) -> None:
    """A folder that holds files but no run (``hydra.run.dir=`` someone else's folder) is not
    lnexp's to write into: ForeignFolder, before anything of the run is written there."""
    if rundir.is_run_dir(run_dir) or rundir.run_paths(run_dir)["run"].is_file():
        return

    def ours(name: str) -> bool:  # what launches write first (another rank's staging too)
        return name in (LOG_FILE, rundir.LOCK, HYDRA_DIR) or name.startswith(STAGING_PREFIX)

    others = sorted(p.name for p in run_dir.iterdir() if not ours(p.name)) if run_dir.is_dir() else []
    if others:
        raise ForeignFolder(f"{run_dir} holds files but no lnexp run ({', '.join(others[:3])}"
                            f"{', ...' if len(others) > 3 else ''}): lnexp train writes only into "
                            "its own run folders; choose another folder (runs_root=..., or an empty "
                            "hydra.run.dir)")
