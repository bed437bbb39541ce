"""One atlas on one runs root, as one object (:class:`AtlasRun`): its budget, its plan (the cells
launched, stopped, failed and left out, written to runs_root/atlas_plan.json as it goes) and its
rounds, each trained by a :class:`lnexp.atlas.launchers.Launcher`, ``jobs`` at a time.

Rounds, in order: coverage (every scheme at the shared lr, with and without warm-up, seed 1), the
claims (lnexp.atlas.claims: each round's slots to the undecided claim cheapest to decide,
lnexp.atlas.plan.allocate), the zoo column (every scheme's LR sensitivity at the shallow depth, with
and without warm-up, seed 1, over the half-decade grid), then the bisection phases with what the
budget has left. The zoo column comes before the bisection: it is the only source of the table's
sensitivity column, and its seven lrs over three decades already bracket each of those arms' largest
stable lr within a half-decade, which the bisection then refines on the log2 grid. A round
launches the longest prefix of its cells that ends within the budget (lnexp.atlas.plan.fits); a
round the budget cut is offered again, as runs faster than their estimate leave room.

SIGINT/SIGTERM stop the rounds between two polls of the launcher (no thread, no lock is cut in the
middle): queued cells never start and running ones stop as lnexp train stops, kept to resume.
SIGALRM, set for the moment the whole budget is spent, stops the cells still running then.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from lnexp.atlas import claims as C
from lnexp.atlas.budget import Budget, read_doc
from lnexp.atlas.grid import Grid, experiments, read_grid, run_length
from lnexp.atlas.launchers import Ended, Launcher
from lnexp.atlas.outcomes import Cell, Scheme, SeedsAt, arm_of, outcome, seeds_at
from lnexp.atlas.plan import Seen, allocate, coverage, fits, next_cells, phases, zoo_column
from lnexp.atlas.resources import first_cost
from lnexp.atlas.schemes import same_networks
from lnexp.atlas.schemes import schemes as all_schemes
from lnexp.exit_status import Exit
from lnexp.results import Run
from lnexp.rundir import write_json

PLAN_FILE = "atlas_plan.json"  # in runs_root: cells launched, and the ones the budget left out


def read_plan(runs_root: Path) -> dict:
    """What lnexp atlas wrote of its last session (cells launched, not run, the grid's lrs); {} if
    none. A damaged file is refused (UserError naming the mend), never read as no plan."""
    doc = read_doc(runs_root / PLAN_FILE,
                   f"rerun lnexp atlas --runs-root {runs_root} to write it again, or delete it")
    return doc if doc is not None else {}


def claims_of(schemes: list[Scheme], grid: Grid) -> list[C.Claim]:
    """The claims whose every scheme is among ``schemes`` and that ``grid`` can test (the LR
    sensitivity's need its half-decade grid)."""
    return [c for c in C.claims_for(grid) if all(Scheme.of(a.scheme) in schemes for a in c.ats())]


class SeenRuns:
    """Finished runs of the atlas's experiments (atlas_SCALE, atlas_dt_SCALE's dt column and
    atlas_lrs_SCALE's half-decade grid) under ``runs_root``, grouped by arm and the grid's lr (either
    grid's). A finished run does not change, so each folder is read once (reading a run costs ~15 ms)."""

    def __init__(self, runs_root: Path, grid: Grid, scale: str) -> None:
        self.root, self.grid = runs_root, grid
        self.experiments = tuple(experiments(scale))
        self.final: dict[Path, Run | None] = {}

    def __call__(self) -> SeedsAt:
        from lnexp.results import find_run_dirs, load_run

        for d in find_run_dirs(self.root) if self.root.is_dir() else []:
            if d in self.final:
                continue
            run = load_run(d, self.root)
            if outcome(run) == "missing":
                continue  # not finished: read again next round
            self.final[d] = run if run.experiment in self.experiments and self._lr(run) else None
        got = seeds_at(r for r in self.final.values() if r is not None)
        return {(a, self._on_grid(lr)): runs for (a, lr), runs in got.items()}

    def outcomes(self) -> Seen:
        """The plan's view: (arm, lr) -> {seed: outcome} of the finished runs."""
        return {key: {s: o for s, o in runs.outcomes().items() if o != "missing"}
                for key, runs in self().items()}

    def done(self) -> set[Cell]:
        return {Cell(a, lr, s) for (a, lr), seeds in self.outcomes().items() for s in seeds}

    def statuses(self) -> dict[Cell, str]:
        """Every run's status word (finished or not), by its cell: read now, not remembered."""
        from lnexp.results import find_run_dirs, load_run

        out = {}
        for d in find_run_dirs(self.root):
            run = load_run(d, self.root)
            if run.experiment in self.experiments and self._lr(run):
                out[Cell(arm_of(run), self._on_grid(float(run.get("lr"))), int(run.get("seed")))] = run.state
        return out

    def _lr(self, run: Run) -> bool:
        """The run's lr is one of the grid's (the log2 grid's or the half-decade one's)."""
        return self.grid.on_grid(float(run.get("lr", math.nan))) is not None

    def _on_grid(self, lr: float) -> float:
        """The grid's value of a run's lr (as its config wrote it)."""
        return self.grid.on_grid(lr) or lr


class _Stopped(Exception):
    """Unwinds the rounds once a signal (AtlasRun.stopped_by) stopped the launcher."""


class AtlasRun:
    """The rounds of cells of one atlas until every phase is done, the budget cannot hold the next
    cell, or a signal stops it. ``schemes``: the schemes trained; ``max_seeds``: seeds per arm at
    most; ``launcher``: trains each round's cells (with the overrides every cell gets); ``claims``:
    those pursued (default: every claim of these schemes that the grid can test)."""

    def __init__(self, runs_root: Path, scale: str, budget: Budget, jobs: int, launcher: Launcher,
                 grid: Grid, schemes: list[Scheme], max_seeds: int,
                 log: Callable[[str], None] = print, claims: list[C.Claim] | None = None) -> None:
        self.root, self.scale, self.budget, self.jobs = runs_root, scale, budget, jobs
        self.launcher, self.grid, self.schemes = launcher, grid, schemes
        self.max_seeds, self.log = max_seeds, log
        self.claims = claims_of(schemes, grid) if claims is None else claims
        self.seen = SeenRuns(runs_root, grid, scale)
        self.tried: set[Cell] = set()  # launched in this session
        self.session: list[Cell] = []  # ended in this session (finished, failed or stopped)
        self.stopped_by: int | None = None  # the signal that stopped the rounds
        self.plan: dict = {
            "scale": scale, "budget_s": budget.budget_s, "jobs": jobs,
            "launcher": getattr(launcher, "name", type(launcher).__name__), "lrs": grid.lrs,
            "shared_lr": grid.shared_lr, "sensitivity_lrs": grid.sensitivity_lrs, "max_seeds": max_seeds,
            "launched": [], "interrupted": [], "failed": [], "not_run": [], "stopped": None, "claims": {},
            "same_network": same_networks(),  # placements not run: their cells are these ones'
        }

    @property
    def plan_path(self) -> Path:
        return self.root / PLAN_FILE

    def run(self) -> dict:
        """The rounds, then each claim's verdict; returns the plan (also written to the plan file)."""
        self.root.mkdir(parents=True, exist_ok=True)
        g, jobs = self.grid, f"{self.jobs} {'job' if self.jobs == 1 else 'jobs'}"
        sens = (f" (LR sensitivity over {', '.join(f'{x:g}' for x in g.sensitivity_lrs)})"
                if g.sensitivity_lrs else "")
        self.log(f"lnexp atlas: {len(self.schemes)} schemes, lrs {', '.join(f'{x:g}' for x in g.lrs)}{sens}, "
                 f"warm-up {g.warmups}, depth {g.depths}; {self.budget.header()}, {jobs}, at most "
                 f"{self.max_seeds} seeds a cell")
        for copy, of in self.plan["same_network"].items():
            self.log(f"lnexp atlas: {copy} is the same network as {of} (configs/placement/): not run twice")
        with self._signals():
            try:
                self.plan["stopped"] = self._rounds()
            except _Stopped:
                if self.stopped_by != signal.SIGALRM:
                    self.plan["stopped"] = "interrupted: a signal stopped the rounds"
                    write_json(self.plan_path, self.plan)
                    return self.plan
                self.plan["stopped"] = ("budget: spent while cells ran; they were stopped and kept (status "
                                        "interrupted): a larger --budget-min resumes them")
        self.log(f"lnexp atlas: {self.plan['stopped']}; {len(self.plan['not_run'])} cells of the last round "
                 "not run")
        self.plan["claims"] = {v.claim.id: v.text for v in self._verdicts()}
        for cid, text in self.plan["claims"].items():
            self.log(f"lnexp atlas: {cid}: {text}")
        write_json(self.plan_path, self.plan)
        return self.plan

    @property
    def interrupted(self) -> bool:
        return str(self.plan.get("stopped")).startswith("interrupted")

    def counts(self) -> tuple[int, int]:
        """(finished, stopped and kept) among this session's cells, as each one's own status.json
        says: a cell stopped before it made its folder is neither."""
        from lnexp.run_status import FINAL

        status = self.seen.statuses()
        words = [status.get(c) for c in self.session]
        return sum(w in FINAL for w in words), sum(w == "interrupted" for w in words)

    # --- the rounds ---

    def _rounds(self) -> str:
        """Coverage, the claims, the zoo column, the bisection phases, each while the budget holds
        their cells; what stopped them."""
        if not self._coverage():
            return f"budget: the coverage cells did not fit in {max(self.budget.remaining(), 0):.0f} s"
        if not self._claim_rounds():
            return f"budget: the claims' next cells did not fit in {max(self.budget.remaining(), 0):.0f} s"
        if not self._zoo_column():
            return (f"budget: the zoo column's next cells did not fit in "
                    f"{max(self.budget.remaining(), 0):.0f} s")
        for name, arms, seeds in phases(self.grid, self.schemes):
            # a cell tried once in this session and still unfinished (the run failed) is not retried
            # now: it is what a rerun retries, and it cannot hold the rounds in a loop
            while batch := next_cells(arms, self.grid, self.seen.outcomes(), seeds, pending=self.tried):
                self.log(f"lnexp atlas: {name}: {len(batch)} cells; {self.budget.left()}")
                if not self.launch(batch):  # a round cut by the budget is offered again, as every round is
                    return (f"budget: the next cells of '{name}' did not fit in "
                            f"{max(self.budget.remaining(), 0):.0f} s")
        return "done: every phase finished"

    def _coverage(self) -> bool:
        return self._fixed("coverage", coverage(self.grid, self.schemes))

    def _zoo_column(self) -> bool:
        """Every scheme's LR sensitivity at the shallow depth, with and without warm-up (seed 1):
        the half-decade grid's cells not run yet (none where the scale has no such grid)."""
        return self._fixed("LR sensitivity, zoo column", zoo_column(self.grid, self.schemes))

    def _fixed(self, name: str, cells: list[Cell]) -> bool:
        """A phase of cells known before it starts: rounds until each has run (or was tried); False
        when the budget holds none of those left."""
        while left := self._unfinished(cells):
            self.log(f"lnexp atlas: {name}: {len(left)} cells; {self.budget.left()}")
            if not self.launch(left):
                return False
        return True

    def _claim_rounds(self) -> bool:
        while True:
            verdicts = self._verdicts()
            self.plan["claims"] = {v.claim.id: v.text for v in verdicts}
            cost = {d: self.budget.cost(d) for d in self.grid.depths}
            batch = allocate(C.needs(verdicts, cost), self.jobs, self.budget.remaining())
            if not batch:
                return True
            names = sorted({v.claim.id for v in verdicts if set(v.cells) & set(batch)})
            self.log(f"lnexp atlas: claims ({', '.join(names)}): {len(batch)} cells; {self.budget.left()}")
            if not self.launch(batch):
                return False

    def _verdicts(self) -> list[C.Verdict]:
        return C.evaluate(self.grid, self.seen(), self.claims, self.tried, max_seeds=self.max_seeds)

    def _unfinished(self, batch: list[Cell]) -> list[Cell]:
        done = self.seen.done()
        return [c for c in batch if c not in self.tried and c not in done]

    def launch(self, batch: list[Cell]) -> int:
        """Launch the cells that fit; how many did (the rest are the plan's ``not_run``)."""
        if self.stopped_by is not None:
            raise _Stopped
        k = fits([self.budget.cost(c.arm.depth) for c in batch], self.jobs, self.budget.remaining())
        self.plan["not_run"] = [c.doc() for c in batch[k:]]
        self.tried.update(batch[:k])
        self.budget.start()
        if self.budget.limited:  # cells still running when the whole budget is spent stop there
            self._alarm(self.budget.until_spent())
        try:
            self.launcher.run_round(batch[:k], self.jobs, partial(self._ended, batch))
        finally:
            self._alarm(0)
            self.budget.tick()
            self.budget.save()
            write_json(self.plan_path, self.plan)
        if self.stopped_by is not None:
            raise _Stopped
        return k

    def _ended(self, batch: list[Cell], e: Ended) -> None:
        cell = batch[e.index]
        self.session.append(cell)
        if e.status == Exit.INTERRUPTED:  # cut short: its time says nothing of a cell's cost
            self.plan["interrupted"].append(cell.doc())
        else:
            self.budget.measured(cell.arm.depth, e.seconds)
            self.plan["launched"].append(cell.doc())
            if e.status != Exit.OK:
                self.plan["failed"].append({**cell.doc(), "status": e.status})
        self.budget.tick()
        self.budget.save()

    # --- signals ---

    def _on_signal(self, signum: int, frame: object) -> None:
        """SIGINT, SIGTERM, or SIGALRM at the budget's end: the launcher stops (queued cells never
        start, running ones stop as lnexp train stops); the rounds end after the round. It raises
        nothing, so no lock or wait is cut in the middle."""
        if self.stopped_by is None or self.stopped_by == signal.SIGALRM:
            self.stopped_by = signum
        self.launcher.stop()

    @contextmanager
    def _signals(self) -> Iterator[None]:
        """The rounds' handlers of SIGINT, SIGTERM and SIGALRM, the old ones put back after; none
        outside the main thread (signals reach the main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            for s, h in old.items():
                signal.signal(s, h)

    @staticmethod
    def _alarm(seconds: float) -> None:
        """SIGALRM in ``seconds`` (0: none), from the main thread only (where the handler is ours)."""
        if threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001) if seconds > 0 else 0.0)


def run_atlas(runs_root: Path, scale: str, budget_s: float, jobs: int, launcher: Launcher,
              grid: Grid | None = None, log: Callable[[str], None] = print,
              schemes: list[Scheme] | None = None, cost_s: dict[int, float] | None = None,
              max_seeds: int | None = None, costs_for: dict | None = None,
              claims: list[C.Claim] | None = None) -> dict:
    """An :class:`AtlasRun` with its :class:`Budget` (``cost_s``: a cell's seconds by depth until
    cells are measured; default: 2 CPU cores' at the experiment's length; ``costs_for``: what the
    measured costs hold for; ``claims``: those pursued, by default every one the schemes and grid
    can test) run; returns its plan (``plan["stopped"]`` says why it ended)."""
    grid = grid or read_grid(scale)
    first = cost_s or first_cost(scale, grid.depths, 0, run_length(scale), gpu=False)
    budget = Budget(runs_root, budget_s, first, costs_for, log)
    return AtlasRun(runs_root, scale, budget, jobs, launcher, grid, schemes or all_schemes(),
                    max_seeds or C.MAX_SEEDS, log, claims).run()
