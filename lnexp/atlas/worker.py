"""The cell worker: ``jobs`` long-lived processes, each training the atlas's cells one after another.

Why: a cell of its own ``python -m lnexp train`` pays the interpreter, the imports (torch, fairseq,
Hydra), the CUDA context and the data's first reading before its first update; on one H200 that was
~15 s of a 35-81 s cell (issue 43). A worker pays them once and then calls lnexp train's own entry
(``lnexp.cli.main(["train", *cell])``) for each cell, so that a cell's folder, resume, skip-if-
finished, lock, statuses and exit status stay lnexp train's, and each cell builds a fresh model,
optimizer and seed as lnexp train does.

What lnexp train sets for its process (signal handlers, log handlers, warnings filters, environment
variables, torch's thread count, Hydra's global state, fairseq's metrics, the RNGs) is put back as a
new process has it before each cell (:class:`ProcessState`), so that a cell trained here gives the
same numbers, bit for bit, as the same cell in its own process (tests/test_atlas_launchers.py).

The protocol between :class:`WorkerLauncher` and ``python -m lnexp.atlas.worker``: a cell is one
JSON line on the worker's stdin (``{"index": i, "cell": [...]}``); its end is one JSON line on the
result pipe (``{"index": i, "status": rc, "seconds": s}``); end of stdin ends the worker (so a
worker whose atlas is gone ends after its cell). Workers run in their own session: a Ctrl-C in the
terminal reaches the atlas alone, which stops each running cell with one SIGINT (:meth:`stop`).
With GPUs, each worker is pinned to one (CUDA_VISIBLE_DEVICES) by its job slot, round robin, as
the process launcher pins each cell.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lnexp.atlas.launchers import Ended, LaunchSetup, register
from lnexp.atlas.outcomes import Cell
from lnexp.exit_status import Exit, of_process
from lnexp.logs import loggers_state, restore_loggers

STOP_GRACE_S = 60.0  # after stop(), how long a running cell may take to record its interruption


# --- the worker process ---------------------------------------------------------------------------


class ProcessState:
    """What a fresh process has of the state that ``lnexp train`` changes for its process, captured
    once at the worker's start (after its imports, before any cell) and put back before each cell."""

    def __init__(self, loggers: dict[str, tuple] | None = None) -> None:
        import logging
        import random
        import warnings

        import numpy as np
        import torch

        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.argv, self.path = list(sys.argv), list(sys.path)
        self.signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        self.warning_filters = list(warnings.filters)
        self.threads = torch.get_num_threads()
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        self.log_disable = logging.root.manager.disable
        self.loggers = loggers if loggers is not None else loggers_state()

    def restore(self) -> None:
        """Back to the captured state; a cell's log handlers (Hydra's file handler in its run folder)
        are closed."""
        import gc
        import logging
        import random
        import warnings

        import numpy as np
        import torch
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig

        from lnexp import fairseq_adapter as fa

        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.argv[:], sys.path[:] = self.argv, self.path
        for s, handler in self.signals.items():
            signal.signal(s, handler)
        warnings.filters[:] = self.warning_filters
        warnings._filters_mutated()  # type: ignore[attr-defined]  # drop the per-module caches
        torch.set_num_threads(self.threads)
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])
        logging.disable(self.log_disable)
        restore_loggers(self.loggers)
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
        GlobalHydra.instance().clear()
        fa.fresh_process_state()
        if "torch._dynamo" in sys.modules:  # compile=true's compiled layers: the last cell's model's
            torch._dynamo.reset()
        gc.collect()  # the last cell's model, optimizer and data, before the next one's
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # its memory back to the device (other workers share it)


