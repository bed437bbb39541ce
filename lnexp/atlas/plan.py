"""Which atlas cells to train next: a pure function of the outcomes seen so far (no training, no
files), so that the adaptive rule is unit-tested and a resumed atlas makes the same choices.

An *arm* is (scheme, warm-up, depth); its cells are the lrs of a log2 grid. Assuming stability is
monotone in the lr, the largest stable lr of an arm is found by bisection, starting at the shared
lr (so that every arm has the cell the loss-at-a-shared-lr chart needs). Once the boundary is
bracketed (a stable lr next to an unstable one, or a stable top / unstable bottom), the cells on
both sides get the extra seeds. A cell is stable when every seed run there trained
(lnexp.atlas.outcomes.stable_of).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lnexp.atlas.outcomes import Arm, boundary, stable_of


@dataclass(frozen=True, order=True)
class Job:
    """One run to launch: an arm at one lr (an index into the grid) with one seed."""

    arm: Arm
    lr_index: int
    seed: int


Seen = Mapping[tuple[Arm, int], Mapping[int, str]]  # (arm, lr index) -> {seed: outcome}, finished


def stable(outcomes: Mapping[int, str] | None) -> bool | None:
    return stable_of((outcomes or {}).values())


def bracket(arm: Arm, n_lrs: int, seen: Seen) -> tuple[int, int]:
    """(lo, hi): lo the largest lr index known stable below the first known failure (-1: none),
    hi that failure's index (n_lrs: none seen). The boundary lies between them."""
    return boundary([stable(seen.get((arm, i))) for i in range(n_lrs)])


def next_probe(arm: Arm, n_lrs: int, shared: int, seen: Seen) -> int | None:
    """The lr index the bisection tries next (seed 1), or None when the boundary is bracketed."""
    lo, hi = bracket(arm, n_lrs, seen)
    if hi - lo <= 1:
        return None
    if lo == -1 and hi == n_lrs and (arm, shared) not in seen:
        return shared
    mid = (lo + hi + 1) // 2 if lo >= 0 else (lo + hi) // 2
    return min(max(mid, 0), n_lrs - 1)


def boundary_cells(arm: Arm, n_lrs: int, seen: Seen) -> list[int]:
    """The lr indices on both sides of a bracketed boundary (those inside the grid)."""
    lo, hi = bracket(arm, n_lrs, seen)
    return [i for i in (lo, hi) if 0 <= i < n_lrs]


def next_cells(
    arms: Iterable[Arm],
    n_lrs: int,
    shared: int,
    seen: Seen,
    seeds: tuple[int, ...],
    pending: set[Job] = frozenset(),
) -> list[Job]:  # type: ignore[assignment]
    """One round: each arm's next bisection probe (first seed) or, once bracketed, the boundary
    cells' missing seeds. Cells in ``pending`` (launched, not finished) are not proposed again."""
    out: list[Job] = []
    for arm in arms:
        probe = next_probe(arm, n_lrs, shared, seen)
        if probe is not None:
            cells = [Job(arm, probe, seeds[0])]
        else:
            cells = [
                Job(arm, i, s)
                for i in boundary_cells(arm, n_lrs, seen)
                for s in seeds
                if s not in seen.get((arm, i), {})
            ]
        out += [c for c in cells if c not in pending]
    return out


def fits(costs: list[float], jobs: int, remaining_s: float) -> int:
    """How many of ``costs`` (seconds each, in launch order) fit in ``remaining_s`` when ``jobs``
    run at once: a greedy schedule of the prefix (each cell to the job free first) must end in time."""
    free = [0.0] * max(jobs, 1)
    for k, c in enumerate(costs):
        i = free.index(min(free))
        if free[i] + c > remaining_s:
            return k
        free[i] += c
    return len(costs)


@dataclass(frozen=True)
class Need:
    """What one claim still needs: decided or not, the runs (in launch order) that would decide it at
    the effect it states, and what they cost (seconds of one job)."""

    claim: str
    decided: bool
    jobs: tuple[Job, ...]
    cost_s: float


def allocate(needs: Iterable[Need], slots: int, remaining_s: float) -> list[Job]:
    """The next round of a sequential design: ``slots`` runs (the jobs that run at once) for the
    undecided claims, the cheapest to decide first (its runs in order, then the next claim's). A
    decided claim gets none, nor one whose runs take longer than the budget left on ``slots`` jobs
    (its cost is in seconds of one job; it reports the runs it would still need)."""
    open_ = sorted((n for n in needs if not n.decided and n.jobs and n.cost_s / max(slots, 1) <= remaining_s),
                   key=lambda n: (n.cost_s, n.claim))
    out: list[Job] = []
    for n in open_:
        for j in n.jobs:
            if len(out) >= slots:
                return out
            if j not in out:
                out.append(j)
    return out


# --- what the machine affords: jobs, budget, a cell's cost before one is measured -------------------

