"""What rank 0 alone does in a training: it writes the run folder (status with heartbeat, run.json,
the validation references and hypotheses, the logs, TensorBoard, norm tracking, the best and epoch
checkpoints), prints the progress lines and computes validation loss and BLEU.

The other ranks of a data-parallel run get ``OtherRank``: the same calls, which do nothing, so the
training loop reads the same on every rank (fairseq's Trainer writes the checkpoint on rank 0 by
itself).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

from lnexp import fairseq_adapter as fa
from lnexp import run_status, rundir
from lnexp.decoding import BleuScorer
from lnexp.plural import count
from lnexp.rundir import read_json, write_json
from lnexp.runtime import progress
from lnexp.train.epoch_checkpoints import keep_epoch
from lnexp.train.runlog import RunLog
from lnexp.train.settings import RunSetup
from lnexp.train.state import RunState
from lnexp.train.validation import validation_loss

log = logging.getLogger("lnexp.train")
UNITS = {"loss": "bits/token (label-smoothed cross-entropy, base 2, as fairseq logs it)",
         "nll_loss": "bits/token (cross-entropy, base 2)", "bleu": "sacreBLEU (detokenised, 13a)",
         "bleu_tok": "BLEU on Moses-tokenised lowercased text (tokenize=none, multi-bleu style)",
         "wall_s": "seconds of training and validation since the run began"}


class Rank0:
    """Rank 0's share of one training (see the module's docstring)."""

    def __init__(self, setup: RunSetup) -> None:
        self.setup, self.paths = setup, setup.paths
        self.bar: progress.UpdateProgress | None = None

    def start(self, task, model, trainer, epoch_itr, state: RunState, entropy: float) -> None:
        """Say how the run starts; write run.json and the references; start the logs."""
        import torch

        n = trainer.get_num_updates()
        setup = self.setup
        _log_start(setup, n, epoch_itr, read_json(self.paths["status"], {}))
        self.runlog = RunLog(self.paths, n, tensorboard=True)
        self.scorer = BleuScorer(task, setup.data, **setup.eval)
        self.paths["hyps"].mkdir(exist_ok=True)
        rundir.write_text(self.paths["hyps"] / "valid.ref", "".join(r + "\n" for r in self.scorer.refs))
        write_json(self.paths["run"], {
            "config": setup.config, "data": setup.data.__dict__,
            "device": setup.device, "torch_threads": torch.get_num_threads(),
            "precision": {"name": setup.precision.name, "autocast": setup.precision.autocast,
                          "why": setup.precision.why},
            "params": sum(p.numel() for p in model.parameters()),
            "profiled_init": state.profiled_init,  # Admin's gains, as the fresh run set them
            "fairseq_flags": {k: str(v) for k, v in setup.fairseq.flags.items()},
            "stock_fairseq_train": setup.stock_command, "schedule": setup.schedule,
            "units": UNITS, "unigram_entropy_bits": entropy,
            "bleu_signature": None, "last_started": time.strftime("%FT%T"),
            "world_size": setup.world_size, "tokens_per_update_max": setup.tokens_per_update_max,
        })
        self.tracker = None
        if setup.track_every:
            from lnexp.train.norm_tracking import NormTracker

            self.tracker = NormTracker(trainer.model, self.paths["norms"], setup.track_every, n,
                                       tb=self.runlog.tb, grad_of=fa.stepped_grads(trainer))
        self.beat = _Heartbeat(self.paths["status"])
        self.beat({"status": "running", "epoch": len(state.history), "updates": n})

    def begin_epoch(self, updates_in_epoch: int) -> None:
        if self.bar is None:
            run_updates = updates_in_epoch * self.setup.max_epoch
            self.bar = progress.UpdateProgress(self.setup.log_interval, updates_in_epoch,
                                               min(run_updates, self.setup.max_update or run_updates))

    def after_update(self, row: dict[str, Any], in_epoch: int, elapsed_s: float,
                     epochs_done: int) -> None:
        """Log update ``row`` (its progress line when one is due, with status and updates.csv)."""
        self.runlog.update(row)
        n, epoch = row["update"], row["epoch"]
        if self.bar is not None and self.bar.update(n, epoch, in_epoch, row, row["lr"], elapsed_s):
            self.runlog.flush_updates()
            self.beat({"status": "running", "epoch": epochs_done, "updates": n, "in_epoch": epoch})
        if self.tracker is not None:
            self.tracker.after_update(n)

    def validating(self, epoch: int, epochs_done: int, n: int) -> None:
        self.close_bar()
        self.beat({"status": "running", "epoch": epochs_done, "updates": n, "validating": epoch})

    def validate(self, task, trainer, epoch: int, state: RunState,
                 t0: float) -> tuple[dict[str, Any], str | None] | None:
        """The epoch's record (the metrics.jsonl row) and sacreBLEU's signature."""
        t_valid = time.perf_counter()
        val = validation_loss(task, trainer)
        bleu = self.scorer.score(trainer.get_model(), self.setup.device,
                                 self.paths["hyps"] / f"valid_epoch{epoch:03d}.txt")
        record: dict[str, Any] = {
            "epoch": epoch, "updates": trainer.get_num_updates(), "lr": trainer.get_lr(),
            **state.train_losses(),
            "valid_loss": val.loss, "valid_nll_loss": val.nll_loss, "valid_ppl": val.ppl,
            "valid_bleu": bleu.bleu,
        }
        if bleu.bleu_tok is not None:
            record["valid_bleu_tok"] = bleu.bleu_tok
        record["valid_s"] = round(time.perf_counter() - t_valid, 2)
        record["wall_s"] = round(time.perf_counter() - t0, 2)
        return record, bleu.signature

    def epoch_done(self, record: dict[str, Any], stopped: bool) -> None:
        log.info("epoch %d | updates %d | lr %.3g | train %.3f | valid %.3f | BLEU %.2f | %.0fs",
                 record["epoch"], record["updates"], record["lr"], record["train_loss"],
                 record["valid_loss"], record["valid_bleu"], record["wall_s"])
        progress.log_epoch(self.setup.max_epoch, self.setup.run_dir, record,
                           stopped=f"max_update={self.setup.max_update}" if stopped else None)

    def before_checkpoint(self, history: list[dict[str, Any]], end_of_epoch: bool) -> None:
        """The logs up to the checkpoint about to be written (they hold its updates)."""
        if end_of_epoch:
            self.runlog.epoch(history)
        else:
            self.runlog.flush_updates()

    def checkpoint_saved(self, epochs_done: int, n: int) -> None:
        """Status with where the run resumes (a run that stops now, on a full disk, says so)."""
        self.beat({"status": "running", "epoch": epochs_done, "updates": n, "resumes_from": n})

    def keep_checkpoints(self, epoch: int, history: list[dict[str, Any]]) -> None:
        """checkpoint_best.pt when the epoch's valid loss is the lowest yet; the epoch checkpoints
        of ``checkpoint.keep_last_epochs``."""
        ckpt_dir = self.paths["checkpoints"]
        losses = [r["valid_loss"] for r in history]
        if losses and losses[-1] == min(losses) and math.isfinite(losses[-1]):
            last = ckpt_dir / rundir.CHECKPOINT_LAST
            rundir.write_with(ckpt_dir / rundir.CHECKPOINT_BEST,
                              lambda tmp: shutil.copyfile(last, tmp))
        keep_epoch(ckpt_dir, epoch, self.setup.keep_last_epochs)

    def interrupted(self, state: RunState, n: int) -> None:
        write_json(self.paths["status"], {"status": "interrupted", "epoch": len(state.history),
                                          "updates": n, "resumes_from": state.checkpoint_update()})

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def close(self) -> None:
        self.runlog.close()  # (a DiskError raised in the loop goes on to lnexp train: status kept)
        self.close_bar()

    def finish(self, status: dict[str, Any], signature: str | None) -> None:
        """The final status and run.json; then, with checkpoint.at_end=delete, the checkpoints go
        (after the status that says so: a kill in between leaves them, never a run without either)."""
        run_json = read_json(self.paths["run"], {})
        run_json["bleu_signature"] = signature
        write_json(self.paths["run"], run_json)
        delete = self.setup.checkpoints_at_end == "delete"
        write_json(self.paths["status"], {**status, "checkpoints_deleted": True} if delete else status)
        if delete:
            shutil.rmtree(self.paths["checkpoints"], ignore_errors=True)


class OtherRank(Rank0):
    """A rank other than 0 of a data-parallel run: rank 0's calls, doing nothing."""

    def start(self, task, model, trainer, epoch_itr, state: RunState, entropy: float) -> None:
        pass

    def begin_epoch(self, updates_in_epoch: int) -> None:
        pass

    def after_update(self, row: dict[str, Any], in_epoch: int, elapsed_s: float,
                     epochs_done: int) -> None:
        pass

    def validating(self, epoch: int, epochs_done: int, n: int) -> None:
        pass

    def validate(self, task, trainer, epoch: int, state: RunState, t0: float) -> None:
        return None  # rank 0 validates; the record comes by broadcast

    def epoch_done(self, record: dict[str, Any], stopped: bool) -> None:
        pass

    def before_checkpoint(self, history: list[dict[str, Any]], end_of_epoch: bool) -> None:
        pass

    def checkpoint_saved(self, epochs_done: int, n: int) -> None:
        pass

    def keep_checkpoints(self, epoch: int, history: list[dict[str, Any]]) -> None:
        pass

    def interrupted(self, state: RunState, n: int) -> None:
        pass

    def close(self) -> None:
        pass

    def finish(self, status: dict[str, Any], signature: str | None) -> None:
        pass


