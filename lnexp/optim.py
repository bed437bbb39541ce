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


import math
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


class TorchKernelAdam(torch.optim.AdamW):
    """fairseq's Adam (``fairseq.optim.adam.Adam``) on torch's multi-tensor kernels (``impl``:
    "foreach", or "fused": one kernel for all parameters), for ``speed.adam``.

    fairseq's Adam steps ``p -= lr*sqrt(bc2)/bc1 * m/(sqrt(v) + eps)`` after a decoupled weight
    decay ``p -= lr*wd*p``; torch's AdamW divides sqrt(v) by sqrt(bc2) before adding eps. Giving
    torch's kernel ``eps/sqrt(bc2)`` each step makes the two the same update (bc2 = 1 - beta2^step,
    with step counted on the host: no device read), equal up to the kernels' rounding. Its state
    dict is fairseq's (integer steps, fairseq's group keys), so a run resumes with either
    optimizer. fairseq's optimizer wrapper (``FairseqAdam``) holds it as fairseq holds apex's
    FusedAdam where apex is installed (``lnexp.fairseq_adapter.use_torch_adam``)."""

    FAIRSEQ_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad")

    def __init__(self, params, impl: str, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False) -> None:
        if impl not in ("foreach", "fused"):
            raise ValueError(f"impl={impl!r}: use foreach or fused")
        self.impl = impl
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=impl == "foreach", fused=impl == "fused")
        self._steps = [0 for _ in self.param_groups]  # updates each group has taken

    def step(self, closure=None):
        saved = [group["eps"] for group in self.param_groups]
        try:
            for i, group in enumerate(self.param_groups):
                self._steps[i] += 1
                beta2 = group["betas"][1]
                group["eps"] = group["eps"] / math.sqrt(1 - beta2 ** self._steps[i])
            return super().step(closure)
        finally:
            for group, eps in zip(self.param_groups, saved, strict=True):
                group["eps"] = eps

    def state_dict(self) -> dict:
        """fairseq's Adam's state dict: integer steps, fairseq's group keys only."""
        sd = super().state_dict()  # (its per-parameter dicts are the live ones: copied here)
        sd["state"] = {i: {**s, **({"step": int(s["step"])} if "step" in s else {})}
                       for i, s in sd["state"].items()}
        sd["param_groups"] = [{k: g[k] for k in (*self.FAIRSEQ_KEYS, "params") if k in g}
                              for g in sd["param_groups"]]
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """A state dict of fairseq's Adam or of this class (the steps are read on the host, before
        torch moves the state to the parameters' device)."""
        steps = []
        for group in state_dict["param_groups"]:
            held = [state_dict["state"][i]["step"] for i in group["params"]
                    if i in state_dict["state"] and "step" in state_dict["state"][i]]
            steps.append(int(max((int(s) for s in held), default=0)))
        # torch's fused path moves a step with .to(): fairseq's integer steps as tensors
        state_dict = {**state_dict, "state": {
            i: {**s, **({"step": torch.tensor(float(s["step"]))} if "step" in s else {})}
            for i, s in state_dict["state"].items()}}
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # torch takes the saved groups' keys: ours again
            group.update(foreach=self.impl == "foreach", fused=self.impl == "fused",
                         decoupled_weight_decay=True, maximize=False, capturable=False,
                         differentiable=False)
        self._steps = steps


def torch_kernel_adam(fairseq_adam, impl: str) -> TorchKernelAdam:
    """A ``TorchKernelAdam`` over the parameters of fairseq's ``Adam``, with its settings and
    state (empty for a fresh run; a resumed run's moments and steps)."""
    group = fairseq_adam.param_groups[0]
    params = [p for g in fairseq_adam.param_groups for p in g["params"]]
    out = TorchKernelAdam(params, impl, lr=group["lr"], betas=tuple(group["betas"]),
                          eps=group["eps"], weight_decay=group["weight_decay"],
                          amsgrad=group.get("amsgrad", False))
    if len(fairseq_adam.param_groups) != 1:
        raise ValueError("fairseq's Adam has several parameter groups: lnexp builds one")
    out.load_state_dict(fairseq_adam.state_dict())
    return out
