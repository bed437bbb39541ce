"""One training run: fairseq's Trainer driven epoch by epoch, exactly as fairseq-train drives it,
plus per-epoch validation loss and BLEU, per-update logs, divergence and resumable checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lnexp import fairseq_adapter as fa
from lnexp import rundir
from lnexp.rundir import read_json, run_paths, write_json
from lnexp.train import init_profile, progress, runlock, settings
from lnexp.train.divergence import PlateauRule, non_finite, unigram_entropy_bits
from lnexp.train.epoch_checkpoints import keep_epoch
from lnexp.train.evaluate import BleuScorer, validation_loss
from lnexp.train.runlog import RunLog
from lnexp.train.sharing import Sharing

log = logging.getLogger("lnexp.train")
FINAL = ("done", "diverged")
UNITS = {"loss": "bits/token (label-smoothed cross-entropy, base 2, as fairseq logs it)",
         "nll_loss": "bits/token (cross-entropy, base 2)", "bleu": "sacreBLEU (detokenised, 13a)",
         "bleu_tok": "BLEU on Moses-tokenised lowercased text (tokenize=none, multi-bleu style)",
         "wall_s": "seconds of training and validation since the run began"}


def finished(run_dir: Path, max_epoch: int, max_update: int = 0) -> dict | None:
    """The run's final status if it already went as far as asked; None if there is more to do
    (a longer max_epoch or max_update extends a finished run in place)."""
    status = read_json(run_paths(run_dir)["status"], {})
    if status.get("status") == "diverged" and status.get("stopped"):
        return status
    if status.get("status") in FINAL and (
            status.get("epoch", 0) >= max_epoch
            or (max_update and status.get("updates", 0) >= max_update)):
        return status
    return None


def train_run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; returns its final status."""
    from lnexp.train import distributed

    done = finished(run_dir, int(cfg.max_epoch), int(cfg.max_update))
    if done is not None:
        log.info("%s: already %s at epoch %s, skipping", run_dir, done["status"], done.get("epoch"))
        return done
    run_dir.mkdir(parents=True, exist_ok=True)
    rank0 = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 holds the run's lock
    with runlock.hold(run_dir) if rank0 else contextlib.nullcontext():
        return distributed.launch(cfg, run_dir, train_process)


def train_process(cfg: DictConfig, run_dir: Path, dist=None) -> dict[str, Any]:
    """The training of one process: the whole run, or one rank of a data-parallel run (``dist``:
    fairseq's distributed settings of the rank, see lnexp.train.distributed). Rank 0 alone writes
    the run folder and computes BLEU."""
    paths = run_paths(run_dir)
    sharing = Sharing(int(cfg.threads), run_dir)
    try:
        return _train(cfg, run_dir, dist, paths, sharing)
    finally:
        sharing.close()


