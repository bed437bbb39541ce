"""One training session: a config in, the resolved run and fairseq's objects out.

``Session.build(cfg)`` is the one way a config becomes a run that trains: the config resolved once
(device, precision, placement, norm: ``settings.resolve``), fairseq's flags derived from those
objects, the prepared data and fairseq's config (``settings.run_setup``), then the task, model,
criterion and ``Trainer`` (seeded as fairseq-train seeds them), the precision's autocast, the
compiled layers with their fallback, a fresh run's scheme initialisation (Admin's profiling pass)
and the epoch iterator, restored from the checkpoint the run resumes from. ``lnexp train``
(lnexp.train.loop), the figures that train (theory), the benchmarks and the GPU scripts
(scripts/_bench.py) all build here, so that a change to the training path is the one they time;
``tests/test_session.py`` checks that nothing else builds a trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lnexp import fairseq_adapter as fa
from lnexp.rundir import run_paths
from lnexp.train import settings
from lnexp.train.settings import Resolved, RunSetup

# where a session that keeps nothing (the benchmarks) would save: never written (no checkpoint is
# saved by them), never resumed from (no checkpoint is there)
NOWHERE = Path("/nonexistent/lnexp-session")


@dataclass
class Session:
    """A run resolved and built: its ``setup`` (lnexp's config read once), fairseq's objects, the
    update step in force (``step(trainer, samples)``: fairseq's, or the compiled layers' with
    their fallback) and where training starts (``epoch_itr``, the checkpoint's ``extra_state``,
    what a fresh run's profiling pass set)."""

    setup: RunSetup
    task: Any
    model: Any
    criterion: Any
    trainer: Any
    epoch_itr: Any
    extra_state: dict[str, Any] | None
    profiled: dict[str, Any] | None
    step: Callable[[Any, Any], dict[str, Any] | None]

    @classmethod
    def build(cls, cfg: DictConfig, run_dir: Path | None = None, dist=None,
              resolved: Resolved | None = None, stock: dict[str, Any] | None = None) -> Session:
        """The run of ``cfg`` in ``run_dir`` (None: a session that saves nothing and starts
        fresh), one rank of a data-parallel run with ``dist`` (lnexp.train.distributed);
        ``resolved``: the config already resolved on this machine; ``stock``: stock fairseq's
        equivalent run with these fairseq flags added (settings.run_setup)."""
        run_dir = NOWHERE if run_dir is None else run_dir
        setup = settings.run_setup(cfg, run_paths(run_dir), run_dir, dist, resolved, stock)
        return cls.of_setup(setup)

    @classmethod
    def of_setup(cls, setup: RunSetup) -> Session:
        """fairseq's objects of a ``RunSetup``, ready for the first update."""
        from lnexp.train import precision, speed

        task, model, criterion, trainer = fa.build_trainer(setup.fcfg)
        context = precision.forward_context(setup.precision)
        if context is not None:  # bf16 autocast (CPU, or GPU with speed.half=autocast)
            fa.autocast_forward(trainer, context)
        profiled = None
        if setup.resume_from is None:  # a fresh run starts from its scheme's initialisation
            profiled = _profile_fresh(setup, task, trainer)
        extra, epoch_itr = fa.epoch_iterator(setup.fcfg, trainer, setup.resume_from)
        # the update as speed.* makes it (after the checkpoint: Adam's kernels take its state; the
        # compiled layers, with their fallback, after the profiling pass, which runs eager)
        step = fa.train_step if setup.stock else speed.make_step(  # stock: fairseq's own update
            trainer, model, setup.speed, setup.device, setup.compile, int(setup.fcfg.dataset.max_tokens))
        return cls(setup, task, model, criterion, trainer, epoch_itr, extra, profiled, step)

    @property
    def fcfg(self) -> Any:
        return self.setup.fcfg

    @property
    def device(self) -> str:
        return self.setup.device

    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _profile_fresh(setup: RunSetup, task, trainer) -> dict[str, Any] | None:
    """The placement's profiling pass (Admin's), rank 0 on the first training batch, every rank
    given its values; None for a scheme without one."""
    from lnexp.model.admin import profile_fresh_model

    if setup.stock or setup.resolved.placement.init.profile is None:
        return None
    fcfg = setup.fcfg
    first = (lambda: fa.first_batch_on_device(fcfg, task, trainer)) if setup.master else None
    return profile_fresh_model(trainer.get_model(), int(fcfg.common.seed), first,
                               fa.broadcast_from_master)
