"""Fair sharing of the machine's cores between the lnexp trainings on one host.

By default torch takes every core, so two trainings side by side each run 7-9x slower (their
OpenMP threads spin while they wait for cores that the other run holds). With ``threads=0`` (the
default) a run takes its fair share instead: under a joblib sweep, cores / jobs; beside other
lnexp trainings on this host (a sweep's other jobs included), cores / trainings, re-checked every
few seconds as runs start and end. Each training registers itself in a host-wide folder
(``active_dir``) for as long as it runs.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from lnexp.plural import count
from lnexp.rundir import process_started, same_process
from lnexp.runtime.host import cores

log = logging.getLogger("lnexp.train")
ACTIVE_ENV = "LNEXP_ACTIVE_DIR"  # where trainings register (default: the temp folder's lnexp-active)
REFRESH_S = 2.0  # how often a running training looks for others
PASSIVE_ENV = "LNEXP_PASSIVE_WAIT"  # why this launch set OMP_WAIT_POLICY=PASSIVE (the threads line says)


def active_dir() -> Path:
    return Path(os.environ.get(ACTIVE_ENV) or Path(tempfile.gettempdir()) / "lnexp-active")


def _entries() -> list[Path]:
    try:
        return list(active_dir().glob("*.json"))
    except OSError:
        return []


def others_on_host() -> int:
    """Other live lnexp trainings on this host (entries of dead processes are removed)."""
    host, me, n = socket.gethostname(), os.getpid(), 0
    for path in _entries():
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if entry.get("host") != host or entry.get("pid") == me:
            continue
        if same_process(int(entry.get("pid", 0)), entry.get("started")):
            n += 1
        else:
            path.unlink(missing_ok=True)
    return n


def parallel_jobs() -> int:
    """Jobs that Hydra's joblib launcher runs at once in this sweep (1 outside one)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        launcher = HydraConfig.get().launcher
    except Exception:  # not under Hydra (fig3, the probes, the tests' direct calls)
        return 1
    if "joblib" not in str(launcher.get("_target_", "")):
        return 1
    n = int(launcher.get("n_jobs", 1) or 1)
    return cores() if n < 0 else max(n, 1)


def omp_cap() -> int | None:
    """OMP_NUM_THREADS, which caps torch's own default too."""
    try:
        return max(int(os.environ["OMP_NUM_THREADS"]), 1)
    except (KeyError, ValueError):
        return None


def fair_share(others: int, jobs: int) -> tuple[int, str]:
    """(threads, why) for a run beside ``others`` trainings, in a sweep of ``jobs`` at once."""
    n = cores()
    share, why = n, f"all {count(n, 'core')}, no other lnexp training on this host"
    if jobs > 1:
        share, why = max(n // jobs, 1), f"{count(n, 'core')} / {jobs} joblib jobs"
    if others and max(n // (others + 1), 1) < share:
        share = max(n // (others + 1), 1)
        why = f"{count(n, 'core')} shared with {count(others, 'other lnexp training')} on this host"
    cap = omp_cap()
    if cap is not None and cap < share:
        share, why = cap, f"OMP_NUM_THREADS={cap}"
    return share, why


class Sharing:
    """The thread count of one training: set at its start, adjusted while it runs (threads=0), and
    its registration on the host removed when it ends."""

    def __init__(self, threads: int, run_dir: Path) -> None:
        self.fixed = int(threads)
        self.jobs = parallel_jobs()
        self.entry = active_dir() / f"{socket.gethostname()}-{os.getpid()}.json"
        self._register(run_dir)
        self.next_check = 0.0
        self.threads = 0
        if self.fixed:
            self._set(self.fixed, f"threads={self.fixed} given")
        else:
            self._set(*fair_share(others_on_host(), self.jobs))

    def _register(self, run_dir: Path) -> None:
        try:
            self.entry.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.chmod(self.entry.parent, 0o1777)  # a folder every user's runs can register in
            except OSError:
                pass
            self.entry.write_text(json.dumps({
                "pid": os.getpid(), "host": socket.gethostname(), "run": str(run_dir),
                "started": process_started(os.getpid()), "since": time.time()}))
        except OSError:  # no shared temp folder: the run still shares under a joblib sweep
            pass

    def _set(self, threads: int, why: str) -> None:
        import torch

        first = self.threads == 0
        self.threads = threads
        torch.set_num_threads(threads)
        passive = os.environ.get(PASSIVE_ENV) if first else None
        log.info("threads: %d (%s)%s%s", threads, why,
                 "; set threads=N to choose" if first and not self.fixed else "",
                 f"; OMP_WAIT_POLICY=PASSIVE: this launch shares the host ({passive})" if passive else "")

    def refresh(self) -> None:
        """Take the fair share again if trainings started or ended (every REFRESH_S at most)."""
        now = time.monotonic()
        if self.fixed or now < self.next_check:
            return
        self.next_check = now + REFRESH_S
        threads, why = fair_share(others_on_host(), 1)  # the sweep's jobs have registered by now
        if threads != self.threads:
            self._set(threads, why)

    def close(self) -> None:
        self.entry.unlink(missing_ok=True)

    def info(self) -> dict[str, Any]:
        return {"threads": self.threads, "cores": cores(), "fixed": bool(self.fixed)}


def passive_wait_if_shared(argv: list[str]) -> str | None:
    """Set OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep instead of spinning while they wait) when
    this launch shares the host: other lnexp trainings run here, or a joblib sweep runs jobs side
    by side. Measured in issue 23: two side-by-side runs took 60 s instead of 229 s. A run alone
    keeps OpenMP's default (spinning is what makes one run's small kernels fast). Must run before
    torch is imported: OpenMP reads it once. A value the user set is kept. Returns why, or None."""
    if "OMP_WAIT_POLICY" in os.environ:
        return None
    joblib = any(a.startswith("hydra/launcher=joblib") for a in argv)
    others = others_on_host()
    if not joblib and not others:
        return None
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    why = "a joblib sweep" if joblib else \
        f"{count(others, 'other lnexp training')} on this host"
    os.environ[PASSIVE_ENV] = why  # for the threads line, in the launcher's workers too
    return why
