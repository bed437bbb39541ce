"""Hydra config -> checked values -> the fairseq-train flags and fairseq's config of the run.

``resolve`` decides, once, what a config means on this machine: the device, the precision, the
placement and the norm (``Resolved``); the fairseq-train flags are derived from those objects
(``fairseq_flags``), never decided again. The mapping is explicit so that every run can print the
equivalent stock ``fairseq-train`` command (``stock_fairseq_train`` in run.json).
``fairseq_config`` is the one way from lnexp's config to fairseq's (training, data parallelism,
probes and the linear schedule's run length all use it); ``run_setup`` reads everything a training
needs from lnexp's config once, so that the training's steps take a typed ``RunSetup`` and never the
config itself (lnexp.train.session builds the run's fairseq objects from it).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lnexp import fairseq_adapter as fa
from lnexp.errors import ConfigError
from lnexp.names import ARCH_SIZES, arch_flags
from lnexp.plural import count
from lnexp.runtime.host import resolve_device
from lnexp.scheme import Norm, Placement, named_placement
from lnexp.train.precision import Precision
from lnexp.train.precision import resolve as resolve_precision
from lnexp.train.speed import Speed

# lnexp's architectures that stock fairseq registers under another name (same sizes, same init)
STOCK_ARCHS = {"ln_transformer_iwslt_de_en": "transformer_iwslt_de_en",
               "ln_transformer_wmt_en_de": "transformer_wmt_en_de"}


@dataclass(frozen=True)
class FairseqSetup:
    """A run's prepared data, its fairseq-train flags (run.json prints them) and the config
    fairseq's own parser makes of them."""

    data: Any  # lnexp.data.corpus.PreparedData
    flags: dict[str, Any]
    config: Any  # fairseq's FairseqConfig (an omegaconf DictConfig)


@dataclass(frozen=True)
class Resolved:
    """What a config means on this machine, decided once: the device, the precision (``auto``
    resolved, bf16's CPU self-check passed), the placement and the norm (checked)."""

    device: str
    precision: Precision
    placement: Placement
    norm: Norm


def resolve(cfg: DictConfig, device: str | None = None) -> Resolved:
    """The one decision of device, precision, placement and norm (``device``: given instead of
    ``cfg.device``); ConfigError names the key that does not fit this machine."""
    device = device or resolve_device(cfg)
    placement, norm = model_scheme(cfg)
    return Resolved(device, resolve_precision(str(cfg.precision), device, half=Speed.of(cfg).half),
                    placement, norm)


_LAUNCH: dict[str, tuple[Resolved, dict[str, Any]]] = {}


def launch_flags(cfg: DictConfig) -> tuple[Resolved, dict[str, Any]]:
    """``resolve(cfg)`` and its fairseq flags, once per launch: ``lnexp train`` checks each config
    before Hydra starts (lnexp.train.run.check_overrides) and the job's session then takes the
    same decision and flags (a copy) instead of making them again."""
    key = OmegaConf.to_yaml(cfg)
    if key not in _LAUNCH:
        r = resolve(cfg)
        _LAUNCH[key] = (r, fairseq_flags(cfg, 1, r.device, r))
    r, flags = _LAUNCH[key]
    return r, dict(flags)


def fairseq_config(cfg: DictConfig, device: str = "cpu", updates_per_epoch: int | None = None,
                   resolved: Resolved | None = None, **replace: Any) -> FairseqSetup:
    """lnexp's config -> fairseq-train flags (``replace`` overrides some) -> fairseq's config, on
    the data of ``cfg.dataset`` (prepared on first use).

    ``updates_per_epoch``: the linear schedule's epoch length; left out, it is counted with
    fairseq's own batching when the schedule needs it."""
    flags = fairseq_flags(cfg, updates_per_epoch or 1, device, resolved)
    return _fairseq_setup(cfg, {**flags, **replace}, count=updates_per_epoch is None)


def _fairseq_setup(cfg: DictConfig, flags: dict[str, Any], count: bool) -> FairseqSetup:
    """The prepared data and fairseq's config of these flags (``count``: the linear schedule's
    run length counted with fairseq's own batching)."""
    from lnexp.data.registry import load_for_training

    data = load_for_training(cfg.dataset)
    if count and cfg.schedule.name == "linear":
        per_epoch = fa.updates_per_epoch(fa.fairseq_config(data.bin_dir, flags))
        flags["total_updates"] *= per_epoch  # max_epoch epochs of per_epoch updates
    return FairseqSetup(data, flags, fa.fairseq_config(data.bin_dir, flags))


