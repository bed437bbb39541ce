"""What a run logs as it trains: the per-epoch and per-update files and TensorBoard.

The files (lnexp.rundir names them) are rewritten atomically from the state that the last
checkpoint holds, so after a kill and a resume they contain exactly what an uninterrupted run
would have written.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from lnexp.rundir import UPDATE_FIELDS, read_updates, write_text


class RunLog:
    def __init__(self, paths: dict[str, Path], resume_update: int, tensorboard: bool = True) -> None:
        self.paths = paths
        self.updates: list[dict[str, Any]] = [
            r for r in read_updates(paths["updates"]) if int(r["update"]) <= resume_update]
        self._unflushed = 0
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(paths["tb"]), purge_step=resume_update + 1)

    def update(self, row: dict[str, Any]) -> None:
        self.updates.append(row)
        self._unflushed += 1
        if self.tb is not None:
            step = row["update"]
            for key in ("lr", "loss", "nll_loss", "gnorm", "loss_scale"):
                if row.get(key) is not None:
                    self.tb.add_scalar(f"train/{key}", row[key], step)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.tb is not None:
            for key, value in values.items():
                self.tb.add_scalar(f"{prefix}/{key}", value, step)

    def epoch(self, history: list[dict[str, Any]]) -> None:
        """Persist the per-epoch history and the per-update rows (called at checkpoints)."""
        write_text(self.paths["metrics"], "".join(json.dumps(r) + "\n" for r in history))
        self.flush_updates()
        if history and self.tb is not None:
            last = history[-1]
            self.scalars("valid", {k[6:]: v for k, v in last.items()
                                   if k.startswith("valid_") and isinstance(v, float)},
                          last["updates"])
            self.tb.flush()

    def flush_updates(self) -> None:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=UPDATE_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(self.updates)
        write_text(self.paths["updates"], buf.getvalue())
        self._unflushed = 0

    def close(self) -> None:
        if self.tb is not None:
            try:
                self.tb.close()
            except OSError:  # a full disk: the error that stopped the run is the one to report
                pass
