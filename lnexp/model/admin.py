"""Admin's profiling pass (Liu et al. 2020, arXiv 2004.08249): the residual gains w_i of
LN(w_i * x + F_i(x)) from one forward over one batch at initialisation.

Per stack (encoder, decoder), the sub-layers in the order they run: w_1 = 1 and
w_{i+1} = sqrt(Var[w_i * x_i] + Var[F_i(x_i)]), x_i the sub-layer's input and F_i(x_i) its branch
(after dropout), variances over every element of the batch. Each w_i is set before its sub-layer's
sum is taken, so later sub-layers see the gains already in force: one pass gives them all, as the
authors' adaptive-profiling run does (configs/placement/admin.yaml says which readings this takes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lnexp.model.placement import ResidualGain

STACKS = ("encoder", "decoder")


def residual_gains(model: nn.Module) -> dict[str, list[ResidualGain]]:
    """Each stack's gains in the order its layers run their sub-layers."""
    gains: dict[str, list[ResidualGain]] = {s: [] for s in STACKS}
    for stack in STACKS:
        for layer in getattr(model, stack).layers:
            for name in ("self_attn", "encoder_attn", "final"):
                gain = getattr(layer, f"{name}_gain", None)
                if gain is not None:
                    gains[stack].append(gain)
    return gains


def profile_admin(model: nn.Module, net_input: dict[str, Any], seed: int) -> dict[str, list[float]]:
    """Set the model's residual gains by one training-mode forward of ``net_input``; returns the
    values set, per stack. Dropout draws from its own stream seeded by ``seed`` (the training's
    random state is left as it was)."""
    gains = residual_gains(model)
    omega: dict[str, list[float]] = {s: [] for s in STACKS}
    handles = []
    for stack, modules in gains.items():
        running = [1.0]  # the next sub-layer's w

        def visit(module: ResidualGain, inputs: tuple[torch.Tensor, ...], stack=stack,
                  running=running) -> None:
            x, y = inputs
            w = running[0]
            module.weight.data.fill_(w)
            omega[stack].append(w)
            running[0] = math.sqrt(float((w * x).double().var(unbiased=False))
                                   + float(y.double().var(unbiased=False)))

        handles += [m.register_forward_pre_hook(visit) for m in modules]
    was_training = model.training
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            model.train()
            model(**net_input)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return omega


def set_gains(model: nn.Module, omega: dict[str, list[float]]) -> None:
    """Fill the gains with profiled values (the ranks that did not profile, in a parallel run)."""
    for stack, modules in residual_gains(model).items():
        if len(modules) != len(omega[stack]):
            raise ValueError(f"{stack}: {len(omega[stack])} profiled gains for {len(modules)} sub-layers")
        with torch.no_grad():
            for module, w in zip(modules, omega[stack], strict=True):
                module.weight.fill_(w)


PROFILERS = {"admin": profile_admin}  # lnexp.scheme.PROFILES, by name


def profile_init(model: nn.Module, net_input: dict[str, Any], seed: int) -> dict[str, Any] | None:
    """The profiling pass the model's placement asks for (its YAML's init.profile), if any: the
    init of a fresh run (``profile_fresh_model``) and of the figures' models at initialisation.
    Returns {"profile": name, "omega": values}, or None."""
    from lnexp.scheme import placement_of

    name = placement_of(model.cfg).init.profile
    if name is None:
        return None
    return {"profile": name, "omega": PROFILERS[name](model, net_input, seed)}


def profile_fresh_model(model: nn.Module, seed: int, first_batch: Callable[[], Any] | None,
                        share: Callable[[Any], Any]) -> dict[str, Any] | None:
    """A fresh run's start: the profiling pass its placement asks for, on the first training
    batch, before the optimizer copies the weights. ``first_batch()`` gives that batch on the
    model's device (None on the ranks that do not profile: rank 0 alone does); ``share(record)``
    gives every rank rank 0's record (lnexp.fairseq_adapter.broadcast_from_master), whose gains
    each rank then sets. Returns the record (run.json's ``profiled_init``), or None for a scheme
    without a pass."""
    from lnexp.scheme import placement_of

    if placement_of(model.cfg).init.profile is None:
        return None
    record = None
    if first_batch is not None:
        record = profile_init(model, first_batch()["net_input"], seed)
    record = share(record)
    set_gains(model, record["omega"])
    return record
