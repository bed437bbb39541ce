"""The atlas's rounds on a cluster: each round one submitit job array, waited for.

``lnexp atlas --launcher submitit_slurm`` sends each round's cells to SLURM as one array job (at most
``--jobs`` of its tasks at once: the array's parallelism), polls it until every task has ended, and
goes on with the adaptive plan as it does locally: each task is ``lnexp train`` of one cell, run
in-process in the task (its folder, resume, skip-if-finished, statuses are lnexp train's own), so
the runs land in runs_root, which must be on a file system the nodes share. A task that fails
(killed, out of memory, timed out, node lost) is reported once, in one line naming its error file,
and counts as a failed cell. ``submitit_local`` runs the same arrays as local processes: it is how
this is tested on CPU (tests/test_atlas_launchers.py), with real submitit.

Its settings are those of Hydra's submitit launcher (hydra-submitit-launcher's ``SlurmQueueConf``:
``partition``, ``timeout_min``, ``gpus_per_node``, ``cpus_per_task``, ``mem_gb``, ``account``,
``qos``, ``constraint``, ``additional_parameters``, ``setup``, ...), given as the same overrides a
``lnexp train -m ... hydra/launcher=submitit_slurm`` sweep takes, among the atlas's overrides:
``lnexp atlas --launcher submitit_slurm hydra.launcher.partition=gpu hydra.launcher.timeout_min=30``.
They configure the array and are not passed to the cells.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnexp import overrides as override
from lnexp.atlas.launchers import Ended, LaunchSetup, register
from lnexp.atlas.outcomes import Cell
from lnexp.errors import UserError
from lnexp.exit_status import Exit

CANCEL_GRACE_S = 180.0  # after a cancel, how long to wait for the scheduler to say the tasks ended
POLL_S = {"slurm": 15.0, "local": 1.0}  # how often a round's tasks are looked at (sacct is not free)


@dataclass
class TrainCell:
    """One task of the array: ``lnexp train`` of a cell's command line in the task's own process;
    its exit status (lnexp.exit_status.Exit) is the task's result."""

    command: list[str]

    def __call__(self) -> int:
        from lnexp.cli import main

        return int(main(["train", *self.command]) or 0)