@dataclass(frozen=True)
class RunSetup:
    """What one process's training reads of lnexp's config, checked and resolved once at set-up:
    the training's steps take this, never the config."""

    run_dir: Path
    paths: dict[str, Path]
    config: dict[str, Any]  # lnexp's config, resolved (run.json)
    device: str
    schedule: str  # schedule_in_force
    linear: bool  # schedule=linear: the run's length is part of its name
    max_epoch: int
    max_update: int  # 0: no limit
    save_every: int  # updates between mid-epoch checkpoints (0: none)
    log_interval: int
    keep_last_epochs: int
    checkpoints_at_end: str  # keep | delete (checkpoint.at_end)
    eval: dict[str, Any]  # BleuScorer's beam, lenpen, max_sentences, subset
    plateau_epoch: int
    plateau_margin: float
    plateau_min_updates: int
    stop_on_plateau: bool
    track_every: int  # 0: no norm tracking
    fairseq: FairseqSetup
    stock_command: str | None  # the same run as a stock fairseq-train command, where there is one
    master: bool  # rank 0 (the only process of a run that is not data-parallel)
    world_size: int
    tokens_per_update_max: int
    resume_from: Path | None  # the checkpoint the run resumes from (None: a fresh start)
    resolved: Resolved  # device, precision, placement and norm, decided once
    compile: bool  # compile=true: layers under torch.compile (lnexp.train.compiling)
    speed: Speed  # how an update runs on the hardware (lnexp.train.speed)
    stock: bool = False  # stock fairseq's equivalent run (the benchmarks' baseline), not lnexp's

    @property
    def precision(self) -> Precision:
        """What the run computes in (precision=auto resolved on this machine)."""
        return self.resolved.precision

    @property
    def data(self) -> Any:
        return self.fairseq.data

    @property
    def fcfg(self) -> Any:
        return self.fairseq.config


# what a training process gives fairseq beyond the run's own flags: lnexp saves, validates and
# reports itself
RUN_FLAGS = dict(no_progress_bar=True, disable_validation=True, no_epoch_checkpoints=True)


def run_setup(cfg: DictConfig, paths: dict[str, Path], run_dir: Path, dist=None,
              resolved: Resolved | None = None,
              stock: dict[str, Any] | None = None) -> RunSetup:
    """Everything a training needs from ``cfg``: first the checked values (``resolved``: decided
    already), then the prepared data and fairseq's config (``dist``: the rank's distributed
    settings, see lnexp.train.distributed), last the checkpoint it resumes from. ``stock``: build
    stock fairseq's equivalent run instead, with these fairseq flags added (e.g.
    ``{"memory_efficient_fp16": True}``); ConfigError where the config has none."""
    from lnexp import rundir

    if resolved is None:
        r, flags = launch_flags(cfg)
    else:
        r, flags = resolved, fairseq_flags(cfg, 1, resolved.device, resolved)
    values = dict(
        run_dir=run_dir, paths=paths, config=OmegaConf.to_container(cfg, resolve=True),
        device=r.device, schedule=schedule_in_force(cfg), linear=cfg.schedule.name == "linear",
        max_epoch=int(cfg.max_epoch), max_update=int(cfg.max_update),
        save_every=int(cfg.save_interval_updates), log_interval=int(cfg.log_interval),
        keep_last_epochs=int(cfg.checkpoint.keep_last_epochs),
        checkpoints_at_end=str(cfg.checkpoint.get("at_end", "keep")),
        eval={"beam": int(cfg.eval.beam), "lenpen": float(cfg.eval.lenpen),
              "max_sentences": int(cfg.eval.max_sentences), "subset": int(cfg.eval.subset)},
        plateau_epoch=int(cfg.divergence.plateau_epoch),
        plateau_margin=float(cfg.divergence.plateau_margin),
        plateau_min_updates=int(cfg.divergence.plateau_min_updates),
        stop_on_plateau=bool(cfg.divergence.stop),
        track_every=int(cfg.track_every) if cfg.track_norms else 0)
    tokens_per_rank = int(cfg.scale.update_freq) * int(cfg.scale.max_tokens)
    # (None for schedule=linear, and for CPU autocast: stock fairseq has no such path)
    stock_run = None if r.precision.autocast else stock_flags(flags)
    if stock is not None:
        if stock_run is None:
            raise ConfigError(f"placement={r.placement.name} with these settings has no stock "
                              "fairseq equivalent: use placement=post_ln or pre_ln, norm=layernorm, "
                              "schedule=inverse_sqrt with warm-up, fp32/bf16/fp16 on a GPU")
        flags = {**stock_run, **stock}
    fs = _fairseq_setup(cfg, {**flags, "save_dir": paths["checkpoints"], **RUN_FLAGS}, count=True)
    if dist is not None:
        fa.adopt_distributed(fs.config, dist)
    world = int(fs.config.distributed_training.distributed_world_size)
    return RunSetup(
        **values, fairseq=fs, stock_command=None if stock_run is None else shlex.join(
            ["fairseq-train", *fa.flags_to_argv(fs.data.bin_dir, stock_run)]),
        master=fa.is_master(fs.config), world_size=world,
        tokens_per_update_max=world * tokens_per_rank,
        resume_from=rundir.resume_checkpoint(paths), resolved=r,
        compile=bool(cfg.get("compile", False)) and stock is None, stock=stock is not None,
        speed=Speed.of(cfg))


