"""What fairseq lacks for the paper's study, registered through its own registries.

- ``--optimizer radam``: ``torch.optim.RAdam`` (Liu et al. 2020), used by Xiong et al. as the
  warm-up-free baseline.
- ``--lr-scheduler lnexp``: one schedule with the paper's semantics for every shape. With ``n``
  updates done, the next update uses

      warm-up (n < W):          lr_max * n / W                 (fairseq's ramp from 0)
      inverse_sqrt (n >= W):    lr_max * sqrt(max(W, 1) / max(n, 1))
      constant:                 lr_max
      step:                     lr_max * gamma ** (number of milestones <= current epoch)
      linear:                   lr_max * (T - n) / (T - W), T = total updates of the run

  ``W = 0`` means no ramp: the first update already uses lr_max. With ``W > 0`` the arithmetic is
  exactly fairseq's ``inverse_sqrt`` scheduler, so runs match stock fairseq-train update for update.
"""


from collections.abc import Collection
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II

from lnexp.names import SCHEDULES


@dataclass
class RAdamConfig(FairseqDataclass):
    adam_betas: str = field(default="(0.9, 0.999)", metadata={"help": "betas for RAdam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for RAdam"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    lr: list[float] = II("optimization.lr")


@register_optimizer("radam", dataclass=RAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    """torch.optim.RAdam behind fairseq's optimizer interface."""

    def __init__(self, cfg: RAdamConfig, params) -> None:
        super().__init__(cfg)
        self._optimizer = torch.optim.RAdam(params, **self.optimizer_config)

    @property
    def optimizer_config(self) -> dict:
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        betas = self.cfg.adam_betas
        if isinstance(betas, str):
            betas = tuple(float(b) for b in betas.strip("()[] ").split(","))
        return {"lr": lr, "betas": tuple(betas), "eps": self.cfg.adam_eps,
                "weight_decay": self.cfg.weight_decay}

    @property
    def supports_flat_params(self) -> bool:
        return True


@dataclass
class LnexpScheduleConfig(FairseqDataclass):
    schedule: str = field(default="inverse_sqrt", metadata={"help": "|".join(SCHEDULES)})
    warmup_updates: int = field(default=0, metadata={"help": "linear warm-up length (0: none)"})
    step_epochs: str = field(default="8", metadata={"help": "step: epochs where lr is multiplied"})
    step_gamma: float = field(default=0.1, metadata={"help": "step: the multiplier"})
    total_updates: int = field(default=0, metadata={"help": "linear: updates in the whole run"})
    lr: list[float] = II("optimization.lr")


def scheduled_lr(cfg: LnexpScheduleConfig, lr_max: float, n: int, epoch: int = 1) -> float:
    """The learning rate for the next update after ``n`` updates, in ``epoch`` (1-based)."""
    w = cfg.warmup_updates
    if n < w:
        return 0.0 + n * ((lr_max - 0.0) / w)  # fairseq's ramp, same float arithmetic
    if cfg.schedule == "inverse_sqrt":
        if w > 0:
            return (lr_max * w**0.5) * n**-0.5
        return lr_max if n < 1 else lr_max * n**-0.5
    if cfg.schedule == "constant":
        return lr_max
    if cfg.schedule == "step":
        drops = sum(1 for e in _milestones(cfg.step_epochs) if epoch >= e)
        return lr_max * cfg.step_gamma**drops
    if cfg.schedule == "linear":
        total = max(cfg.total_updates, w + 1)
        return lr_max * max(total - n, 0) / (total - w)
    raise ValueError(f"unknown schedule {cfg.schedule!r}: use one of {', '.join(SCHEDULES)}")


def _milestones(spec: str | int) -> list[int]:
    return [int(x) for x in str(spec).replace(" ", "").split(",") if x]


@register_lr_scheduler("lnexp", dataclass=LnexpScheduleConfig)
class LnexpSchedule(FairseqLRScheduler):
    def __init__(self, cfg: LnexpScheduleConfig, optimizer) -> None:
        super().__init__(cfg, optimizer)
        if cfg.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {cfg.schedule!r}: use one of {', '.join(SCHEDULES)}")
        self.lr_max = cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr
        self.epoch = 1
        self.num_updates = 0
        self.optimizer.set_lr(self._lr())

    def _lr(self) -> float:
        return scheduled_lr(self.cfg, self.lr_max, self.num_updates, self.epoch)

    def step_begin_epoch(self, epoch: int) -> float:
        self.epoch = epoch
        self.optimizer.set_lr(self._lr())
        return self.optimizer.get_lr()

    def step(self, epoch: int, val_loss=None) -> float:
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates: int) -> float:
        self.num_updates = num_updates
        lr = self._lr()
        self.optimizer.set_lr(lr)
        return lr