def _train(cfg: DictConfig, run_dir: Path, dist, paths: dict[str, Path],
           sharing: Sharing) -> dict[str, Any]:
    import torch

    from lnexp.data.registry import load_for_training

    data = load_for_training(cfg.dataset)
    device = settings.resolve_device(cfg)
    per_epoch = _updates_per_epoch(cfg, data, device) if cfg.schedule.name == "linear" else None
    flags = settings.fairseq_flags(cfg, per_epoch, device)
    stock = settings.stock_flags(flags)
    flags.update(save_dir=paths["checkpoints"], no_progress_bar=True, disable_validation=True,
                 no_epoch_checkpoints=True)
    args = fa.training_args(data.bin_dir, flags)
    fcfg = fa.to_fairseq_config(args)
    if dist is not None:
        fa.adopt_distributed(fcfg, dist)
    master = fa.is_master(fcfg)
    task, model, criterion, trainer = fa.build_trainer(fcfg)
    restore = _resume_from(paths)
    # a fresh run: the scheme's profiling pass (Admin's gains), before the optimizer copies weights
    profiled = init_profile.profile_fresh_run(fcfg, task, trainer, master) if restore is None else None
    extra, epoch_itr = fa.epoch_iterator(fcfg, trainer, restore)
    state = (extra or {}).get("lnexp") or {"history": [], "wall_s": 0.0, "acc": _zero_acc(),
                                          "diverged": None, "profiled_init": profiled}
    state.setdefault("overflows", 0)  # fp16 updates skipped by fairseq's loss scaler
    history: list[dict[str, Any]] = state["history"]
    if master:
        _log_start(cfg, run_dir, trainer.get_num_updates(), epoch_itr, history,
                   read_json(paths["status"], {}))
    runlog = RunLog(paths, trainer.get_num_updates(), tensorboard=master)
    scorer = BleuScorer(task, data, int(cfg.eval.beam), float(cfg.eval.lenpen),
                        int(cfg.eval.max_sentences), int(cfg.eval.subset))
    if master:
        paths["hyps"].mkdir(exist_ok=True)
        _write_refs(paths["hyps"] / "valid.ref", scorer.refs)
    entropy = unigram_entropy_bits(task.dataset("train").tgt,
                                   Path(data.bin_dir) / f"unigram_entropy.{data.tgt}.json")
    rule = PlateauRule(entropy, int(cfg.divergence.plateau_epoch),
                       float(cfg.divergence.plateau_margin))
    world = int(fcfg.distributed_training.distributed_world_size)
    if master:
        write_json(paths["run"], {
            "config": OmegaConf.to_container(cfg, resolve=True), "data": data.__dict__,
            "device": device, "torch_threads": torch.get_num_threads(),
            "params": sum(p.numel() for p in model.parameters()),
            "profiled_init": state.get("profiled_init"),  # Admin's gains, as a fresh run set them
            "fairseq_flags": {k: str(v) for k, v in flags.items()},
            "stock_fairseq_train": None if stock is None else shlex.join(
                ["fairseq-train", *fa.flags_to_argv(data.bin_dir, stock)]),
            "schedule": schedule_in_force(cfg),
            "units": UNITS, "unigram_entropy_bits": entropy,
            "bleu_signature": None, "last_started": time.strftime("%FT%T"), "world_size": world,
            "tokens_per_update_max": world * int(cfg.scale.update_freq) * int(cfg.scale.max_tokens),
        })
    tracker = None
    if cfg.track_norms and master:
        from lnexp.train.norms import NormTracker

        tracker = NormTracker(trainer.model, paths["norms"], int(cfg.track_every),
                              trainer.get_num_updates(), tb=runlog.tb,
                              grad_of=fa.stepped_grads(trainer))
    t0 = time.perf_counter() - state["wall_s"]
    save_every = int(cfg.save_interval_updates)
    max_update = int(cfg.max_update)
    beat = _Heartbeat(paths["status"])
    if master:
        beat({"status": "running", "epoch": len(history), "updates": trainer.get_num_updates()})
    bar = None

    def save(end_of_epoch: bool) -> None:
        state["wall_s"] = time.perf_counter() - t0
        state["saved_update"] = trainer.get_num_updates()
        if end_of_epoch and master:
            runlog.epoch(history)
        elif master:
            runlog.flush_updates()
        _save_checkpoint(trainer, epoch_itr, state, paths)  # after the logs: they hold its updates
        if master:  # a run that stops now (a full disk) says where it resumes
            n = trainer.get_num_updates()
            beat({"status": "running", "epoch": len(history), "updates": n, "resumes_from": n})

    try:
        while epoch_itr.next_epoch_idx <= int(cfg.max_epoch):
            epoch = epoch_itr.next_epoch_idx
            itr = epoch_itr.next_epoch_itr(fix_batches_to_gpus=False,
                                           shuffle=epoch > fcfg.dataset.curriculum)
            itr = fa.grouped(itr, fcfg)
            if bar is None:
                run_updates = len(itr) * int(cfg.max_epoch)
                bar = progress.UpdateProgress(int(cfg.log_interval), len(itr),
                                              min(run_updates, max_update or run_updates))
            trainer.begin_epoch(epoch)
            acc = state["acc"]
            for samples in itr:
                lr = trainer.get_lr()
                sharing.refresh()
                step = fa.train_step(trainer, samples)
                n = trainer.get_num_updates()
                if step is not None and step.get("overflow"):  # fp16: scale lowered, no update
                    state["overflows"] += 1
                    continue
                if step is None or non_finite(step["loss"]):
                    state["diverged"] = {"reason": "non-finite loss or gradient", "update": n + 1,
                                         "epoch": epoch}
                    break
                runlog.update({"update": n, "epoch": epoch, "lr": lr, **step,
                               "overflows": state["overflows"]})
                if master and bar.update(n, epoch, itr.n, step, lr, time.perf_counter() - t0):
                    runlog.flush_updates()
                    beat({"status": "running", "epoch": len(history), "updates": n,
                          "in_epoch": epoch})
                for key in ("loss", "nll_loss"):
                    acc[key] += step[key] * step["sample_size" if key == "loss" else "ntokens"]
                acc["sample_size"] += step["sample_size"]
                acc["ntokens"] += step["ntokens"]
                if tracker is not None:
                    tracker.after_update(n)
                if max_update and n >= max_update:
                    break
                if save_every and n % save_every == 0 and not epoch_itr.end_of_epoch():
                    save(end_of_epoch=False)
            if state["diverged"]:
                break
            bar.close()
            if master:
                beat({"status": "running", "epoch": len(history),
                      "updates": trainer.get_num_updates(), "validating": epoch})
            # validation and BLEU once, on rank 0; the other ranks wait for its record
            record, state["signature"] = fa.broadcast_from_master(_end_of_epoch(
                task, trainer, scorer, epoch, acc, paths, device, t0) if master else None)
            if history and history[-1]["epoch"] == epoch:  # a max_update stop inside this epoch
                history[-1] = record
            else:
                history.append(record)
            if epoch_itr.end_of_epoch():  # else max_update stopped it: an extension goes on with it
                state["acc"] = _zero_acc()
            trainer.lr_step(epoch, record["valid_loss"])
            if state["diverged"] is None and rule.stuck(epoch, record["valid_nll_loss"]):
                state["diverged"] = {"reason": f"plateau: valid nll {record['valid_nll_loss']:.2f}"
                                     f" bits >= unigram entropy {entropy:.2f} - {rule.margin_bits}",
                                     "update": record["updates"], "epoch": epoch}
            if master:
                _log_epoch(record)
                stopped = bool(max_update) and trainer.get_num_updates() >= max_update
                progress.log_epoch(cfg, run_dir, record,
                                   stopped=f"max_update={max_update}" if stopped else None)
            save(end_of_epoch=True)
            if master:
                _keep_best(paths["checkpoints"], history)
                keep_epoch(paths["checkpoints"], epoch, int(cfg.checkpoint.keep_last_epochs))
            if state["diverged"] and (cfg.divergence.stop or not math.isfinite(record["valid_loss"])):
                break
            if max_update and trainer.get_num_updates() >= max_update:
                break
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say so; the last checkpoint resumes it
        if master:
            write_json(paths["status"], {"status": "interrupted", "epoch": len(history),
                                         "updates": trainer.get_num_updates(),
                                         "resumes_from": _checkpoint_update(state, history)})
        raise
    finally:
        runlog.close()  # (a DiskError raised above goes on to lnexp train: one line, status kept)
        if bar is not None:
            bar.close()
    div = state["diverged"]
    if div and div["reason"].startswith("non-finite"):
        save(end_of_epoch=True)
    status = {"status": "diverged" if div else "done", "epoch": len(history),
              "updates": trainer.get_num_updates(), "diverged": div,
              "stopped": bool(div) and len(history) < int(cfg.max_epoch),
              "max_update_reached": bool(max_update) and trainer.get_num_updates() >= max_update,
              "wall_s": round(time.perf_counter() - t0, 1)}
    if master:
        run_json = read_json(paths["run"], {})
        run_json["bleu_signature"] = state.get("signature")
        write_json(paths["run"], run_json)
        write_json(paths["status"], status)
    return status