def train_cell(cell: list[str], fresh: ProcessState) -> int:
    """One cell, as ``lnexp train CELL`` in its own process would train it; its exit status."""
    from lnexp.cli import main

    fresh.restore()
    try:
        return int(main(["train", *cell]) or 0)
    except SystemExit as e:  # Hydra's and argparse's own errors
        return e.code if isinstance(e.code, int) else Exit.CRASH
    except KeyboardInterrupt:  # between lnexp train's own handlers: the cell was interrupted
        return Exit.INTERRUPTED
    except Exception:  # lnexp train's own handlers report a run's failure; this is anything else
        import traceback

        traceback.print_exc()
        return Exit.CRASH
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(cells: IO[str], results: IO[str]) -> int:
    """Train each cell read from ``cells`` and write its end to ``results``, until end of input."""
    root = loggers_state()[""]
    _preload()
    # the loggers as lnexp's modules set them on import (fairseq's at WARNING), but the root as it
    # was before: an import (fairseq's) may configure it, where lnexp train, which sets up its own
    # log lines before importing fairseq, would not let it
    fresh = ProcessState({**loggers_state(), "": root})
    while True:
        try:
            line = cells.readline()
        except KeyboardInterrupt:  # the atlas stops: no cell running here
            return Exit.INTERRUPTED
        if not line:
            return Exit.OK
        job = json.loads(line)
        t0 = time.monotonic()
        try:
            status = train_cell(list(job["cell"]), fresh)
        except KeyboardInterrupt:  # a second interrupt while the first was being recorded
            status = Exit.INTERRUPTED
        results.write(json.dumps({"index": job["index"], "status": status,
                                  "seconds": round(time.monotonic() - t0, 3)}) + "\n")
        results.flush()


def _preload() -> None:
    """The imports every cell needs, once (the point of a worker); lnexp's first, as in lnexp train
    (lnexp.fairseq_adapter quiets fairseq's logger before fairseq is imported)."""
    import importlib

    for name in ("lnexp.cli", "lnexp.fairseq_adapter", "torch", "hydra", "fairseq.trainer",
                 "lnexp.model", "lnexp.train.run", "lnexp.train.loop"):  # (lnexp.model registers the
        importlib.import_module(name)                                    # architectures)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lnexp.atlas.worker",
                                 description="trains the atlas's cells read from stdin (WorkerLauncher)")
    ap.add_argument("--result-fd", type=int, required=True, help="where each cell's end is written")
    ap.add_argument("--shared", action="store_true",
                    help="other workers share the host: OpenMP threads wait passively")
    args = ap.parse_args(argv)
    # SIGINT is how stop() interrupts a cell: a worker started from a background job (`make atlas
    # &`, nohup) would inherit it ignored, and Python would then never raise KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.shared:  # before torch is imported, as lnexp train does beside other trainings
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with os.fdopen(args.result_fd, "w") as results:
        return serve(sys.stdin, results)


# --- the atlas's side -----------------------------------------------------------------------------


@dataclass
class _Worker:
    proc: subprocess.Popen
    slot: int  # its job slot: its GPU is setup.gpu(slot)
    index: int | None = None  # the cell it trains, if any (its index in the round)
    cell: Cell | None = None  # that cell
    t0: float = 0.0
    reported: bool = False
    reader: threading.Thread | None = field(default=None, repr=False)


