"""Data-parallel training through fairseq's distributed runtime (docs/multi-gpu.md).

``launch(cfg, run_dir, body, resolved)`` calls ``body(cfg, run_dir, dist, resolved)`` once per
data-parallel rank, each with the config resolved once (``settings.resolve``; here, if not given):

- ``distributed.world_size=1``: in this process, ``dist`` None;
- N > 1 on one node: fairseq's ``call_main`` spawns one worker per rank (per GPU; on CPU, N
  processes with gloo), each after fairseq's ``distributed_init``;
- under torchrun or SLURM (detected from the environment by fairseq's ``infer_init_method``):
  this process is one rank.

``dist`` is fairseq's ``distributed_training`` config of the rank (rank, device, rendezvous);
the body builds its Trainer with it, so fairseq wraps the model in DDP and shards the batches.
The data is prepared here, once, before any worker starts. Rank 0 writes the run folder; the
status returned is the one it wrote.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lnexp import fairseq_adapter as fa
from lnexp.rundir import read_json, run_paths
from lnexp.train import settings

log = logging.getLogger("lnexp.train")
Body = Callable[[DictConfig, Path, Any, settings.Resolved | None], dict[str, Any]]


def launch(cfg: DictConfig, run_dir: Path, body: Body,
           resolved: settings.Resolved | None = None) -> dict[str, Any]:

    # as fairseq-train: the checkpoint folder exists before the first update (fairseq writes
    # crash.pt there when it gives up)
    run_paths(run_dir)["checkpoints"].mkdir(parents=True, exist_ok=True)
    if _one_process(cfg):  # nothing to set up: the body prepares the data and builds fairseq's config
        return body(cfg, run_dir, None, resolved)
    # the data is prepared here, once, before the workers (they find it prepared)
    resolved = resolved if resolved is not None else settings.resolve(cfg)
    fcfg = settings.fairseq_setup(cfg, resolved.flags).config
    mode = fa.infer_init_method(fcfg)
    if mode is None:
        return body(cfg, run_dir, None, resolved)
    dt = fcfg.distributed_training
    log.info("data-parallel: world size %d, %s, %s (%s)", dt.distributed_world_size,
             dt.distributed_backend, dt.distributed_init_method,
             "one rank of torchrun/SLURM" if mode == "member" else "workers spawned here")
    result: dict[str, Any] = {}
    fa.call_main(fcfg, _rank_main, lnexp_cfg=cfg, run_dir=str(run_dir), body=body,
                 resolved=resolved, watch_parent=os.getpid() if mode == "spawn" else None,
                 result=result if mode == "member" else None)
    if result:
        return result
    return read_json(run_paths(run_dir)["status"], {}) or {"status": "failed"}


def _one_process(cfg: DictConfig) -> bool:
    """One process asked for, and no torchrun or SLURM rendezvous that fairseq would join."""
    d = cfg.distributed
    return (int(d.world_size) == 1 and d.init_method is None and int(d.port) <= 0
            and not all(k in os.environ for k in fa.TORCHRUN_ENV))


def _rank_main(fcfg, lnexp_cfg: DictConfig, run_dir: str, body: Body,
               resolved: settings.Resolved, watch_parent: int | None,
               result: dict | None = None, **_: Any) -> None:
    """One rank (fairseq's ``distributed_main`` calls this after ``distributed_init``)."""
    if watch_parent is not None:  # a spawned worker: its own interpreter, without our logging
        _setup_worker_logging(fa.is_master(fcfg))
        _exit_with_parent(watch_parent)
    status = body(lnexp_cfg, Path(run_dir), fcfg.distributed_training, resolved)
    fa.leave_process_group()
    if result is not None:
        result.update(status)


def _setup_worker_logging(master: bool) -> None:
    import warnings

    for category in (UserWarning, FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    logging.basicConfig(level=logging.INFO if master else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def _exit_with_parent(parent: int) -> None:
    """A spawned worker stops when the process that started it is gone (killed without a chance
    to stop its workers), instead of training on as an orphan."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="lnexp-parent-watch").start()
