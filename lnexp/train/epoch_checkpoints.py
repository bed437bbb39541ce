"""Epoch checkpoints ``checkpoint{EPOCH}.pt`` for averaging (``checkpoint.keep_last_epochs``).

Named as fairseq names them, so fairseq's ``average_checkpoints.py --num-epoch-checkpoints N``
finds the same files as ``lnexp evaluate --checkpoint avgN``. Each is a hard link to the
``checkpoint_last.pt`` written at the end of the epoch (that file is always replaced, never
rewritten in place), so keeping one costs no copy; its disk cost is that of a full checkpoint
once the next epoch's ``checkpoint_last.pt`` replaces the link's twin.
"""

from __future__ import annotations

from pathlib import Path

from lnexp.rundir import CHECKPOINT_LAST, checkpoint_name, epoch_checkpoints, link_or_copy

__all__ = ["epoch_checkpoints", "keep_epoch"]


def keep_epoch(ckpt_dir: Path, epoch: int, keep: int) -> None:
    """Keep ``checkpoint_last.pt`` as ``checkpoint{epoch}.pt``; delete all but the last ``keep``."""
    if keep <= 0:
        return
    link_or_copy(ckpt_dir / CHECKPOINT_LAST, ckpt_dir / checkpoint_name(epoch))
    for _, old in epoch_checkpoints(ckpt_dir)[:-keep]:
        old.unlink(missing_ok=True)