def schedule_in_force(cfg: DictConfig) -> str:
    """The lr schedule of the run in words, and why it is the one in force."""
    s = cfg.schedule
    warm = f"linear warm-up over {count(cfg.warmup, 'update')}" if cfg.warmup else "no warm-up"
    epochs = ", ".join(str(e) for e in s.get("epochs", []))
    shape = {"inverse_sqrt": "then inverse-sqrt decay", "constant": "then lr_max held",
             "step": f"lr_max held, x{s.get('gamma')} from epoch {epochs}",
             "linear": "then linear decay to 0 at the end of the run"}[s.name]
    return f"{s.name}: lr_max {cfg.lr:g}, {warm}, {shape} ({s.get('why', 'chosen')})"



def fairseq_flags(cfg: DictConfig, updates_per_epoch: int | None = None,
                  device: str = "cpu", resolved: Resolved | None = None) -> dict[str, Any]:
    """The fairseq-train options of this run (without the data directory), derived from the
    config's resolved objects (``resolved``; decided here from ``cfg`` on ``device`` if not
    given)."""
    opt, sched, scale = cfg.optimizer, cfg.schedule, cfg.scale
    r = resolved or resolve(cfg, device)
    device, placement, norm, precision = r.device, r.placement, r.norm, r.precision
    flags: dict[str, Any] = dict(
        task="translation", source_lang=cfg.dataset.src, target_lang=cfg.dataset.tgt,
        arch=scale.arch, share_all_embeddings=True,
        # the placement and norm groups travel whole, as JSON, to the model (lnexp/scheme.py)
        placement=placement.name, placement_spec=placement.model_spec(),
        norm=norm.name, norm_spec=norm.to_json(), residual_scale=float(cfg.residual_scale),
        encoder_layers=int(cfg.depth.encoder_layers), decoder_layers=int(cfg.depth.decoder_layers),
        dropout=float(scale.dropout),
        criterion="label_smoothed_cross_entropy", label_smoothing=float(scale.label_smoothing),
        optimizer=opt.name, lr=float(cfg.lr), weight_decay=float(opt.weight_decay),
        clip_norm=float(opt.clip_norm),
        lr_scheduler="lnexp", schedule=sched.name, warmup_updates=int(cfg.warmup),
        max_tokens=int(scale.max_tokens), update_freq=int(scale.update_freq),
        max_epoch=int(cfg.max_epoch), seed=int(cfg.seed),
        cpu=device == "cpu", fp16=precision.name == "fp16" and not precision.autocast,
        # bf16 on CPU is lnexp's autocast (lnexp.train.precision), not fairseq's whole-model cast;
        # so is bf16 on a GPU with speed.half=autocast, and fp16 there is fairseq's --amp
        bf16=precision.fairseq_bf16 and device == "cuda", amp=precision.fairseq_amp,
        num_workers=0, required_batch_size_multiple=1,
    )
    flags.update(distributed_flags(cfg, device))
    if opt.name in ("adam", "radam"):
        flags.update(adam_betas=f"({opt.betas[0]}, {opt.betas[1]})", adam_eps=float(opt.eps))
    if opt.name == "sgd":
        flags.update(momentum=float(opt.momentum))
    if sched.name == "step":
        flags.update(step_epochs=",".join(str(int(e)) for e in sched.epochs),
                     step_gamma=float(sched.gamma))
    if sched.name == "linear":
        if not updates_per_epoch:
            raise ConfigError("schedule=linear needs the run length; it could not be computed")
        flags.update(total_updates=int(updates_per_epoch * cfg.max_epoch))
    return flags