def schedule_in_force(cfg: DictConfig) -> str:
    """The lr schedule of the run in words, and why it is the one in force."""
    s = cfg.schedule
    warm = f"linear warm-up over {cfg.warmup} updates" if cfg.warmup else "no warm-up"
    epochs = ", ".join(str(e) for e in s.get("epochs", []))
    shape = {"inverse_sqrt": "then inverse-sqrt decay", "constant": "then lr_max held",
             "step": f"lr_max held, x{s.get('gamma')} from epoch {epochs}",
             "linear": "then linear decay to 0 at the end of the run"}[s.name]
    return f"{s.name}: lr_max {cfg.lr:g}, {warm}, {shape} ({s.get('why', 'chosen')})"


def _log_start(cfg: DictConfig, run_dir: Path, n: int, epoch_itr, history: list[dict[str, Any]],
               before: dict[str, Any]) -> None:
    """Say whether the run starts, resumes (from which update and epoch) or is extended."""
    before = rundir.effective_status(before) if before else {}
    if n == 0:
        log.info("%s: starting", run_dir)
    elif before.get("status") in FINAL:
        log.info("%s: extending the %s run (%d epochs, %d updates) to max_epoch=%s%s; %s "
                 "is appended to", run_dir, before["status"], len(history), n, cfg.max_epoch,
                 f", max_update={cfg.max_update}" if cfg.max_update else "", rundir.METRICS)
    else:
        into = epoch_itr.iterations_in_epoch  # (the epoch's iterator is made later)
        where = (f"epoch {epoch_itr.epoch}, {into} batches into it" if into
                 else f"the start of epoch {epoch_itr.next_epoch_idx}")
        lost = int(before.get("updates", n)) - n
        log.info("%s: resuming from update %d (%s)%s", run_dir, n, where,
                 f"; it was {before.get('status', 'stopped')} at update {before['updates']}, the "
                 f"{lost} updates after the last checkpoint are done again" if lost > 0 else "")
    log.info("schedule: %s", schedule_in_force(cfg))
    if cfg.schedule.name == "linear":
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


