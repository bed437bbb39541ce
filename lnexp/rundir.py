"""The run folder: what a run writes and where, written so that no half-written file ever
replaces a good one, and read so that one damaged line costs that line only.

The run folder is the contract between training, results, evaluation and figures, so its layout
lives here alone: ``run_paths`` names every file, ``atomic_path`` / ``write_text`` / ``write_json``
are the one write-then-rename, ``read_json`` / ``read_metrics`` / ``read_updates`` the readers, and
``stamp`` / ``effective_status`` tell a live run from a dead one. It imports neither torch nor
fairseq (``lnexp results`` reads runs without them).
"""

from __future__ import annotations

import csv
import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from lnexp.errors import UserError

log = logging.getLogger("lnexp")

METRICS = "metrics.jsonl"  # one JSON line per epoch
UPDATES = "updates.csv"  # one row per update
STATUS = "status.json"  # running / done / diverged / interrupted / failed, epoch, updates
RUN = "run.json"  # the resolved config, data, flags of the run
CHECKPOINTS = "checkpoints"
CHECKPOINT_LAST = "checkpoint_last.pt"
CHECKPOINT_PREVIOUS = "checkpoint_previous.pt"  # the checkpoint_last.pt before the last save
CHECKPOINT_BEST = "checkpoint_best.pt"
EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt")  # fairseq's name of an epoch checkpoint
LOCK = ".lnexp-lock.json"  # pid and host of the process that trains the run
ERROR_LOG = "error.log"
# loss_scale: fairseq's fp16 loss scale after the update (empty without one: fp32, bf16);
# overflows: fp16 updates skipped so far in the run (fairseq lowered the scale and went on)
UPDATE_FIELDS = ("update", "epoch", "lr", "loss", "nll_loss", "gnorm", "ntokens", "loss_scale",
                 "overflows")
# errors after which writing again cannot help until the user acts: a full disk or quota, a
# folder made read-only or unwritable
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def run_paths(run_dir: Path) -> dict[str, Path]:
    """Every file and folder a run writes."""
    ckpt = run_dir / CHECKPOINTS
    return {
        "metrics": run_dir / METRICS, "updates": run_dir / UPDATES, "status": run_dir / STATUS,
        "run": run_dir / RUN, "checkpoints": ckpt, "last": ckpt / CHECKPOINT_LAST,
        "previous": ckpt / CHECKPOINT_PREVIOUS, "best": ckpt / CHECKPOINT_BEST,
        "hyps": run_dir / "hyps", "tb": run_dir / "tb", "norms": run_dir / "norms.csv",
        "lock": run_dir / LOCK, "error_log": run_dir / ERROR_LOG,
    }


def is_run_dir(path: Path) -> bool:
    """A folder that lnexp train wrote (or Hydra made for it)."""
    return (path / STATUS).is_file() or (path / ".hydra" / "config.yaml").is_file()


def checkpoint_name(label: str | int) -> str:
    """``best``/``last``/``previous``/``avgN`` -> ``checkpoint_LABEL.pt``; an epoch number ->
    fairseq's ``checkpoint{EPOCH}.pt``."""
    return f"checkpoint{label}.pt" if isinstance(label, int) else f"checkpoint_{label}.pt"


def epoch_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(epoch, path) of every epoch checkpoint in ``ckpt_dir``, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir()
             if (m := EPOCH_CHECKPOINT.fullmatch(p.name))]
    return sorted(found)


class DiskError(UserError):
    """A write that failed for want of space or permission: one line naming the path, the free
    space and the fix; ``path`` and ``os_error`` are what failed, for a caller that names another
    fix (lnexp.data.cache: the cache's)."""

    def __init__(self, message: str, path: Path | None = None, os_error: OSError | None = None):
        super().__init__(message)
        self.path, self.os_error = path, os_error


RESUME = "then run the same command again: it resumes from the last complete checkpoint"


def disk_error(path: Path, e: OSError, setting: str = "runs_root=", then: str = RESUME) -> DiskError:
    """The DiskError of ``e`` writing ``path``; ``setting`` names the folder to change."""
    where = Path(path).parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = f"{shutil.disk_usage(where).free / 1e6:,.1f} MB free on {where}"
    except OSError:
        free = f"free space on {where} unknown"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free some space (or set {setting} to another disk)"
    else:
        fix = f"make {where} writable (or set {setting} to a writable folder)"
    return DiskError(f"cannot write {path}: {os.strerror(e.errno or 0)} ({free}): {fix}, {then}",
                     Path(path), e)


