"""One training run: fairseq's Trainer driven epoch by epoch, exactly as fairseq-train drives it,
plus per-epoch validation loss and BLEU, per-update logs, divergence and resumable checkpoints.

It reads top to bottom: ``train_process`` builds the run's ``Session`` (lnexp.train.session: the
config resolved once into a typed ``RunSetup``, then fairseq's objects from it); ``Training``
trains it epoch by epoch (``_one_epoch``, ``_end_of_epoch``) and finishes. What only rank 0
does is in lnexp.train.rank0; what a checkpoint carries of lnexp's
progress is ``RunState`` (lnexp.train.state).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lnexp import fairseq_adapter as fa
from lnexp import run_status, rundir
from lnexp.plural import count
from lnexp.rundir import read_json, run_paths
from lnexp.runtime import runlock
from lnexp.runtime.sharing import Sharing
from lnexp.train import room, speed
from lnexp.train.divergence import PlateauRule, non_finite
from lnexp.train.rank0 import OtherRank, Rank0
from lnexp.train.session import Session
from lnexp.train.settings import Resolved
from lnexp.train.state import RunState, zero_sums

log = logging.getLogger("lnexp.train")
STEP_DIVERGED = f"{run_status.NON_FINITE} loss or gradient"  # the reason of a NaN/inf update


def finished(run_dir: Path, max_epoch: int, max_update: int = 0) -> dict | None:
    """The run's final status (normalised, lnexp.run_status) if it already went as far as asked;
    None if there is more to do (a longer max_epoch or max_update extends a finished run in place).
    A diverged run, or one that divergence.stop ended on the plateau, is never extended."""
    status = run_status.normalise(read_json(run_paths(run_dir)["status"], {}) or {})
    word = status.get("status")
    if word == "diverged" or (word == "plateau" and status.get("ended_early")):
        return status
    epochs = int(status.get("epoch") or 0) - (not status.get("last_epoch_complete", True))
    if word in run_status.FINAL and (
            epochs >= max_epoch or (max_update and status.get("updates", 0) >= max_update)):
        return status
    return None


def extends(run_dir: Path, max_epoch: int, max_update: int) -> str | None:
    """The line that says a launch extends an earlier, finished run (a trial run of the same
    configuration with a shorter length, or a run given a longer one); None if it does not."""
    before = read_json(run_paths(run_dir)["status"], {}) or {}
    status = run_status.normalise(before, before.get("max_epoch"))
    if status.get("status") not in run_status.FINAL:
        return None
    was = run_status.note(status) if status["status"] != "done" else \
        f"done at {count(status.get('updates') or 0, 'update')}, {count(status.get('epoch') or 0, 'epoch')}"
    length = f"max_epoch={max_epoch}" + (f", max_update={max_update}" if max_update else "")
    return (f"{run_dir}: extends the earlier run from update {status.get('updates')} (it was {was}) "
            f"to {length}; {rundir.METRICS} is appended to")


def train_run(cfg: DictConfig, run_dir: Path, on_start=None,
              resolved: Resolved | None = None) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; returns its final status. ``on_start()`` runs once
    the run is this launch's to train (not finished, its lock taken): lnexp train writes the run's
    .hydra/ then, so that a skipped or refused launch changes nothing in the folder. ``resolved``:
    the config resolved already (lnexp train's check before Hydra); else the run resolves it."""
    from lnexp.train import distributed

    done = finished(run_dir, int(cfg.max_epoch), int(cfg.max_update))
    if done is not None:
        log.info("%s: already %s, skipping", run_dir,
                 run_status.note(done) or f"{done['status']} at epoch {done.get('epoch')}")
        return done
    rank0 = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 holds the run's lock
    extension = extends(run_dir, int(cfg.max_epoch), int(cfg.max_update)) if rank0 else None
    if extension:
        log.info("%s", extension)  # the run's first line: a longer run continues this folder
    run_dir.mkdir(parents=True, exist_ok=True)
    with runlock.hold(run_dir) if rank0 else contextlib.nullcontext():
        # (under the lock: a run another process trains is refused as such first)
        if extension and not run_paths(run_dir)["last"].is_file():
            from lnexp.errors import UserError

            raise UserError(f"{run_dir} has no checkpoint to extend (checkpoint.at_end=delete, as "
                            "atlas cells run, deletes them when a run ends): delete that folder to train "
                            "it again at the new length")
        if on_start is not None:  # every rank: each has its own Hydra files and log handler
            on_start()
        status = distributed.launch(cfg, run_dir, train_process, resolved)
        if rank0:  # an earlier launch's traceback: this one resumed past it
            run_paths(run_dir)["error_log"].unlink(missing_ok=True)
        return status