def _checkpoint_update(state: dict[str, Any], history: list[dict[str, Any]]) -> int:
    return int(state.get("saved_update", history[-1]["updates"] if history else 0))


def _zero_acc() -> dict[str, float]:
    return {"loss": 0.0, "nll_loss": 0.0, "sample_size": 0.0, "ntokens": 0.0}


def _end_of_epoch(task, trainer, scorer: BleuScorer, epoch: int, acc: dict, paths, device: str,
                  t0: float) -> tuple[dict[str, Any], str | None]:
    t_valid = time.perf_counter()
    val = validation_loss(task, trainer)
    bleu = scorer.score(trainer.get_model(), device, paths["hyps"] / f"valid_epoch{epoch:03d}.txt")
    record: dict[str, Any] = {
        "epoch": epoch, "updates": trainer.get_num_updates(), "lr": trainer.get_lr(),
        "train_loss": acc["loss"] / max(acc["sample_size"], 1),
        "train_nll_loss": acc["nll_loss"] / max(acc["ntokens"], 1),
        "valid_loss": val.loss, "valid_nll_loss": val.nll_loss, "valid_ppl": val.ppl,
        "valid_bleu": bleu.bleu,
    }
    if bleu.bleu_tok is not None:
        record["valid_bleu_tok"] = bleu.bleu_tok
    record["valid_s"] = round(time.perf_counter() - t_valid, 2)
    record["wall_s"] = round(time.perf_counter() - t0, 2)
    return record, bleu.signature


def _log_epoch(r: dict[str, Any]) -> None:
    log.info("epoch %d | updates %d | lr %.3g | train %.3f | valid %.3f | BLEU %.2f | %.0fs",
             r["epoch"], r["updates"], r["lr"], r["train_loss"], r["valid_loss"], r["valid_bleu"],
             r["wall_s"])


def _write_refs(path: Path, refs: list[str]) -> None:
    rundir.write_text(path, "".join(r + "\n" for r in refs))


def _save_checkpoint(trainer, epoch_itr, state: dict, paths: dict[str, Path]) -> None:
    """fairseq's checkpoint (every rank takes part; rank 0 writes it), replacing checkpoint_last.pt
    atomically; the one it replaces is kept as checkpoint_previous.pt."""
    paths["last"].parent.mkdir(parents=True, exist_ok=True)
    trainer.consolidate_optimizer()
    ckpt = fa.checkpoint_state(trainer, {"train_iterator": epoch_itr.state_dict(), "lnexp": state})
    if ckpt is not None:
        rundir.write_keeping_previous(paths["last"], paths["previous"],
                                      lambda tmp: fa.save_checkpoint_file(ckpt, tmp))


def _resume_from(paths: dict[str, Path]) -> Path | None:
    """checkpoint_last.pt, or checkpoint_previous.pt if the last one is damaged (it is then
    replaced by the previous one); None for a fresh start."""
    from lnexp.errors import UserError

    last, previous = paths["last"], paths["previous"]
    if not last.is_file():
        return None
    damage = rundir.checkpoint_damage(last)
    if damage is None:
        return last
    if previous.is_file() and rundir.checkpoint_damage(previous) is None:
        log.warning("%s is damaged (%s): resuming from %s, the checkpoint before it", last, damage,
                    previous.name)
        rundir.link_or_copy(previous, last)
        return last
    raise UserError(f"{last} is damaged ({damage}) and there is no good {previous.name}: delete "
                    f"{last.parent} to train the run from the start")


def _keep_best(ckpt_dir: Path, history: list[dict[str, Any]]) -> None:
    import shutil

    losses = [r["valid_loss"] for r in history]
    if losses and losses[-1] == min(losses) and math.isfinite(losses[-1]):
        last = ckpt_dir / rundir.CHECKPOINT_LAST
        rundir.write_with(ckpt_dir / rundir.CHECKPOINT_BEST, lambda tmp: shutil.copyfile(last, tmp))


def _updates_per_epoch(cfg: DictConfig, data, device: str) -> int:
    flags = settings.fairseq_flags(cfg, 1, device)
    return fa.updates_per_epoch(data.bin_dir, flags)
