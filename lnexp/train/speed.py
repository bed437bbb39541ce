"""configs/train.yaml's ``speed`` group: how an update runs on the hardware (issue 44).

Each setting has a default (configs/train.yaml's, the only place it is written) that keeps today's
numbers, and where it cannot apply the run goes on without it and says why in one log line
(docs/performance.md "The GPU step"):

- ``syncs``: ``fewer`` (default) logs fairseq's meters without reading them back to the host and
  reads lnexp's statistics in one transfer (``fairseq_adapter.train_step``); bit-equal numbers.
- ``adam``: ``fairseq``, or torch's ``foreach``/``fused`` AdamW kernels with fairseq's arithmetic
  (lnexp.optim.TorchKernelAdam), equal up to rounding; ``auto`` (default): ``fused`` on a GPU, where
  it measured 1.3x the tokens/s of fairseq's Adam at the IWSLT size (one H200, 2026-12-04,
  docs/performance.md), ``fairseq`` on CPU (no gain there; bit-equal to stock fairseq).
- ``half``: ``cast`` (default: fairseq's ``--bf16``/``--fp16``, the whole model cast) or
  ``autocast`` (fp32 weights, ``torch.autocast`` around forward and loss) for half precision on a
  GPU (lnexp.train.precision).
- ``compile_mode`` and ``buckets``: for ``compile=true`` (lnexp.train.compiling); CUDA graphs
  (``reduce-overhead``) replay one graph per batch shape, so the buckets pad batches to a few.
- ``gpu_threads``: torch's CPU threads in a GPU run (``threads`` otherwise).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lnexp import fairseq_adapter as fa

log = logging.getLogger("lnexp.train")


@dataclass(frozen=True)
class Speed:
    """The speed group of a run's config, read once."""

    syncs: str
    adam: str
    half: str
    compile_mode: str
    buckets: tuple[int, ...]
    gpu_threads: int

    @classmethod
    def of(cls, cfg: Any) -> Speed:
        """The settings of ``cfg`` (lnexp's config, composed: every key there)."""
        s = cfg.speed
        return cls(syncs=str(s.syncs), adam=str(s.adam), half=str(s.half),
                   compile_mode=str(s.compile_mode),
                   buckets=tuple(sorted({int(b) for b in s.buckets or ()})),
                   gpu_threads=int(s.gpu_threads))


def threads(cfg: Any) -> int:
    """The torch threads a run asks for: ``speed.gpu_threads`` when it trains on a GPU and sets
    it, else ``threads`` (0: a fair share of the cores, lnexp.runtime.sharing)."""
    gpu = Speed.of(cfg).gpu_threads
    if gpu and str(cfg.device) != "cpu":
        import torch

        if torch.cuda.is_available():
            return gpu
    return int(cfg.threads)


Step = Callable[[Any, list], "dict[str, Any] | None"]


def adam_kernels(asked: str, device: str) -> str:
    """The Adam kernels a run uses: ``auto`` is fused on a GPU, fairseq's own on CPU."""
    if asked != "auto":
        return asked
    return "fused" if device == "cuda" else "fairseq"


def make_step(trainer, model, speed: Speed, device: str, compile_layers: bool,
              max_tokens: int) -> Step:
    """The run's update function ``step(trainer, samples)``: fairseq's update
    (``fairseq_adapter.train_step``) with the speed settings applied; the Adam kernels are swapped
    here, so call it once the checkpoint is loaded."""
    adam = adam_kernels(speed.adam, device)
    if adam != "fairseq":
        why = fa.use_torch_adam(trainer, adam)
        asked = speed.adam if speed.adam == adam else f"{speed.adam} ({adam} on {device})"
        if why is None:
            log.info("speed.adam=%s: Adam steps with torch's %s kernels (fairseq's arithmetic)",
                     asked, adam)
        elif speed.adam == "auto":  # not asked for: the optimizer's own steps, said quietly
            log.info("speed.adam=%s not applied (%s): the optimizer's own steps", asked, why)
        else:
            log.warning("speed.adam=%s not applied (%s): fairseq's Adam steps", asked, why)
    step: Step = functools.partial(fa.train_step, fewer_syncs=speed.syncs == "fewer")
    if compile_layers:  # falls back to the eager layers, saying why, if compiling fails
        from lnexp.train.compiling import CompiledLayers

        step = CompiledLayers(model, speed.compile_mode, device, len(speed.buckets), step).step
    if speed.buckets:
        from lnexp.train.compiling import Buckets

        buckets = Buckets(speed.buckets, max_tokens, trainer.task)
        inner = step

        def step(trainer, samples):  # noqa: F811 (the bucketed update)
            return inner(trainer, [buckets.pad(s) for s in samples])
    return step
