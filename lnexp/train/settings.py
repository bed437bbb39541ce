"""Hydra config -> checked values -> the fairseq-train flags of the run.

The mapping is explicit so that every run can print the equivalent stock ``fairseq-train`` command
(``fairseq_cmd.txt`` in the run directory).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lnexp.errors import ConfigError
from lnexp.names import NORMS, PLACEMENTS, PRECISIONS
from lnexp.names import SCHEDULES as SHAPES


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line, naming the fix) for values no run can use."""

    def number(key: str) -> float:
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}={value!r} is not a number: e.g. {key}=1e-3")
        return float(value)

    lr = number("lr")
    if not math.isfinite(lr) or lr <= 0:
        raise ConfigError(f"lr={cfg.lr} must be a positive number: e.g. lr=5e-4")
    if number("warmup") < 0 or int(cfg.warmup) != cfg.warmup:
        raise ConfigError(f"warmup={cfg.warmup} must be a whole number of updates >= 0 "
                          "(warmup=0 for none)")
    if number("max_epoch") < 1 or int(cfg.max_epoch) != cfg.max_epoch:
        raise ConfigError(f"max_epoch={cfg.max_epoch} must be a whole number >= 1")
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        raise ConfigError(f"seed={cfg.seed!r} must be an integer")
    if number("residual_scale") <= 0:
        raise ConfigError(f"residual_scale={cfg.residual_scale} must be > 0 (1.0 = plain residual)")
    checks = [("norm", cfg.norm, NORMS), ("precision", cfg.precision, PRECISIONS),
              ("device", cfg.device, ("auto", "cpu", "cuda")),
              ("placement", cfg.placement.name, PLACEMENTS), ("schedule", cfg.schedule.name, SHAPES)]
    for key, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    if cfg.eval.beam < 1:
        raise ConfigError(f"eval.beam={cfg.eval.beam} must be >= 1")
    keep = cfg.checkpoint.keep_last_epochs
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise ConfigError(f"checkpoint.keep_last_epochs={keep!r} must be a whole number >= 0 "
                          "(0 keeps no epoch checkpoints)")


def resolve_device(cfg: DictConfig) -> str:
    import torch

    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no GPU: use device=cpu or install a CUDA torch")
    return cfg.device


def fairseq_flags(cfg: DictConfig, updates_per_epoch: int | None = None,
                  device: str = "cpu") -> dict[str, Any]:
    """The fairseq-train options of this run (without the data directory)."""
    opt, sched, scale = cfg.optimizer, cfg.schedule, cfg.scale
    if cfg.precision != "fp32" and device != "cuda":
        raise ConfigError(f"precision={cfg.precision} needs a GPU: use precision=fp32 on CPU")
    flags: dict[str, Any] = dict(
        task="translation", source_lang=cfg.dataset.src, target_lang=cfg.dataset.tgt,
        arch=scale.arch, share_all_embeddings=True,
        placement=cfg.placement.name, embed_norm=bool(cfg.placement.embed_norm), norm=cfg.norm,
        residual_scale=float(cfg.residual_scale),
        encoder_layers=int(cfg.depth.encoder_layers), decoder_layers=int(cfg.depth.decoder_layers),
        dropout=float(scale.dropout),
        criterion="label_smoothed_cross_entropy", label_smoothing=float(scale.label_smoothing),
        optimizer=opt.name, lr=float(cfg.lr), weight_decay=float(opt.weight_decay),
        clip_norm=float(opt.clip_norm),
        lr_scheduler="lnexp", schedule=sched.name, warmup_updates=int(cfg.warmup),
        max_tokens=int(scale.max_tokens), update_freq=int(scale.update_freq),
        max_epoch=int(cfg.max_epoch), seed=int(cfg.seed),
        cpu=device == "cpu", bf16=cfg.precision == "bf16", fp16=cfg.precision == "fp16",
        num_workers=0, required_batch_size_multiple=1,
    )
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


def stock_flags(flags: dict[str, Any]) -> dict[str, Any] | None:
    """The same run as stock fairseq-train (Post-/Pre-LN, layernorm, dt=1, inverse_sqrt, W>0)."""
    if flags["placement"] not in ("post_ln", "pre_ln") or flags["norm"] != "layernorm" \
            or flags["residual_scale"] != 1.0 or flags["embed_norm"] or flags["optimizer"] == "radam":
        return None
    if flags["schedule"] != "inverse_sqrt" or flags["warmup_updates"] == 0:
        return None
    stock = {k: v for k, v in flags.items()
             if k not in ("placement", "embed_norm", "norm", "residual_scale", "schedule")}
    stock["arch"] = {"ln_transformer_iwslt_de_en": "transformer_iwslt_de_en",
                     "ln_transformer_wmt_en_de": "transformer_wmt_en_de"}.get(flags["arch"],
                                                                             "transformer")
    if stock["arch"] == "transformer":  # the mini size, spelled out
        for side in ("encoder", "decoder"):
            stock.update({f"{side}_embed_dim": 128, f"{side}_ffn_embed_dim": 512,
                          f"{side}_attention_heads": 4})
    before = flags["placement"] == "pre_ln"
    stock.update(lr_scheduler="inverse_sqrt", encoder_normalize_before=before,
                 decoder_normalize_before=before)
    return stock


def run_paths(run_dir: Path) -> dict[str, Path]:
    return {
        "metrics": run_dir / "metrics.jsonl",
        "updates": run_dir / "updates.csv",
        "status": run_dir / "status.json",
        "run": run_dir / "run.json",
        "checkpoints": run_dir / "checkpoints",
        "hyps": run_dir / "hyps",
        "tb": run_dir / "tb",
        "norms": run_dir / "norms.csv",
    }
