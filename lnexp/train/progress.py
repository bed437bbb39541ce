"""Sweep progress, one line per epoch: which run (k of N), which epoch, time left.

    progress.log_epoch(cfg, run_dir, record)   # after each epoch, record = the metrics.jsonl row

N comes from the sweep definition that Hydra saved in ``<sweep dir>/multirun.yaml`` (the sweeper's
params plus the command-line overrides); time left assumes the remaining runs take as long per epoch
as this one (runs one after another, as the basic launcher does). Outside a sweep: the run's own ETA.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger("lnexp.train")


def sweep_size(multirun_yaml: Path) -> int | None:
    """Number of jobs of the sweep saved in multirun.yaml (None if unknown)."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(multirun_yaml)
        params = OmegaConf.to_container(cfg.hydra.sweeper.params or {}, resolve=False) or {}
        items = [f"{k}={v}" for k, v in params.items()] + list(cfg.hydra.overrides.task)
        sizes: dict[str, int] = {}
        for o in OverridesParser.create().parse_overrides(items):
            n = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
            sizes[o.get_key_element()] = n
        return math.prod(sizes.values())
    except Exception:
        return None


def _hms(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def message(run_name: str, epoch: int, max_epoch: int, wall_s: float, job: int | None,
            total: int | None) -> str:
    per_epoch = wall_s / max(epoch, 1)
    run_left = per_epoch * max(max_epoch - epoch, 0)
    where = f"run {job + 1}/{total} " if job is not None and total else ""
    line = f"{where}{run_name} | epoch {epoch}/{max_epoch} | run left ~{_hms(run_left)}"
    if job is not None and total:
        line += f" | sweep left ~{_hms(run_left + (total - job - 1) * per_epoch * max_epoch)}"
    return line


def log_epoch(cfg: Any, run_dir: Path, record: dict[str, Any]) -> str:
    job = total = None
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            job = int(hc.job.num)
            total = sweep_size(Path(hc.sweep.dir) / "multirun.yaml")
    except Exception:  # not under Hydra (tests, scripts)
        pass
    line = message(Path(run_dir).name, int(record["epoch"]), int(cfg.max_epoch),
                   float(record.get("wall_s", 0.0)), job, total)
    log.info("progress: %s", line)
    return line


def sweep_eta(sweep_dir: Path, job: int, total: int | None, max_epoch: int) -> str:
    """Time left for the sweep: the mean time per epoch of the runs already finished under
    ``sweep_dir`` (any experiment: runs of one scale take about as long per epoch) x the epochs of
    this job and the ones after it."""
    from lnexp.train.runlog import read_json

    per_epoch = []
    for status in Path(sweep_dir).glob("*/status.json"):
        s = read_json(status, {}) or {}
        if s.get("status") in ("done", "diverged") and s.get("wall_s") and s.get("epoch"):
            per_epoch.append(float(s["wall_s"]) / int(s["epoch"]))
    if not total or not per_epoch:
        return "time left: unknown until a run finishes"
    left = (total - job) * max_epoch * sum(per_epoch) / len(per_epoch)
    return (f"~{_hms(left)} left ({max_epoch} epochs per run, mean epoch time of {len(per_epoch)} "
            "finished runs)")


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
                     sweep_eta(sweep_dir, job, total, int(config.max_epoch)))
        except Exception as e:  # progress must never stop a sweep
            log.debug("progress: %s", e)