class WorkerLauncher:
    """``jobs`` worker processes, kept from round to round (the imports and the CUDA context are
    paid once per atlas); each trains the next queued cell as soon as it is free. ``python``: the
    interpreter a worker runs in; ``env``: its environment (None: this process's)."""

    name = "worker"

    def __init__(self, setup: LaunchSetup, log: Callable[[str], None] = print, python: str = sys.executable,
                 env: dict[str, str] | None = None) -> None:
        self.setup, self.log, self.python, self.env = setup, log, python, env
        self.workers: list[_Worker] = []
        self.events: queue.Queue[tuple[_Worker, dict[str, Any] | None]] = queue.Queue()
        self.stopping = False
        atexit.register(self.close)  # (without it too, a worker ends at the end of its input)

    # the protocol

    def run_round(self, cells: Sequence[Cell], jobs: int, ended: Callable[[Ended], None]) -> None:
        todo = deque(enumerate(cells))
        try:
            while True:
                if not self.stopping:
                    self._assign(todo, jobs)
                busy = [w for w in self.workers if w.index is not None]
                if not busy and (self.stopping or not todo):
                    return
                try:
                    worker, msg = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                self._handle(worker, msg, ended)
        except KeyboardInterrupt:  # the atlas had no handler of its own: stop, then let it through
            self.stop()
            self._drain(ended)
            raise
        finally:
            if self.stopping:
                self._drain(ended)

    def stop(self) -> None:
        """Queued cells never start; each running one gets one SIGINT (lnexp train records it as
        interrupted). Only a flag and os.kill: safe in a signal handler."""
        self.stopping = True
        for w in list(self.workers):
            if w.index is not None and w.proc.poll() is None:
                try:
                    os.kill(w.proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        """End the workers (end of their input); an idle worker exits at once."""
        for w in self.workers:
            try:
                w.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        for w in self.workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self.workers.clear()

    def __enter__(self) -> WorkerLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the rest

    def _assign(self, todo: deque, jobs: int) -> None:
        """The next queued cells to free workers (started as needed), ``jobs`` cells at a time."""
        while todo and sum(w.index is not None for w in self.workers) < jobs:
            w = next((w for w in self.workers if w.index is None), None) or self._start(jobs)
            index, cell = todo.popleft()
            w.index, w.cell, w.t0 = index, cell, time.monotonic()
            line = {"index": index, "cell": self.setup.command(cell)}
            try:
                w.proc.stdin.write(json.dumps(line) + "\n")  # type: ignore[union-attr]
                w.proc.stdin.flush()  # type: ignore[union-attr]
            except OSError:  # it died while idle: its reader reports it, with this cell
                pass

    def _start(self, jobs: int) -> _Worker:
        """A new worker on the first job slot no live worker holds (a dead one's slot is reused)."""
        held = {w.slot for w in self.workers}
        slot = next(k for k in range(len(self.workers) + 1) if k not in held)
        env = {**(self.env if self.env is not None else os.environ), **self.setup.gpu(slot)}
        r, wfd = os.pipe()
        cmd = [self.python, "-m", "lnexp.atlas.worker", "--result-fd", str(wfd)]
        # an atlas started in the background ignores SIGINT, and a child would inherit that until
        # its own handler is set: a stop() in that window would be lost
        ignored = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            proc = subprocess.Popen([*cmd, *(["--shared"] if jobs > 1 else [])], stdin=subprocess.PIPE,
                                    text=True, pass_fds=(wfd,), env=env, start_new_session=True)
        finally:
            if ignored:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.close(wfd)
        w = _Worker(proc, slot)
        w.reader = threading.Thread(target=self._read, args=(w, os.fdopen(r)), daemon=True)
        w.reader.start()
        self.workers.append(w)
        return w

    def _read(self, w: _Worker, results: IO[str]) -> None:
        with results:
            for line in results:
                self.events.put((w, json.loads(line)))
        self.events.put((w, None))  # end of the pipe: the worker ended

    def _handle(self, w: _Worker, msg: dict[str, Any] | None, ended: Callable[[Ended], None]) -> None:
        if msg is not None:
            if w.index == msg["index"]:
                w.index = None
                ended(Ended(msg["index"], float(msg["seconds"]), int(msg["status"])))
            return
        rc = w.proc.wait()
        if w in self.workers:
            self.workers.remove(w)
        if w.index is not None and not w.reported:  # reported once; its cell counts as failed
            w.reported = True
            status = Exit.INTERRUPTED if self.stopping else of_process(rc) if rc < 0 else Exit.CRASH
            if not self.stopping:  # (a worker stopped between two cells ends: no failure)
                self.log(self._death(w, rc))
            index, w.index = w.index, None
            ended(Ended(index, time.monotonic() - w.t0, status))

    def _death(self, w: _Worker, rc: int) -> str:
        """The line that reports a worker dead under its cell: the cell, its command line and folder."""
        how = (f"was killed by signal {-rc} ({signal.Signals(-rc).name})" if rc < 0
               else f"ended (exit status {rc})")
        assert w.cell is not None
        folder = _folder_of(w.proc.pid, self.setup.runs_root)
        return (f"lnexp atlas: the worker (pid {w.proc.pid}) {how} while training the cell {w.cell.label} "
                f"(`lnexp train {' '.join(self.setup.command(w.cell))}`{f', {folder}' if folder else ''}): "
                "the cell counts as failed")

    def _drain(self, ended: Callable[[Ended], None]) -> None:
        """After stop(): wait for the running cells to record their interruption (killed past
        STOP_GRACE_S)."""
        deadline = time.monotonic() + STOP_GRACE_S
        while any(w.index is not None for w in self.workers):
            if time.monotonic() > deadline:
                for w in self.workers:
                    if w.index is not None:
                        w.proc.kill()
                deadline = float("inf")
            try:
                worker, msg = self.events.get(timeout=0.5)
            except queue.Empty:
                continue
            self._handle(worker, msg, ended)


def _folder_of(pid: int, root: Path) -> Path | None:
    """The run folder under ``root`` that process ``pid`` was training (its status.json says so);
    None where none is."""
    for status in root.glob("**/status.json"):
        try:
            if json.loads(status.read_text()).get("pid") == pid:
                return status.parent
        except (OSError, ValueError):
            continue
    return None


if __name__ == "__main__":
    sys.exit(main())


register("worker", "long-lived worker processes, each training cells one after another in one "
         "process (imports, CUDA context paid once)", WorkerLauncher)