def _log_start(setup: RunSetup, n: int, epoch_itr, before: dict[str, Any]) -> None:
    """Say whether the run starts or resumes (from which update and epoch); an extension of a
    finished run was said before the lock was taken."""
    run_dir = setup.run_dir
    before = rundir.effective_status(before) if before else {}
    log.info("precision: %s", setup.precision.why)
    if n == 0:
        log.info("%s: starting", run_dir)
    elif run_status.normalise(before).get("status") in run_status.FINAL:
        pass  # an extension: lnexp.train.loop.extends said so in the run's first line
    elif setup.max_update and n >= setup.max_update:  # its status was lost (a kill, a damage)
        log.info("%s: its last checkpoint is at update %d, max_update=%d: nothing to train, its "
                 "status is written again from that checkpoint", run_dir, n, setup.max_update)
    else:
        into = epoch_itr.iterations_in_epoch  # (the epoch's iterator is made later)
        where = (f"epoch {epoch_itr.epoch}, {count(into, 'batch', 'batches')} into it" if into
                 else f"the start of epoch {epoch_itr.next_epoch_idx}")
        lost = int(before.get("updates", n)) - n
        log.info("%s: resuming from update %d (%s)%s", run_dir, n, where,
                 f"; it was {before.get('status', 'stopped')} at update {before['updates']}: "
                 f"{count(lost, 'update')} after the last checkpoint will be done again" if lost > 0
                 else "")
    log.info("schedule: %s", setup.schedule)
    if setup.linear:
        log.info("schedule=linear decays to 0 at the end of the run, so its length names the run "
                 "folder (%s): a longer linear run is a new run, not an extension", run_dir.name)


class _Heartbeat:
    """Writes the running status with pid, host and time; a reader calls the run interrupted once
    the heartbeat is older than 5x the longest gap seen (10 minutes at least)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: float | None = None
        self.longest = 0.0

    def __call__(self, status: dict[str, Any]) -> None:
        now = time.time()
        if self.last is not None:
            self.longest = max(self.longest, now - self.last)
        self.last = now
        write_json(self.path, rundir.stamp(status, max(600.0, 5 * self.longest)))