def distributed_flags(cfg: DictConfig, device: str) -> dict[str, Any]:
    """fairseq's distributed-training options of ``distributed.*`` (docs/multi-gpu.md).

    The world size is always passed: fairseq's own default is every visible GPU.
    """
    import os

    d = cfg.get("distributed") or {}
    ws = d.get("world_size", 1)
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        raise ConfigError(f"distributed.world_size={ws!r} must be a whole number >= 1")
    flags: dict[str, Any] = {"distributed_world_size": ws}
    if ws == 1:
        return flags
    cuda = device == "cuda"
    launched = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")) \
        or ("SLURM_JOB_NODELIST" in os.environ and int(d.get("port", -1)) > 0)
    if cuda and not launched and not d.get("init_method"):
        import torch

        if ws > torch.cuda.device_count():
            raise ConfigError(f"distributed.world_size={ws} but {torch.cuda.device_count()} GPU(s) "
                              "are visible: use at most that many, or start the run under torchrun "
                              "or SLURM (docs/multi-gpu.md)")
    backend = d.get("backend", "auto")
    backend = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    if backend == "nccl" and not cuda:
        raise ConfigError("distributed.backend=nccl needs GPUs: use distributed.backend=gloo on CPU")
    ddp = d.get("ddp_backend", "auto")
    ddp = ("pytorch_ddp" if cuda else "legacy_ddp") if ddp == "auto" else ddp
    if ddp in ("pytorch_ddp", "c10d") and not cuda:
        raise ConfigError(f"distributed.ddp_backend={ddp} needs GPUs (fairseq passes GPU ids to "
                          "torch's DDP): use distributed.ddp_backend=legacy_ddp on CPU")
    flags.update(distributed_backend=backend, ddp_backend=ddp,
                 bucket_cap_mb=int(d.get("bucket_cap_mb", 25)),
                 find_unused_parameters=bool(d.get("find_unused_parameters", False)),
                 heartbeat_timeout=int(d.get("heartbeat_timeout", -1)))
    if int(d.get("port", -1)) > 0:
        flags["distributed_port"] = int(d.port)
    if d.get("init_method"):
        flags["distributed_init_method"] = str(d.init_method)
    return flags


def model_scheme(cfg: DictConfig) -> tuple[Placement, Norm]:
    """The run's placement and norm groups, checked (ConfigError names the bad key)."""
    try:
        return Placement.from_config(cfg.placement), Norm.from_config(cfg.norm)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _is_stock_norm(norm: Norm) -> bool:
    return norm.name == "layernorm" and norm.eps == 1e-5


def stock_flags(flags: dict[str, Any]) -> dict[str, Any] | None:
    """The same run as stock fairseq-train (Post-/Pre-LN as their YAML states them, LayerNorm,
    dt=1, inverse_sqrt, W>0)."""
    name = flags["placement"]
    if name not in ("post_ln", "pre_ln") or flags["optimizer"] == "radam" \
            or flags["placement_spec"] != named_placement(name).to_json() \
            or not _is_stock_norm(Norm.from_config(json.loads(flags["norm_spec"]))) \
            or flags["residual_scale"] != 1.0:
        return None
    if flags["schedule"] != "inverse_sqrt" or flags["warmup_updates"] == 0:
        return None
    stock = {k: v for k, v in flags.items() if k not in
             ("placement", "placement_spec", "norm", "norm_spec", "residual_scale", "schedule")}
    stock["arch"] = STOCK_ARCHS.get(flags["arch"], "transformer")
    if stock["arch"] == "transformer" and flags["arch"] in ARCH_SIZES:  # lnexp's own size, spelled out
        stock.update(arch_flags(flags["arch"], layers=False))
    before = flags["placement"] == "pre_ln"
    stock.update(lr_scheduler="inverse_sqrt", encoder_normalize_before=before,
                 decoder_normalize_before=before)
    return stock
