"""Room on the run's disk for its checkpoints, checked before the first update: a disk too small
for them was found full only when the run, trained to its end, saved its first one (issue 49).

A checkpoint holds the model's weights and the optimizer's moments (fp32: 4 bytes a number; a
resumed run's own checkpoint_last.pt gives its size exactly). At most ``PEAK`` of them are on disk
at once, besides the epoch checkpoints kept for averaging: the last, the previous one (kept in
case the last is damaged), the one being written, and the best.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lnexp.plural import count
from lnexp.rundir import DiskError
from lnexp.train.settings import RunSetup

PEAK = 4  # checkpoint_last.pt, checkpoint_previous.pt, the one being written, checkpoint_best.pt
MB = 1e6


def checkpoint_bytes(setup: RunSetup, params: int) -> int:
    """The size of one of the run's checkpoints: its checkpoint_last.pt where it resumes, else its
    weights and its optimizer's moments (Adam, RAdam: two a weight; SGD: one with momentum)."""
    last = setup.paths["last"]
    if last.is_file():
        return last.stat().st_size
    optimizer = setup.config.get("optimizer") or {}
    moments = {"adam": 2, "radam": 2}.get(str(optimizer.get("name")),
                                          1 if float(optimizer.get("momentum") or 0) else 0)
    return 4 * params * (1 + moments)


def _held(folder: Path) -> int:
    """Bytes the run's checkpoint files hold now (a hard-linked twin counted once)."""
    seen, total = set(), 0
    if folder.is_dir():
        for f in folder.iterdir():
            st = f.stat()
            if f.is_file() and st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def check(setup: RunSetup, params: int) -> None:
    """A one-line DiskError where the run's disk lacks room for the checkpoints it will hold at
    once (those it holds already count as room)."""
    folder = setup.paths["checkpoints"]
    size = checkpoint_bytes(setup, params)
    copies = PEAK + setup.keep_last_epochs
    need = copies * size - _held(folder)
    where = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(where).free
    if need <= free:
        return
    epochs = f" and {count(setup.keep_last_epochs, 'epoch checkpoint')}" \
        if setup.keep_last_epochs else ""
    raise DiskError(
        f"no room for this run's checkpoints in {folder}: they need {need / MB:,.1f} MB more "
        f"({copies} of ~{size / MB:,.1f} MB at once: the last, the previous, the one being written, "
        f"the best{epochs}), and {free / MB:,.1f} MB are free on {where}: free some space (or set "
        "runs_root= to another disk), then run the same command again", folder)
