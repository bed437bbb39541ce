"""What the machine affords the atlas: the measured tables (one place: a cell's cost, the jobs a GPU
sustains, the memory a job takes, each with where it was measured) and the rules that choose from
them, and from the host (lnexp.runtime.host), the jobs, the budget, a cell's first cost and the
seed cap (:func:`choose_resources`, :func:`seed_cap`; pure, unit-tested).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lnexp.runtime.host import Gpu

# --- the measured tables ---------------------------------------------------------------------------

# Seconds a cell takes, before any cell of this atlas has ended, at the experiment's own run length
# (its max_update, lnexp.atlas.grid.run_length), by depth. CPU: two 1-thread jobs on 2 idle cores,
# the medians of the Intel make atlas of 2026-12-02 (docs/results.md); a cell's time is its own
# core's, so more cores run more cells at the same cost. GPU (mini): one NVIDIA H200 with 16 cores,
# 16 jobs sharing it, 2026-12-04 (../shared/measurements/2026-12-04-h200: 74 cells in 290 s, launch
# to end 34-81 s, ~1,000 cells/h, so ~58 s a cell); 18+18 was not run there: 6+6's time x the CPU's
# 18/6 ratio. The paper scale's are guesses (MEASURED says which are not).
CPU_COST_S = {"mini": {6: 155.0, 18: 350.0}, "paper": {6: 3600.0, 18: 9000.0}}
GPU_COST_S = {"mini": {6: 58.0, 18: 131.0}}
MEASURED_ON = {"cpu": "measured on 2 CPU cores, 2 jobs", "gpu": "measured on one H200, 16 jobs"}
MEASURED = {("mini", "cpu"), ("mini", "gpu")}  # (scale, device) whose costs above were measured
START_S = 15.0  # of a cell's time, what does not scale with its updates: start-up, data, the evaluation
# Jobs one GPU sustains at a scale: mini 16 (measured on the H200: 16 jobs on 16 cores; 8 mini runs
# side by side gave 4.96x one run's tokens/s, scripts/gpu_share.py); the paper model 4 (4 runs gave
# 1.71x, 8 runs 1.76x); GiB each run needs (peak 0.12 / 0.60 GiB there, + ~0.5 GiB of CUDA context)
GPU_JOBS = {"mini": 16, "gpu": 4, "paper": 4}
GPU_RUN_GIB = {"mini": 0.7, "gpu": 1.2, "paper": 1.2}
# Host memory a cell's process takes (peak RSS: 1.57 GB for a mini cell, /usr/bin/time, 2026-12-04;
# the paper model's a guess): jobs beyond what the memory holds would swap
RUN_RAM_GIB = {"mini": 1.6, "gpu": 3.0, "paper": 3.0}
GPU_WHY = {"mini": "16 measured on one H200",
           "paper": "4 paper-size runs gave 1.7x one run's speed, 8 no more"}

# --- the rules' settings ---------------------------------------------------------------------------

# Scales sized for a CPU; the others train the paper's model (d=512), sized for GPUs: on a machine
# without one, lnexp atlas asks for --yes or --budget-min before it trains that model on the CPU
CPU_SCALES = ("mini",)
# Default budgets (minutes): mini on CPU = make atlas on 2 cores within 2 hours with the install,
# the dt column and the figures (docs/atlas.md); mini on a GPU = make atlas with the install and
# the figures within 15 minutes (a GPU window here); other scales: no limit
MINI_BUDGET_MIN = {"cpu": 100.0, "gpu": 10.0}
NO_LIMIT_S = 1e9
# Seeds per arm at most: at least claims.MAX_SEEDS; more where a quarter of the budget buys them
# for a two-cell claim on the jobs that run at once; never beyond what the power search knows (50)
SEED_SHARE = 0.25
SEEDS_CEILING = 50


@dataclass(frozen=True)
class Choice:
    """What lnexp atlas runs with on this machine, and why (one line each, printed)."""

    jobs: int
    budget_s: float
    cost_s: dict[int, float]  # a cell's seconds by depth, until cells of this atlas are measured
    device: str  # "cpu" or the GPUs' name
    why: tuple[str, ...]


def at_depth(cost_s: dict[int, float], depth: int) -> float:
    """A cell's seconds at ``depth`` from costs by depth: its own, else the dearest scaled by
    layers from the deepest (the one extrapolation over depth)."""
    return cost_s.get(depth, max(cost_s.values()) * depth / max(cost_s))


def first_cost(scale: str, depths: Iterable[int], max_update: int, ref_updates: int,
               gpu: bool) -> dict[int, float]:
    """A cell's seconds by depth before any is measured: the table's (GPU_COST_S on a GPU where it
    has the scale, else CPU_COST_S; a scale without one takes paper's), START_S plus the rest scaled
    to ``max_update`` of the experiment's ``ref_updates`` (0: the experiment's own length)."""
    table = (GPU_COST_S if gpu and scale in GPU_COST_S else CPU_COST_S).get(scale, CPU_COST_S["paper"])
    frac = max_update / ref_updates if 0 < max_update < ref_updates else 1.0
    out = {}
    for d in depths:
        at = at_depth(table, d)
        out[d] = round(min(START_S, at) + max(at - START_S, 0.0) * frac, 1)
    return out


def _capacity(cores: int, gpus: Sequence[Gpu], scale: str,
              memory_gib: float | None) -> tuple[int, str, str]:
    """(jobs the machine sustains, its device in words, why): one 1-thread job a CPU core; on GPUs,
    GPU_JOBS a GPU within its memory and one job a core (each job feeds its GPU from a core); never
    more than the host's memory holds (RUN_RAM_GIB a job)."""
    if gpus:
        per = min(GPU_JOBS.get(scale, 4),
                  *(int(0.8 * g.memory_gib / GPU_RUN_GIB.get(scale, 1.2)) for g in gpus))
        cap = max(1, min(cores, per * len(gpus)))
        names = sorted({g.name for g in gpus})
        device = f"{len(gpus)} x {' / '.join(names)}" if len(gpus) > 1 else names[0]
        sustains = (f"{device}: {per} a GPU, {GPU_WHY.get(scale, GPU_WHY['paper'])}; at most one a core "
                    f"of {cores}")
    else:
        cap, device = cores, "cpu"
        sustains = f"{cores} CPU cores: one 1-thread job a core"
    ram = RUN_RAM_GIB.get(scale, RUN_RAM_GIB["paper"])
    if memory_gib is not None and int(memory_gib / ram) < cap:
        cap = max(1, int(memory_gib / ram))
        sustains += f"; {memory_gib:.0f} GiB of memory hold {cap} at {ram:g} GiB a job"
    return cap, device, sustains