def launcher_settings(cluster: str, runs_root: Path, settings: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """(submitit's folder, the executor's parameters) from Hydra's submitit launcher config for
    ``cluster`` and the ``hydra.launcher.*`` overrides among ``settings``, mapped as
    hydra-submitit-launcher maps them."""
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, LocalQueueConf, SlurmQueueConf
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    @dataclass
    class LocalConf(LocalQueueConf):
        setup: list[str] | None = None  # shell lines before each task, as SLURM's (submitit has it)

    schema = SlurmQueueConf if cluster == "slurm" else LocalConf
    conf, default = OmegaConf.structured(schema), OmegaConf.structured(schema)
    conf.submitit_folder = str(Path(runs_root) / ".submitit" / "%j")  # Hydra's: the sweep dir's
    conf.name = "lnexp-atlas"
    try:
        for o in settings:
            if override.is_launcher(o) and override.key(o) != override.LAUNCHER_GROUP:
                key, parsed = override.launcher_key(o), override.parse(o)
                # ~hydra.launcher.KEY: the key's default (the launcher's config keeps every key)
                value = OmegaConf.select(default, key, throw_on_missing=False) if parsed.is_delete() else \
                    parsed.value()
                OmegaConf.update(conf, key, value, merge=True)
        params = OmegaConf.to_container(conf, resolve=True)
    except OmegaConfBaseException as e:
        keys = ", ".join(k for k in conf if k != "_target_")
        raise UserError(f"hydra.launcher: {str(e).splitlines()[0]} (submitit_{cluster}'s keys: "
                        f"{keys})") from None
    assert isinstance(params, dict)
    params.pop("_target_", None)
    folder = str(params.pop("submitit_folder"))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    return folder, {k if k in base else f"{cluster}_{k}": v for k, v in params.items()}


class SubmititLauncher:
    """Each round one job array of ``cluster`` ("slurm" or "local"), polled until it has ended."""

    def __init__(self, cluster: str, setup: LaunchSetup, log: Callable[[str], None] = print,
                 poll_s: float | None = None) -> None:
        self.cluster, self.setup, self.log = cluster, setup, log
        self.name = f"submitit_{cluster}"
        self.poll_s = POLL_S[cluster] if poll_s is None else poll_s
        launcher_settings(cluster, setup.runs_root, setup.settings)  # a mistake is one line now
        self.stopping = False
        self.last_submit_s: float | None = None  # seconds the last round's submission took

    def run_round(self, cells: Sequence[Cell], jobs: int, ended: Callable[[Ended], None]) -> None:
        # SLURM: one array, --jobs its parallelism. submitit's local executor starts every task of an
        # array at once, so there a round is arrays of --jobs tasks, one after the other.
        step = len(cells) if self.cluster == "slurm" else max(jobs, 1)
        for first in range(0, len(cells), max(step, 1)):
            if self.stopping:
                return
            self._array(cells[first:first + step], first, jobs, ended)

    def _array(self, cells: Sequence[Cell], first: int, jobs: int, ended: Callable[[Ended], None]) -> None:
        """One job array of ``cells`` (the round's from index ``first``), polled until it ends."""
        import submitit

        folder, params = launcher_settings(self.cluster, self.setup.runs_root, self.setup.settings)
        init = {k: params.pop(k) for k in list(params) if k.endswith("max_num_timeout")}  # a ctor arg
        try:
            executor = submitit.AutoExecutor(folder=folder, cluster=self.cluster, **init)
        except RuntimeError as e:  # submitit_slurm where there is no SLURM ("Could not detect srun")
            raise UserError(f"--launcher {self.name}: {e}: run lnexp atlas on the cluster's login node, "
                            "or use --launcher worker here") from None
        if self.cluster == "slurm":
            params["slurm_array_parallelism"] = jobs  # the atlas's --jobs: tasks at once
        executor.update_parameters(**params)
        t0 = time.monotonic()
        with executor.batch():
            tasks = [executor.submit(TrainCell(self.setup.command(c))) for c in cells]
        self.last_submit_s = time.monotonic() - t0
        self.log(f"lnexp atlas: {len(tasks)} cells submitted as {self.name} job "
                 f"{tasks[0].job_id.split('_')[0]} ({self.last_submit_s:.1f} s; logs in "
                 f"{Path(folder).parent})")
        pending = {first + k: task for k, task in enumerate(tasks)}
        cancelled_at: float | None = None
        next_look = 0.0
        while pending:
            if self.stopping and cancelled_at is None:
                for task in pending.values():
                    task.cancel(check=False)
                cancelled_at = time.monotonic()
            if cancelled_at is not None and time.monotonic() - cancelled_at > CANCEL_GRACE_S:
                for i in sorted(pending):
                    ended(Ended(i, time.monotonic() - t0, Exit.INTERRUPTED))
                return
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + self.poll_s
                for i, task in list(pending.items()):
                    if task.done():
                        del pending[i]
                        ended(Ended(i, time.monotonic() - t0, self._status(i, task)))
            time.sleep(0.2)  # short: a stop() is acted on at once

    def _status(self, i: int, task) -> int:
        """The task's exit status; a task that did not return one is reported here, once."""
        try:
            return int(task.result())
        except Exception as e:  # submitit's FailedJobError / UncompletedJobError: no result
            if self.stopping:
                return Exit.INTERRUPTED
            last = next((ln.strip() for ln in reversed(str(e).splitlines()) if ln.strip()), "")
            self.log(f"lnexp atlas: {self.name} job {task.job_id} (cell {i}) failed ({task.state}): "
                     f"{last[:200]}; see {task.paths.stderr}")
            return Exit.CRASH

    def stop(self) -> None:
        """Queued cells never start: the round's array is cancelled (at the next look, within
        0.2 s); running tasks get the scheduler's SIGTERM (SLURM) or SIGINT (local), which lnexp
        train records as interrupted. Only a flag: safe in a signal handler."""
        self.stopping = True


def _factory(cluster: str) -> Callable[..., SubmititLauncher]:
    return lambda setup, **options: SubmititLauncher(cluster, setup, **options)


register("submitit_slurm", "each round one SLURM job array through submitit "
         "(hydra.launcher.* overrides: partition, timeout_min, gpus_per_node, ...)", _factory("slurm"))
register("submitit_local", "each round job arrays of submitit's local executor (tests a SLURM setup "
         "on one machine)", _factory("local"))