# Seconds a cell takes, before any cell of this atlas has ended, at the experiment's own run length
# (``REF_UPDATES``), by depth. CPU: two 1-thread jobs on 2 idle cores, the medians of the Intel make
# atlas of 2026-12-02 (docs/results.md); a cell's time is its own core's, so more cores run more
# cells at the same cost. GPU (mini): one NVIDIA H200 with 16 cores, 16 jobs sharing it, 2026-12-04
# (../shared/measurements/2026-12-04-h200: 74 cells in 290 s, launch to end 34-81 s, ~1,000 cells/h,
# so ~58 s a cell); 18+18 was not run there: 6+6's time x the CPU's 18/6 ratio.
CPU_COST_S = {"mini": {6: 155.0, 18: 350.0}, "paper": {6: 3600.0, 18: 9000.0}}
GPU_COST_S = {"mini": {6: 58.0, 18: 131.0}}
MEASURED_ON = {"cpu": "measured on 2 CPU cores, 2 jobs", "gpu": "measured on one H200, 16 jobs"}
MEASURED = {("mini", "cpu"), ("mini", "gpu")}  # (scale, device) whose costs above were measured
# Scales sized for a CPU; the others train the paper's model (d=512), sized for GPUs: on a machine
# without one, lnexp atlas asks for --yes or --budget-min before it trains that model on the CPU
CPU_SCALES = ("mini",)
REF_UPDATES = {"mini": 120, "gpu": 930, "paper": 8000}  # configs/experiment/atlas_SCALE.yaml max_update
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


def first_cost(scale: str, depths: Iterable[int], max_update: int, gpu: bool) -> dict[int, float]:
    """A cell's seconds by depth before any is measured: the table's (GPU_COST_S on a GPU where it
    has the scale, else CPU_COST_S; an unknown scale takes paper's), START_S plus the rest scaled
    to ``max_update`` (0: the experiment's own length)."""
    table = (GPU_COST_S if gpu and scale in GPU_COST_S else CPU_COST_S).get(scale, CPU_COST_S["paper"])
    ref = REF_UPDATES.get(scale, REF_UPDATES["paper"])
    frac = max_update / ref if 0 < max_update < ref else 1.0
    out = {}
    for d in depths:
        at = table.get(d, max(table.values()) * d / max(table))
        out[d] = round(min(START_S, at) + max(at - START_S, 0.0) * frac, 1)
    return out


def choose_resources(cores: int, gpus: list[tuple[str, float]], scale: str, depths: Iterable[int],
                     max_update: int = 0, jobs: int | None = None,
                     budget_min: float | None = None, memory_gib: float | None = None) -> Choice:
    """Jobs, budget and a cell's first cost from the machine: ``cores`` usable CPU cores, ``gpus``
    (name, memory in GiB) each, ``max_update`` the cells' run length (0: the experiment's),
    ``memory_gib`` the host's memory (None: not a limit). On CPU, one 1-thread job a core; on GPUs,
    GPU_JOBS a GPU within its memory and one job a core (each job feeds its GPU from a core); never
    more than the host's memory holds (RUN_RAM_GIB a job). ``jobs`` and ``budget_min`` override
    (jobs capped at what the machine sustains, saying so)."""
    cores = max(int(cores), 1)
    depths = tuple(depths)
    why: list[str] = []
    if gpus:
        per = min(GPU_JOBS.get(scale, 4), *(int(0.8 * mem / GPU_RUN_GIB.get(scale, 1.2)) for _, mem in gpus))
        cap = max(1, min(cores, per * len(gpus)))
        names = sorted({n for n, _ in gpus})
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
    if jobs is None:
        chosen = cap
        why.append(f"{chosen} jobs ({sustains})")
    elif jobs > cap:
        chosen = cap
        why.append(f"--jobs {jobs} capped at {cap} ({sustains})")
    else:
        chosen = jobs
        why.append(f"{chosen} {'job' if chosen == 1 else 'jobs'} (--jobs)")
    cost = first_cost(scale, depths, max_update, bool(gpus))
    ref = REF_UPDATES.get(scale, REF_UPDATES["paper"])
    length = f"max_update={max_update}" if 0 < max_update < ref else f"{ref} updates, the experiment's"
    kind = "gpu" if gpus else "cpu"
    where = (MEASURED_ON[kind] if (scale, kind) in MEASURED
             else f"an estimate: not measured at the {scale} scale on a {kind.upper()}")
    why.append("a cell's first cost " + ", ".join(f"{cost[d]:.0f} s at {d}+{d}" for d in depths)
               + f" ({length}; {where}); measured cells replace it")
    if budget_min is not None:
        budget_s = budget_min * 60
        why.append(f"budget {budget_min:g} min (--budget-min)")
    elif scale == "mini":
        budget_s = MINI_BUDGET_MIN[kind] * 60
        why.append(f"budget {MINI_BUDGET_MIN[kind]:g} min (mini's default on a "
                   + ("GPU: make atlas within a 15-minute GPU window)" if gpus
                      else "CPU: make atlas within 2 hours on 2 cores)"))
    else:
        budget_s = NO_LIMIT_S
        why.append(f"no budget limit (the {scale} scale's default)")
    return Choice(chosen, budget_s, cost, device, tuple(why))


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
