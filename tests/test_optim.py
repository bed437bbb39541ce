"""The lnexp schedule's semantics, and RAdam registered into fairseq."""

from __future__ import annotations

import math

import pytest
import torch


def schedule(shape: str, warmup: int, lr: float = 1e-3, **kw):
    from fairseq.optim.lr_scheduler import build_lr_scheduler
    from omegaconf import OmegaConf

    from lnexp.optim import LnexpScheduleConfig

    cfg = OmegaConf.structured(LnexpScheduleConfig(schedule=shape, warmup_updates=warmup, **kw))
    cfg.lr = [lr]
    cfg._name = "lnexp"
    opt = _sgd()
    return build_lr_scheduler(cfg, opt), opt


def _sgd():
    import argparse

    from fairseq.optim.sgd import SGD

    p = torch.nn.Parameter(torch.zeros(2))
    return SGD(argparse.Namespace(lr=[1.0], momentum=0.0, weight_decay=0.0), [p])


def test_warmup_zero_uses_lr_max_from_first_update():
    sched, opt = schedule("inverse_sqrt", 0)
    assert opt.get_lr() == 1e-3  # before update 1
    assert sched.step_update(1) == pytest.approx(1e-3)
    assert sched.step_update(4) == pytest.approx(1e-3 / 2)  # lr_max * sqrt(1/t), T_warmup = 1


def test_warmup_ramp_then_inverse_sqrt_matches_fairseq_exactly():
    from fairseq.optim.lr_scheduler.inverse_square_root_schedule import (
        InverseSquareRootLRScheduleConfig,
        InverseSquareRootSchedule,
    )

    ours, _ = schedule("inverse_sqrt", 40, lr=5e-4)
    stock = InverseSquareRootSchedule(
        InverseSquareRootLRScheduleConfig(warmup_updates=40, lr=[5e-4]), _sgd())
    assert ours.optimizer.get_lr() == stock.optimizer.get_lr() == 0.0
    for n in range(1, 200):
        assert ours.step_update(n) == stock.step_update(n), n
    assert ours.step_update(40) == 5e-4
    assert ours.step_update(20) == pytest.approx(2.5e-4)


def test_constant_step_and_linear():
    const, _ = schedule("constant", 10)
    assert const.step_update(5) == pytest.approx(5e-4)
    assert const.step_update(10) == const.step_update(10_000) == 1e-3
    step, opt = schedule("step", 0, lr=5e-4, step_epochs="8", step_gamma=0.1)
    for epoch in range(1, 8):
        step.step_begin_epoch(epoch)
        assert step.step_update(epoch * 10) == 5e-4
    step.step_begin_epoch(8)
    assert opt.get_lr() == pytest.approx(5e-5)
    lin, _ = schedule("linear", 0, total_updates=100)
    assert lin.step_update(0) == 1e-3
    assert lin.step_update(50) == pytest.approx(5e-4)
    assert lin.step_update(100) == 0.0


def test_radam_is_torch_radam_in_fairseq():
    from fairseq.optim import build_optimizer
    from omegaconf import OmegaConf

    from lnexp.optim import FairseqRAdam, RAdamConfig

    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(3))
    b = torch.nn.Parameter(a.detach().clone())
    cfg = OmegaConf.structured(RAdamConfig(adam_betas="(0.9, 0.98)"))
    cfg.lr = [1e-2]
    cfg._name = "radam"
    ours = build_optimizer(cfg, [a])
    assert isinstance(ours, FairseqRAdam)
    ref = torch.optim.RAdam([b], lr=1e-2, betas=(0.9, 0.98))
    for _ in range(5):
        for p, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            (p**2).sum().backward()
            opt.step()
    assert torch.equal(a, b)
    assert math.isclose(ours.get_lr(), 1e-2)