@contextmanager
def atomic_path(path: Path, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends,
    removed if it fails. ``suffix`` keeps an extension that a writer reads (``.png``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno in DISK_ERRNOS:
            raise disk_error(path, e) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO]:
    """An open temporary file that replaces ``path`` once written and synced (text: UTF-8, and
    newlines written as given, as the csv module needs)."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


@contextmanager
def append_file(path: Path) -> Iterator[IO]:
    """``path`` opened to append rows (a reader drops a row cut short); a full disk is a DiskError."""
    try:
        with open(path, "a", newline="", encoding="utf-8") as f:
            yield f
    except OSError as e:
        if e.errno in DISK_ERRNOS:
            raise disk_error(path, e) from None
        raise


def as_disk_error(e: BaseException, where: Path | None = None) -> DiskError | None:
    """A DiskError for an OSError of a full disk or an unwritable folder raised anywhere (fairseq,
    TensorBoard), naming the file if the error does, else ``where`` (a file of the run: the free
    space is that of its file system); None for any other error."""
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
        return disk_error(Path(e.filename or where or "the run folder"), e)
    return None


def write_text(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=1, default=str) + "\n")


def write_with(path: Path, writer: Callable[[Path], Any], suffix: str = "") -> None:
    """``writer(tmp)`` writes the file (``torch.save``, ``savefig``, a copy) under a temporary name."""
    with atomic_path(path, suffix) as tmp:
        writer(tmp)


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` becomes the same bytes as ``src``: a hard link (no disk cost) where the file system
    has them, else a copy; ``src`` must be a file that is only ever replaced, never rewritten."""
    def link(tmp: Path) -> None:
        try:
            os.link(src, tmp)
        except OSError as e:  # a file system without hard links
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise
            shutil.copyfile(src, tmp)

    write_with(dst, link)


def read_json(path: Path, default: Any = None) -> Any:
    """The JSON in ``path``, or ``default`` if it is missing or damaged."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def _damaged(path: Path, line: int, why: str) -> None:
    log.warning("%s line %d is damaged (%s): skipped it, kept the lines after it", path, line, why)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-epoch rows of metrics.jsonl; a damaged line is skipped with a warning."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for n, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            _damaged(path, n, "not a JSON line")
            continue
        if not isinstance(row, dict) or not isinstance(row.get("epoch"), int) \
                or not isinstance(row.get("updates"), int):
            _damaged(path, n, "no epoch and updates")
            continue
        rows.append(row)
    return rows


def read_updates(path: Path) -> list[dict[str, str]]:
    """The per-update rows of updates.csv (values as text); a damaged line is skipped with a
    warning. A damaged header is taken to be today's columns."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().decode("utf-8", "replace").splitlines()
    if not lines:
        return []
    header = lines[0].split(",")
    if "update" not in header:
        _damaged(path, 1, "not the header")
        header, start = list(UPDATE_FIELDS), 0
    else:
        start = 1
    rows = []
    for n, line in enumerate(lines[start:], start + 1):
        if not line.strip():
            continue
        try:
            (cells,) = list(csv.reader([line.replace("\0", "")]))
            row = dict(zip(header, cells, strict=True))
            int(row["update"])
        except (ValueError, csv.Error):
            _damaged(path, n, f"not {len(header)} values with a whole update number")
            continue
        rows.append(row)
    return rows


def stamp(status: dict[str, Any], stale_after_s: float) -> dict[str, Any]:
    """A ``running`` status with who writes it and when, so that readers can tell a live run from
    one whose process is gone (``effective_status``)."""
    import socket
    import time

    return {**status, "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time(),
            "stale_after_s": round(stale_after_s)}


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def process_started(pid: int) -> str | None:
    """The process's start time (Linux /proc), so that a pid reused by another program after a
    crash is not taken for the process that wrote it; None where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def same_process(pid: int, started: str | None) -> bool:
    """Whether ``pid`` of this host is alive and is the process that started at ``started``."""
    return process_alive(pid) and started in (None, process_started(pid))


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
        gone = not process_alive(int(status["pid"]))
    return {**status, "status": "interrupted"} if gone else status


def record_failure(run_dir: Path, reason: str) -> None:
    """status.json says ``failed`` with ``reason`` and keeps the epochs and updates recorded.
    On a full disk the small file is rewritten in place if a new one cannot be made."""
    path = run_paths(run_dir)["status"]
    old = read_json(path, {}) or {}
    for key in ("pid", "host", "heartbeat", "stale_after_s", "in_epoch", "validating"):
        old.pop(key, None)
    new = {**old, "status": "failed", "error": reason}
    try:
        write_json(path, new)
    except DiskError:
        try:
            with open(path, "r+", encoding="utf-8") as f:
                f.write(json.dumps(new, default=str) + "\n")
                f.truncate()
        except OSError:
            pass


def write_keeping_previous(path: Path, previous: Path, writer: Callable[[Path], Any]) -> None:
    """Write ``path`` anew; the file it replaces stays as ``previous`` (a hard link, no copy), so
    that a checkpoint damaged later (a bad disk, a copy cut short) still has a good one before it."""
    with atomic_path(path) as tmp:
        writer(tmp)
        if path.is_file():
            link_or_copy(path, previous)


def checkpoint_damage(path: Path) -> str | None:
    """Why a checkpoint cannot be loaded (truncated, corrupt), or None if it is whole. torch writes
    zip archives, whose directory and CRCs show damage without loading any tensor."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        return f"not a complete checkpoint: {e}"
    return f"its part {bad} fails its CRC check" if bad else None


def resume_checkpoint(paths: dict[str, Path]) -> Path | None:
    """checkpoint_last.pt, or checkpoint_previous.pt if the last one is damaged (it is then
    replaced by the previous one); None for a fresh start."""
    last, previous = paths["last"], paths["previous"]
    if not last.is_file():
        return None
    damage = checkpoint_damage(last)
    if damage is None:
        return last
    if previous.is_file() and checkpoint_damage(previous) is None:
        logging.getLogger("lnexp.train").warning(
            "%s is damaged (%s): resuming from %s, the checkpoint before it", last, damage,
            previous.name)
        link_or_copy(previous, last)
        return last
    raise UserError(f"{last} is damaged ({damage}) and there is no good {previous.name}: delete "
                    f"{last.parent} to train the run from the start")
