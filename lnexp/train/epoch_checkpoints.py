"""Epoch checkpoints ``checkpoint{EPOCH}.pt`` for averaging (``checkpoint.keep_last_epochs``).

Named as fairseq names them, so fairseq's ``average_checkpoints.py --num-epoch-checkpoints N``
finds the same files as ``lnexp evaluate --checkpoint avgN``. Each is a hard link to the
``checkpoint_last.pt`` written at the end of the epoch (that file is always replaced, never
rewritten in place), so keeping one costs no copy; its disk cost is that of a full checkpoint
once the next epoch's ``checkpoint_last.pt`` replaces the link's twin.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt")


def epoch_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(epoch, path) of every epoch checkpoint in ``ckpt_dir``, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir()
             if (m := EPOCH_CHECKPOINT.fullmatch(p.name))]
    return sorted(found)


def keep_epoch(ckpt_dir: Path, epoch: int, keep: int) -> None:
    """Keep ``checkpoint_last.pt`` as ``checkpoint{epoch}.pt``; delete all but the last ``keep``."""
    if keep <= 0:
        return
    last, tmp = ckpt_dir / "checkpoint_last.pt", ckpt_dir / f".checkpoint{epoch}.pt.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(last, tmp)
    except OSError:  # a file system without hard links
        shutil.copyfile(last, tmp)
    tmp.replace(ckpt_dir / f"checkpoint{epoch}.pt")
    for _, old in epoch_checkpoints(ckpt_dir)[:-keep]:
        old.unlink(missing_ok=True)
