"""One launch per run folder: the process that trains a run holds its lock file.

Two launches of one run (two terminals, a sweep started twice) would both write its metrics,
checkpoints and status. The lock file (``rundir.LOCK``, made with O_EXCL) names the holder's pid
and host; a second launch stops at once naming them, and a lock whose process is gone (SIGKILL,
a crash, a reboot) is taken over with a message.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lnexp.errors import UserError
from lnexp.rundir import as_disk_error, effective_status, process_started, read_json, run_paths, same_process

log = logging.getLogger("lnexp.train")
STARTUP_GRACE_S = 120.0  # on another host, a lock younger than this is live even without a heartbeat


class RunLocked(UserError):
    """Another process trains this run; the message names it and what to do."""


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": process_started(os.getpid()),
            "since": time.time()}


def holder_alive(holder: dict[str, Any], run_dir: Path) -> bool:
    """Whether the process named in a lock still runs. On this host the process is looked up; on
    another one, the run's heartbeat in status.json decides (after a start-up grace)."""
    pid = int(holder.get("pid") or 0)
    if holder.get("host") == socket.gethostname():
        return pid > 0 and same_process(pid, holder.get("started"))
    if time.time() - float(holder.get("since", 0)) < STARTUP_GRACE_S:
        return True
    status = read_json(run_paths(run_dir)["status"], {}) or {}
    return effective_status(status).get("status") == "running" and status.get("pid") == pid


def _refusal(run_dir: Path, holder: dict[str, Any]) -> RunLocked:
    since = time.strftime("%H:%M:%S", time.localtime(float(holder.get("since", 0))))
    pid, host = holder.get("pid"), holder.get("host")
    stop = f"kill {pid}" if host == socket.gethostname() else f"kill {pid} on {host}"
    return RunLocked(f"{run_dir} is already being trained by pid {pid} on host {host} (since "
                     f"{since}): wait for it to finish, or stop it ({stop}) and run the same "
                     "command again to resume the run")


def acquire(run_dir: Path) -> Path:
    """Take the run's lock, or raise RunLocked; returns the lock file."""
    return take(run_paths(run_dir)["lock"], lambda holder: holder_alive(holder, run_dir),
                lambda holder: _refusal(run_dir, holder), str(run_dir))


def take(path: Path, alive: Callable[[dict[str, Any]], bool],
         refusal: Callable[[dict[str, Any]], UserError], what: str) -> Path:
    """Take the lock file ``path`` (made with O_EXCL, naming this process), or raise
    ``refusal(holder)`` while ``alive(holder)``; a lock whose holder is gone is taken over, saying so.
    One door for a run's lock and the atlas's lock on its runs root."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(20):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_json(path, None)
            if not isinstance(holder, dict):  # being written this instant, or damaged
                try:
                    young = time.time() - path.stat().st_mtime < 5
                except FileNotFoundError:
                    continue
                if young:
                    time.sleep(0.1)
                    continue
                holder = {}
            elif alive(holder):
                raise refusal(holder) from None
            log.warning("%s: taking over its lock from pid %s on host %s, which is gone",
                        what, holder.get("pid", "?"), holder.get("host", "?"))
            stale = path.with_name(f"{path.name}.stale{os.getpid()}")
            try:
                os.replace(path, stale)  # one taker wins; the others find the winner's lock
                stale.unlink()
            except FileNotFoundError:
                pass
            continue
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(_me()) + "\n")
        except OSError as e:  # a full disk: an empty lock would name no holder to the next launch
            path.unlink(missing_ok=True)
            error = as_disk_error(e, path)
            if error is None:
                raise
            raise error from None
        return path
    raise RunLocked(f"{what}: could not take its lock {path}: delete that file if no lnexp "
                    "process holds it, then run the same command again")


def release(path: Path) -> None:
    """Remove the lock if this process still holds it."""
    holder = read_json(path, {}) or {}
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)


@contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    path = acquire(run_dir)
    try:
        yield
    finally:
        release(path)
