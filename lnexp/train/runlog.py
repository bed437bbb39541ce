"""What a run writes: metrics.jsonl (per epoch), updates.csv (per update), TensorBoard, status.

Files are rewritten atomically from the state that the last checkpoint holds, so after a kill and
a resume they contain exactly what an uninterrupted run would have written.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

# loss_scale: fairseq's fp16 loss scale after the update (empty without one: fp32, bf16);
# overflows: fp16 updates skipped so far in the run (fairseq lowered the scale and went on)
UPDATE_FIELDS = ("update", "epoch", "lr", "loss", "nll_loss", "gnorm", "ntokens", "loss_scale",
                 "overflows")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1, default=str) + "\n")


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def stamp(status: dict[str, Any], stale_after_s: float) -> dict[str, Any]:
    """A ``running`` status with who writes it and when, so that readers can tell a live run from
    one whose process is gone (``effective_status``)."""
    import socket
    import time

    return {**status, "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time(),
            "stale_after_s": round(stale_after_s)}


def effective_status(status: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """status.json as it stands: a ``running`` run whose process is gone (SIGKILL, OOM, a dead node)
    is ``interrupted`` at its last recorded update. On the run's own host the process is looked up;
    elsewhere a heartbeat older than ``stale_after_s`` decides."""
    import socket
    import time

    if status.get("status") != "running":
        return status
    age = (now or time.time()) - float(status.get("heartbeat", 0))
    gone = age > float(status.get("stale_after_s", 3600))
    if not gone and status.get("host") == socket.gethostname() and status.get("pid"):
        try:
            os.kill(int(status["pid"]), 0)
        except ProcessLookupError:
            gone = True
        except PermissionError:
            pass
    return {**status, "status": "interrupted"} if gone else status


class RunLog:
    def __init__(self, paths: dict[str, Path], resume_update: int, tensorboard: bool = True) -> None:
        self.paths = paths
        self.updates: list[dict[str, Any]] = [
            r for r in _read_csv(paths["updates"]) if int(r["update"]) <= resume_update]
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
        write_atomic(self.paths["metrics"], "".join(json.dumps(r) + "\n" for r in history))
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
        write_atomic(self.paths["updates"], buf.getvalue())
        self._unflushed = 0

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _read_csv(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows
