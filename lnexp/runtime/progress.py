"""Progress of runs and sweeps: where a run is inside its epoch, which run of a sweep, time left.

    UpdateProgress(...).update(...)            # every update: a line each log_interval updates
                                               # (fairseq's manner), a live bar on a terminal
    progress.log_epoch(max_epoch, run_dir, record)   # after each epoch, record = the metrics.jsonl row
    DecodeProgress(label, sentences, tokens).step(n, t)  # lnexp evaluate/compare: decoding a set

N comes from the sweep definition that Hydra saved in ``<sweep dir>/multirun.yaml`` (the sweeper's
params plus the command-line overrides); time left assumes the remaining runs take as long per epoch
as the finished ones, run as many at a time as the launcher runs (joblib's n_jobs; one for the
basic launcher). Outside a sweep: the run's own ETA.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from lnexp.plural import count

log = logging.getLogger("lnexp.train")


def sweep_size(multirun_yaml: Path) -> int | None:
    """Number of jobs of the sweep saved in multirun.yaml (None if unknown)."""
    try:
        from omegaconf import OmegaConf

        from lnexp import overrides as override

        cfg = OmegaConf.load(multirun_yaml)
        swept = OmegaConf.select(cfg, "hydra.sweeper.params")
        params = OmegaConf.to_container(swept, resolve=False) if swept else {}
        items = [f"{k}={v}" for k, v in params.items()] + list(cfg.hydra.overrides.task)
        sizes: dict[str, int] = {}
        for o in override.parse_all(items):
            n = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
            sizes[o.get_key_element()] = n
        return math.prod(sizes.values())
    except Exception:
        return None


def parallel_jobs(hydra_cfg: Any) -> int:
    """How many jobs of a sweep run at once: the launcher's n_jobs (joblib; -1 = every core,
    -2 = all but one), else 1 (the basic launcher runs them one after another)."""
    try:
        n = int(hydra_cfg.launcher.n_jobs)
    except Exception:  # no n_jobs: basic, submitit (its own scheduler decides)
        return 1
    if n < 0:
        n = (os.cpu_count() or 1) + 1 + n
    return max(n, 1)


def _hms(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class UpdateProgress:
    """Lines such as ``epoch 1 | 20/128 | loss 9.12 | nll 8.90 | lr 0.0002 | gnorm 1.2 | 3302 tok/s |
    elapsed 25s | epoch left ~1m44s | run left ~4m20s``, every ``log_interval`` updates.

    Times left are the updates still to do times the mean update time of this process (validation
    not included); on a terminal a bar on stdout is redrawn after every update.
    """

    def __init__(self, log_interval: int, updates_per_epoch: int, run_updates: int,
                 live: bool | None = None) -> None:
        self.log_interval = max(int(log_interval), 1)
        self.per_epoch = updates_per_epoch
        self.run_updates = run_updates
        self.live = sys.stdout.isatty() if live is None else live
        self._t0 = time.perf_counter()
        self._done_here = 0  # updates done by this process (the rate excludes a resume's past)
        self._since = self._t0  # time of the last line; tokens since then
        self._tokens = 0.0

    def update(self, n: int, epoch: int, in_epoch: int, step: dict[str, float], lr: float,
               elapsed_s: float) -> str | None:
        """Record update ``n`` (``in_epoch`` of this epoch); returns the line when one is due."""
        now = time.perf_counter()
        self._done_here += 1
        per_update = (now - self._t0) / self._done_here
        self._tokens += step.get("ntokens", 0.0)
        epoch_left = per_update * max(self.per_epoch - in_epoch, 0)
        run_left = per_update * max(self.run_updates - n, 0)
        if self.live:
            self._draw(f"epoch {epoch} {_bar(in_epoch, self.per_epoch)} {in_epoch}/{self.per_epoch}"
                       f" | loss {step['loss']:.3f} | run left ~{_hms(run_left)}")
        if n % self.log_interval and in_epoch < self.per_epoch:
            return None
        rate = self._tokens / max(now - self._since, 1e-9)
        self._since, self._tokens = now, 0.0
        line = (f"epoch {epoch} | {in_epoch}/{self.per_epoch} | update {n} | loss {step['loss']:.3f} | "
                f"nll {step['nll_loss']:.3f} | lr {lr:.3g} | gnorm {step['gnorm']:.3f} | "
                f"{rate:.0f} tok/s | elapsed {_hms(elapsed_s)} | "
                f"epoch left ~{_hms(epoch_left)} | run left ~{_hms(run_left)}")
        if self.live:
            self._draw("")
        log.info(line)
        return line

    def close(self) -> None:
        if self.live:
            self._draw("")

    @staticmethod
    def _draw(text: str) -> None:
        sys.stdout.write("\r" + text[:150] + "\x1b[K")
        sys.stdout.flush()


class DecodeProgress:
    """Lines such as ``decoding test: 320/1000 sentences (32%) | 45s | ~1m35s left`` on stderr while
    ``lnexp evaluate`` or ``compare`` decodes a set: a beam search of a few minutes printed nothing and
    looked like a hang. A line every ``every_s`` seconds (and the last one); the time left is read
    from the source tokens still to decode, since fairseq's batches come shortest first and a count
    of sentences would promise too early an end."""

    def __init__(self, label: str, sentences: int, tokens: int, every_s: float = 10.0,
                 stream: Any = None) -> None:
        self.label, self.sentences, self.tokens = label, max(sentences, 1), max(tokens, 1)
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self._t0 = self._last = time.perf_counter()
        self._done = self._done_tokens = 0

    def step(self, sentences: int, tokens: int) -> str | None:
        """Record a decoded batch; returns the line when one is due."""
        now = time.perf_counter()
        self._done += sentences
        self._done_tokens += tokens
        if now - self._last < self.every_s and self._done < self.sentences:
            return None
        self._last = now
        elapsed = now - self._t0
        left = elapsed * max(self.tokens - self._done_tokens, 0) / max(self._done_tokens, 1)
        tail = "done" if self._done >= self.sentences else f"~{_hms(left)} left"
        line = (f"decoding {self.label}: {self._done}/{self.sentences} sentences "
                f"({100 * self._done // self.sentences}%) | {_hms(elapsed)} | {tail}")
        print(line, file=self.stream, flush=True)
        return line


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = int(width * done / max(total, 1))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def message(run_name: str, epoch: int, max_epoch: int, wall_s: float, job: int | None,
            total: int | None, parallel: int = 1) -> str:
    per_epoch = wall_s / max(epoch, 1)
    run_left = per_epoch * max(max_epoch - epoch, 0)
    where = f"run {job + 1}/{total} " if job is not None and total else ""
    line = f"{where}{run_name} | epoch {epoch}/{max_epoch} | run left ~{_hms(run_left)}"
    if job is not None and total:
        after = (total - job - 1) * per_epoch * max_epoch / max(parallel, 1)
        line += f" | sweep left ~{_hms(run_left + after)}"
    return line


def log_epoch(max_epoch: int, run_dir: Path, record: dict[str, Any], stopped: str | None = None
              ) -> str:
    """The per-epoch line; ``stopped`` names what ended the run early (e.g. ``max_update=20``)."""
    job = total = None
    parallel = 1
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            job = int(hc.job.num)
            total = sweep_size(Path(hc.sweep.dir) / "multirun.yaml")
            parallel = parallel_jobs(hc)
    except Exception:  # not under Hydra (tests, scripts)
        pass
    epoch = int(record["epoch"])
    line = message(Path(run_dir).name, epoch, epoch if stopped else int(max_epoch),
                   float(record.get("wall_s", 0.0)), job, total, parallel)
    if stopped:
        line = line.replace(f"epoch {epoch}/{epoch} ", f"epoch {epoch} (stopped at {stopped}) ")
    log.info("progress: %s", line)
    return line


def sweep_eta(sweep_dir: Path, job: int, total: int | None, max_epoch: int, parallel: int = 1,
              max_update: int = 0) -> str:
    """Time left for the sweep: what one run of it takes, from the runs already finished under
    ``sweep_dir`` (their time per epoch x ``max_epoch``; with ``max_update``, their time per update
    x ``max_update`` where that is less: a 5-update trial is not its epochs' length), x this job and
    the ones after it, divided by the jobs run at once. Runs that finished since this sweep started
    (multirun.yaml's time) count alone once there are any: other runs in the folder (a 2-epoch demo
    beside 120-update atlas runs) differ per epoch."""
    from lnexp.run_status import FINAL
    from lnexp.rundir import STATUS, read_json

    try:
        started = (Path(sweep_dir) / "multirun.yaml").stat().st_mtime
    except OSError:
        started = math.inf
    ours: list[float] = []
    others: list[float] = []
    for status in Path(sweep_dir).glob(f"*/{STATUS}"):
        s = read_json(status, {}) or {}
        if s.get("status") in FINAL and s.get("wall_s") and s.get("epoch"):
            wall = float(s["wall_s"])
            run_s = wall / int(s["epoch"]) * max_epoch
            if max_update and s.get("updates"):
                run_s = min(run_s, wall / int(s["updates"]) * max_update)
            (ours if status.stat().st_mtime >= started else others).append(run_s)
    per_run = ours or others
    if not total or not per_run:
        return "time left: unknown until a run finishes"
    parallel = max(parallel, 1)
    left = (total - job) * sum(per_run) / len(per_run) / parallel
    length = count(max_epoch, "epoch") + (f" or max_update={max_update}" if max_update else "")
    timed = "update and epoch times" if max_update else "epoch time"
    return (f"~{_hms(left)} left ({length} per run, mean {timed} of "
            f"{count(len(per_run), 'finished run')}" + (" of this sweep" if ours else "")
            + (f", {parallel} runs at a time)" if parallel > 1 else ")"))


try:
    from hydra.experimental.callback import Callback as _Callback
except ImportError:  # pragma: no cover
    _Callback = object


class ProgressCallback(_Callback):
    """Hydra callback: one line as each job of a sweep starts (run k of N, its directory, time left).

    Enabled by the experiment configs (hydra.callbacks.progress); the per-epoch line is log_epoch.
    """

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        try:
            from hydra.types import RunMode

            hc = config.hydra
            if hc.mode != RunMode.MULTIRUN:
                return
            job = int(hc.job.num)
            sweep_dir = Path(hc.sweep.dir)
            total = sweep_size(sweep_dir / "multirun.yaml")
            name = Path(hc.runtime.output_dir).name
            log.info("progress: run %d/%s %s | sweep %s", job + 1, total or "?", name,
                     sweep_eta(sweep_dir, job, total, int(config.max_epoch), parallel_jobs(hc),
                               int(config.get("max_update") or 0)))
        except Exception as e:  # progress must never stop a sweep
            log.debug("progress: %s", e)
