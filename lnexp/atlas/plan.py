"""Which atlas cells to train next: pure functions of the grid and the outcomes seen so far (no
training, no files, no machine), so that the adaptive rule is unit-tested and a resumed atlas makes
the same choices.

An *arm* is (scheme, warm-up, depth); its cells are the lrs of a log2 grid. Assuming stability is
monotone in the lr, the largest stable lr of an arm is found by bisection, starting at the shared
lr (so that every arm has the cell the loss-at-a-shared-lr chart needs). Once the boundary is
bracketed (a stable lr next to an unstable one, or a stable top / unstable bottom), the cells on
both sides get the extra seeds. A cell is stable when every seed run there trained
(lnexp.atlas.outcomes.stable_of). The rounds: coverage (:func:`coverage`), the claims
(:func:`allocate` over lnexp.atlas.claims' needs), the LR sensitivity's zoo column
(:func:`zoo_column`), then the bisection phases (:func:`phases`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lnexp.atlas.grid import Grid
from lnexp.atlas.outcomes import Arm, Cell, Scheme, boundary, stable_of

Seen = Mapping[tuple[Arm, float], Mapping[int, str]]  # (arm, lr) -> {seed: outcome}, finished


def stable(outcomes: Mapping[int, str] | None) -> bool | None:
    return stable_of((outcomes or {}).values())


def bracket(arm: Arm, lrs: tuple[float, ...], seen: Seen) -> tuple[int, int]:
    """(lo, hi) as indices into ``lrs``: lo the largest lr known stable below the first known
    failure (-1: none), hi that failure's (len(lrs): none seen). The boundary lies between them."""
    return boundary([stable(seen.get((arm, lr))) for lr in lrs])


def next_probe(arm: Arm, grid: Grid, seen: Seen) -> float | None:
    """The lr the bisection tries next (first seed), or None once the boundary is bracketed."""
    n = len(grid.lrs)
    lo, hi = bracket(arm, grid.lrs, seen)
    if hi - lo <= 1:
        return None
    if lo == -1 and hi == n and (arm, grid.shared_lr) not in seen:
        return grid.shared_lr
    mid = (lo + hi + 1) // 2 if lo >= 0 else (lo + hi) // 2
    return grid.lrs[min(max(mid, 0), n - 1)]


def boundary_lrs(arm: Arm, lrs: tuple[float, ...], seen: Seen) -> list[float]:
    """The lrs on both sides of a bracketed boundary (those inside the grid)."""
    lo, hi = bracket(arm, lrs, seen)
    return [lrs[i] for i in (lo, hi) if 0 <= i < len(lrs)]


def next_cells(arms: Iterable[Arm], grid: Grid, seen: Seen, seeds: tuple[int, ...],
               pending: set[Cell] = frozenset()) -> list[Cell]:  # type: ignore[assignment]
    """One round: each arm's next bisection probe (first seed) or, once bracketed, the boundary
    cells' missing seeds. Cells in ``pending`` (launched, not finished) are not proposed again."""
    out: list[Cell] = []
    for arm in arms:
        probe = next_probe(arm, grid, seen)
        if probe is not None:
            cells = [Cell(arm, probe, seeds[0])]
        else:
            cells = [Cell(arm, lr, s) for lr in boundary_lrs(arm, grid.lrs, seen) for s in seeds
                     if s not in seen.get((arm, lr), {})]
        out += [c for c in cells if c not in pending]
    return out


def coverage(grid: Grid, schemes: Iterable[Scheme]) -> list[Cell]:
    """Every scheme's shallow cell at the shared lr, with and without warm-up, on the first seed:
    the row of the atlas's table every scheme gets before any claim round."""
    shallow = min(grid.depths)
    return [Cell(Arm(sc, w, shallow), grid.shared_lr, grid.seeds[0]) for sc in schemes for w in grid.warmups]


def zoo_column(grid: Grid, schemes: Iterable[Scheme]) -> list[Cell]:
    """Every scheme's shallow cells over the half-decade lr grid, with and without warm-up, on the
    first seed: its LR sensitivity in the atlas's table; scheme by scheme, so that a round the
    budget cuts leaves whole rows."""
    shallow = min(grid.depths)
    return [Cell(Arm(sc, w, shallow), lr, grid.seeds[0]) for sc in schemes for w in grid.warmups
            for lr in grid.sensitivity_lrs]


def phases(grid: Grid, schemes: list[Scheme]) -> list[tuple[str, list[Arm], tuple[int, ...]]]:
    """The bisection rounds, phase by phase: the shallow bisection (first seed), the shallow
    boundaries' other seeds, then the deep bisection and its boundaries."""
    shallow, deeper = min(grid.depths), sorted(set(grid.depths) - {min(grid.depths)})
    arms = lambda d: [Arm(sc, w, d) for sc in schemes for w in grid.warmups]  # noqa: E731
    out = [
        ("shallow bisection", arms(shallow), grid.seeds[:1]),
        ("shallow boundary seeds", arms(shallow), grid.seeds),
    ]
    for d in deeper:
        out += [
            (f"depth {d} bisection", arms(d), grid.seeds[:1]),
            (f"depth {d} boundary seeds", arms(d), grid.seeds),
        ]
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
    """What one claim still needs: decided or not, the cells (in launch order) that would decide it
    at the effect it states, and what they cost (seconds of one job)."""

    claim: str
    decided: bool
    cells: tuple[Cell, ...]
    cost_s: float


def allocate(needs: Iterable[Need], slots: int, remaining_s: float) -> list[Cell]:
    """The next round of a sequential design: ``slots`` cells (the jobs that run at once) for the
    undecided claims, the cheapest to decide first (its cells in order, then the next claim's). A
    decided claim gets none, nor one whose cells take longer than the budget left on ``slots`` jobs
    (its cost is in seconds of one job; it reports the runs it would still need)."""
    affordable = (n for n in needs if not n.decided and n.cells and n.cost_s / max(slots, 1) <= remaining_s)
    open_ = sorted(affordable, key=lambda n: (n.cost_s, n.claim))
    out: list[Cell] = []
    for n in open_:
        for c in n.cells:
            if len(out) >= slots:
                return out
            if c not in out:
                out.append(c)
    return out