def train_process(cfg: DictConfig, run_dir: Path, dist=None,
                  resolved: Resolved | None = None) -> dict[str, Any]:
    """The training of one process: the whole run, or one rank of a data-parallel run (``dist``:
    fairseq's distributed settings of the rank, see lnexp.train.distributed)."""
    sharing = Sharing(speed.threads(cfg), run_dir)
    try:
        return Training(Session.build(cfg, run_dir, dist, resolved), sharing).train()
    finally:
        sharing.close()


class Training:
    """One process's training: a built ``Session``, then epoch by epoch, then finished."""

    def __init__(self, session: Session, sharing: Sharing) -> None:
        """Set-up: the session's fairseq objects (restored from the checkpoint the run resumes
        from) with lnexp's state; rank 0 describes the run."""
        setup = session.setup
        self.setup, self.sharing = setup, sharing
        self.task, model, self.trainer = session.task, session.model, session.trainer
        self.step, self.epoch_itr = session.step, session.epoch_itr
        extra, profiled = session.extra_state, session.profiled
        self.state = RunState.from_checkpoint(extra)
        if profiled is not None:
            self.state.profiled_init = profiled
        if setup.master:  # (rank 0 writes the checkpoints)
            room.check(setup, sum(p.numel() for p in model.parameters()))
        self.rank0 = Rank0(setup) if setup.master else OtherRank(setup)
        cache = Path(setup.data.bin_dir) / f"unigram_entropy.{setup.data.tgt}.json"
        self.rule = PlateauRule.of_targets(self.task.dataset("train").tgt, cache,
                                           setup.plateau_epoch, setup.plateau_margin,
                                           setup.plateau_min_updates)
        self.rank0.start(self.task, model, self.trainer, self.epoch_itr, self.state,
                         self.rule.entropy_bits)
        # perf_counter at the run's start, the time of the processes before this one included
        self.t0 = time.perf_counter() - self.state.wall_s

    def train(self) -> dict[str, Any]:
        """Epoch after epoch until max_epoch, max_update or a divergence; the final status."""
        try:
            # (a resume whose checkpoint is at max_update already trains nothing: a kill after
            # that checkpoint, before the status was written, leaves no status to say it ended)
            while self.epoch_itr.next_epoch_idx <= self.setup.max_epoch and not self._reached():
                epoch = self.epoch_itr.next_epoch_idx
                if not self._one_epoch(epoch) or self._end_of_epoch(epoch):
                    break
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say so; the last checkpoint resumes it
            self.rank0.interrupted(self.state, self.trainer.get_num_updates())
            raise
        finally:
            self.rank0.close()
        return self._finish()

    def _reached(self) -> bool:
        """Whether the updates done reach max_update (0: no limit)."""
        return bool(self.setup.max_update) and self.trainer.get_num_updates() >= self.setup.max_update

    def _one_epoch(self, epoch: int) -> bool:
        """The epoch's updates (up to max_update); False if the loss went non-finite in it (the run
        stops there, without validating it)."""
        setup, trainer, state = self.setup, self.trainer, self.state
        itr = self.epoch_itr.next_epoch_itr(fix_batches_to_gpus=False,
                                            shuffle=epoch > setup.fcfg.dataset.curriculum)
        itr = fa.grouped(itr, setup.fcfg)
        self.rank0.begin_epoch(len(itr))
        trainer.begin_epoch(epoch)
        for samples in itr:
            lr = trainer.get_lr()
            self.sharing.refresh()
            step = self.step(trainer, samples)
            n = trainer.get_num_updates()
            if step is not None and step.get("overflow"):  # fp16: scale lowered, no update
                state.overflows += 1
                continue
            if step is None or non_finite(step["loss"]):
                state.diverged = {"reason": STEP_DIVERGED, "update": n + 1,
                                  "epoch": epoch}
                return False
            row = {"update": n, "epoch": epoch, "lr": lr, **step, "overflows": state.overflows}
            self.rank0.after_update(row, itr.n, time.perf_counter() - self.t0, len(state.history))
            state.add_update(step)
            if self._reached():
                break
            if setup.save_every and n % setup.save_every == 0 and not self.epoch_itr.end_of_epoch():
                self._save(end_of_epoch=False)
        # a plateau verdict of an earlier epoch with divergence.stop=false trains on: this epoch
        # is validated, and judged, like any other
        return True

    def _end_of_epoch(self, epoch: int) -> bool:
        """Validation (on rank 0, its record broadcast), the lr step, the plateau rule, the
        epoch's checkpoint; True if the run stops here."""
        setup, trainer, state, rule = self.setup, self.trainer, self.state, self.rule
        self.rank0.validating(epoch, len(state.history), trainer.get_num_updates())
        record, state.signature = fa.broadcast_from_master(
            self.rank0.validate(self.task, trainer, epoch, state, self.t0))
        state.record(record)
        if self.epoch_itr.end_of_epoch():  # else max_update stopped it: an extension goes on
            state.acc = zero_sums()
        trainer.lr_step(epoch, record["valid_loss"])
        if not (math.isfinite(record["valid_loss"]) and math.isfinite(record["valid_nll_loss"])):
            state.diverged = {"reason": f"{run_status.NON_FINITE} validation loss",
                              "update": record["updates"], "epoch": epoch}
        elif rule.applies(epoch, record["updates"]):
            verdict = rule.verdict(record)  # replaces the verdict of the epoch before
            if state.plateau and verdict is None:
                state.left_plateau = {"update": record["updates"], "epoch": epoch}
            state.plateau = verdict
        stopped = self._reached()
        self.rank0.epoch_done(record, stopped)
        self._save(end_of_epoch=True)
        self.rank0.keep_checkpoints(epoch, state.history)
        if state.diverged or (state.plateau and setup.stop_on_plateau):
            return True
        return stopped

    def _save(self, end_of_epoch: bool) -> None:
        """A checkpoint with lnexp's state, after rank 0's logs (they hold its updates)."""
        state, n = self.state, self.trainer.get_num_updates()
        state.wall_s = time.perf_counter() - self.t0
        state.saved_update = n
        self.rank0.before_checkpoint(state.history, end_of_epoch)
        _save_checkpoint(self.trainer, self.epoch_itr, state, self.setup.paths)
        self.rank0.checkpoint_saved(len(state.history), n)

    def _finish(self) -> dict[str, Any]:
        """The run's final status (rank 0 writes it, and sacreBLEU's signature into run.json): the
        words of lnexp.run_status."""
        setup, state, n = self.setup, self.state, self.trainer.get_num_updates()
        div, epochs = state.diverged, len(state.history)
        if div and div["reason"] == STEP_DIVERGED:  # (a validation's was saved with its epoch)
            self._save(end_of_epoch=True)
        reached, cut = self._reached(), self._cut_short()
        full = epochs >= setup.max_epoch and not cut
        word = ("diverged" if div else "plateau" if state.plateau
                else "stopped" if reached and not full else "done")
        status = {"status": word, "epoch": epochs, "updates": n,
                  "max_epoch": setup.max_epoch, "max_update": setup.max_update,
                  "diverged": div, "plateau": state.plateau, "left_plateau": state.left_plateau,
                  "ended_early": bool(div or state.plateau) and not full and not reached,
                  "max_update_reached": reached, "last_epoch_complete": not cut,
                  "wall_s": round(time.perf_counter() - self.t0, 1)}
        last = state.history[-1] if state.history else {"epoch": 0, "updates": n}
        if not div and (why := self.rule.not_applied(last["epoch"], last["updates"])):
            status["plateau_rule"] = why
        self.rank0.finish(status, state.signature)
        return status

    def _cut_short(self) -> bool:
        """Whether max_update ended the last epoch before its end."""
        try:
            return not self.epoch_itr.end_of_epoch()
        except AttributeError:  # no epoch begun in this process: the checkpoint says where it is
            return bool(getattr(self.epoch_itr, "iterations_in_epoch", 0))


def _save_checkpoint(trainer, epoch_itr, state: RunState, paths: dict[str, Path]) -> None:
    """fairseq's checkpoint (every rank takes part; rank 0 writes it), replacing checkpoint_last.pt
    atomically; the one it replaces is kept as checkpoint_previous.pt."""
    paths["last"].parent.mkdir(parents=True, exist_ok=True)
    trainer.consolidate_optimizer()
    ckpt = fa.checkpoint_state(trainer, {"train_iterator": epoch_itr.state_dict(),
                                          "lnexp": state.to_checkpoint()})
    if ckpt is not None:
        rundir.write_keeping_previous(paths["last"], paths["previous"],
                                      lambda tmp: fa.save_checkpoint_file(ckpt, tmp))
