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