def _jobs(cap: int, sustains: str, jobs: int | None) -> tuple[int, str]:
    if jobs is None:
        return cap, f"{cap} jobs ({sustains})"
    if jobs > cap:
        return cap, f"--jobs {jobs} capped at {cap} ({sustains})"
    return jobs, f"{jobs} {'job' if jobs == 1 else 'jobs'} (--jobs)"


def _budget(scale: str, gpu: bool, budget_min: float | None) -> tuple[float, str]:
    if budget_min is not None:
        return budget_min * 60, f"budget {budget_min:g} min (--budget-min)"
    if scale == "mini":
        minutes = MINI_BUDGET_MIN["gpu" if gpu else "cpu"]
        return minutes * 60, (f"budget {minutes:g} min (mini's default on a "
                              + ("GPU: make atlas within a 15-minute GPU window)" if gpu
                                 else "CPU: make atlas within 2 hours on 2 cores)"))
    return NO_LIMIT_S, f"no budget limit (the {scale} scale's default)"


def choose_resources(cores: int, gpus: Sequence[Gpu], scale: str, depths: Iterable[int],
                     max_update: int = 0, jobs: int | None = None, budget_min: float | None = None,
                     memory_gib: float | None = None, ref_updates: int | None = None) -> Choice:
    """Jobs, budget and a cell's first cost from the machine: ``cores`` usable CPU cores, ``gpus``,
    ``max_update`` the cells' run length (0: the experiment's, ``ref_updates``; None: read from its
    YAML), ``memory_gib`` the host's memory (None: not a limit). ``jobs`` and ``budget_min``
    override (jobs capped at what the machine sustains, saying so)."""
    if ref_updates is None:
        from lnexp.atlas.grid import run_length

        ref_updates = run_length(scale)
    depths = tuple(depths)
    cap, device, sustains = _capacity(max(int(cores), 1), gpus, scale, memory_gib)
    chosen, jobs_why = _jobs(cap, sustains, jobs)
    cost = first_cost(scale, depths, max_update, ref_updates, bool(gpus))
    length = (f"max_update={max_update}" if 0 < max_update < ref_updates
              else f"{ref_updates} updates, the experiment's")
    kind = "gpu" if gpus else "cpu"
    where = (MEASURED_ON[kind] if (scale, kind) in MEASURED
             else f"an estimate: not measured at the {scale} scale on a {kind.upper()}")
    cost_why = ("a cell's first cost " + ", ".join(f"{cost[d]:.0f} s at {d}+{d}" for d in depths)
                + f" ({length}; {where}); measured cells replace it")
    budget_s, budget_why = _budget(scale, bool(gpus), budget_min)
    return Choice(chosen, budget_s, cost, device, (jobs_why, cost_why, budget_why))


def smallest_budget_min(cost_s: dict[int, float], reserve_s: float) -> float:
    """The smallest --budget-min that holds one cell (the cheapest) and the figures' reserve,
    rounded up to a tenth of a minute."""
    return math.ceil((reserve_s + min(cost_s.values())) / 6.0) / 10.0


def seed_cap(budget_s: float, jobs: int, cost_s: float, floor: int) -> int:
    """Seeds per arm the atlas may run: ``floor`` (claims.MAX_SEEDS), or more where SEED_SHARE of
    the budget runs that many seeds of a two-cell claim's cells on ``jobs`` at once, at ``cost_s``
    a cell; at most SEEDS_CEILING."""
    if not (math.isfinite(budget_s) and budget_s < NO_LIMIT_S):
        return SEEDS_CEILING
    afford = int(SEED_SHARE * budget_s * max(jobs, 1) / (2 * max(cost_s, 1e-9)))
    return max(floor, min(SEEDS_CEILING, afford))


def machine(overrides: list[str]) -> tuple[int, list[Gpu], str]:
    """(usable CPU cores, the GPUs the cells can use, how they were found): the host's
    (lnexp.runtime.host), none where the cells' overrides say ``device=cpu``."""
    from lnexp import overrides as override
    from lnexp.runtime import host

    if override.value(overrides, "device") == "cpu":
        return host.cores(), [], "device=cpu given"
    gpus, found = host.gpus()
    return host.cores(), gpus, found
