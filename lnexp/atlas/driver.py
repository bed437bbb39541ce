"""``lnexp atlas``: the zoo atlas, trained adaptively in rounds within a time budget.

Why a driver and not a Hydra Sweeper plugin: Hydra instantiates sweepers only from the
``hydra_plugins`` namespace package, a top-level package this repository's fixed layout has no room
for. So the choice of cells lives in :mod:`lnexp.atlas.plan` (pure, unit-tested) and each chosen
cell is one ``lnexp train`` run of ``experiment=atlas_SCALE`` (its folder, resume and skip-if-finished
are lnexp train's own), trained by a :class:`lnexp.atlas.launchers.Launcher` (``--launcher``),
``--jobs`` at a time. The full grid without adaptivity is Hydra's own multirun (``--full`` prints the
commands; Hydra's joblib or submitit launcher runs them).

The jobs, the budget and a cell's cost before one is measured come from the machine
(:func:`lnexp.atlas.plan.choose_resources`: cores, GPUs, memory), printed with why. One atlas at a
time holds a runs root (:func:`atlas_lock`); SIGINT/SIGTERM stop it between two polls of the
launcher (no thread, no lock is cut in the middle): queued cells never start, running ones stop as
lnexp train stops, and ``main`` exits 130 saying the same command resumes.

Rounds, in order: coverage (every scheme at the shared lr, with and without warm-up, seed 1), the
claims (lnexp.atlas.claims: each round's slots to the undecided claim cheapest to decide,
lnexp.atlas.plan.allocate), then the bisection phases with what the budget has left.

The grid (lrs, warm-ups, depths, seeds) is the experiment's ``hydra.sweeper.params``; the schemes are
every configs/placement/*.yaml with norm=layernorm (a copy of another's network once:
``same_networks``), and each other norm in NORM_PLACEMENTS' placements.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lnexp.atlas import claims as C
from lnexp.atlas import launchers
from lnexp.atlas.grid import Grid, experiment_name, read_grid
from lnexp.atlas.launchers import INTERRUPTED, Ended, Launcher, LaunchSetup
from lnexp.atlas.outcomes import Arm, Cells, Scheme, arm_of, cells, outcome
from lnexp.atlas.plan import (
    CPU_COST_S,
    CPU_SCALES,
    MINI_BUDGET_MIN,
    NO_LIMIT_S,
    Choice,
    Job,
    Seen,
    allocate,
    choose_resources,
    first_cost,
    fits,
    next_cells,
    seed_cap,
    smallest_budget_min,
)
from lnexp.errors import ArgumentParser, UserError
from lnexp.rundir import write_json
from lnexp.runtime import sharing

# Each norm but LayerNorm (lnexp.names.NORMS) is a scheme in these placements, compared with LayerNorm
# in the same placement: Pre-LN, and Post-LN too for DyT (its parity claim covers both)
NORM_PLACEMENTS = {"dyt": ("pre_ln", "post_ln")}
NORM_PLACEMENTS_DEFAULT = ("pre_ln",)
# A cell's seconds before one of this atlas has ended, by scale and depth (2 CPU cores; the GPU's
# and the scaling to max_update: lnexp.atlas.plan.first_cost); measured cells replace them (the
# slowest, +10%)
DEFAULT_COST_S = CPU_COST_S
# How cells are trained unless --launcher (or hydra/launcher=submitit_*) says: one process a cell
# (lnexp.atlas.launchers; `worker` trains them in long-lived processes, docs/performance.md)
DEFAULT_LAUNCHER = "process"
FIGURE_RESERVE_S = 60.0  # kept back for lnexp figure atlas at the end
STATE_FILE = "atlas_state.json"  # in runs_root: time spent so far (a resumed atlas spends the rest)
PLAN_FILE = "atlas_plan.json"  # in runs_root: cells launched, and the ones the budget left out
LOCK_FILE = ".lnexp-atlas-lock.json"  # in runs_root: pid and host of the lnexp atlas that runs there


def same_networks() -> dict[str, str]:
    """{placement: the earlier one it equals}: placements whose structure (lnexp.scheme.Placement, what
    the model is built from) differs only in its name train the same network to the same numbers
    (Sandwich-LN is Peri-LN's structure; the measured atlas gave both the same losses to 4 decimals),
    so the atlas runs the first only. Their recipes do not matter here: every atlas experiment sets
    the schedule and the warm-up."""
    from dataclasses import replace

    from lnexp.names import PLACEMENTS
    from lnexp.scheme import Placement, group_file

    first: dict[str, str] = {}
    out = {}
    for p in PLACEMENTS:
        key = replace(Placement.from_config(group_file("placement", p)), name="").to_json()
        out.update({p: first[key]} if key in first else {})
        first.setdefault(key, p)
    return out


def atlas_placements() -> list[str]:
    """The placements the atlas trains: every configs/placement/*.yaml but a copy of an earlier one."""
    from lnexp.names import PLACEMENTS

    copies = same_networks()
    return [p for p in PLACEMENTS if p not in copies]


def schemes() -> list[Scheme]:
    placements = atlas_placements()
    return [Scheme(p) for p in placements] + [Scheme(p, n) for n, ps in norm_placements().items()
                                              for p in ps if p in placements]


def norm_placements() -> dict[str, tuple[str, ...]]:
    """{norm: the placements it is a scheme in}, for every norm but LayerNorm."""
    from lnexp.names import NORMS

    return {n: NORM_PLACEMENTS.get(n, NORM_PLACEMENTS_DEFAULT) for n in NORMS if n != "layernorm"}


def coverage(grid: Grid, kinds: list[Scheme]) -> list[Job]:
    """Every scheme's shallow cell at the shared lr, with and without warm-up, on the first seed:
    the row of the atlas's table every scheme gets before any claim round."""
    shallow = min(grid.depths)
    return [Job(Arm(sc, w, shallow), grid.shared, grid.seeds[0]) for sc in kinds for w in grid.warmups]


def claims_of(kinds: list[Scheme]) -> list[C.Claim]:
    """The claims whose every scheme is among ``kinds`` (all of them by default)."""
    return [c for c in C.CLAIMS if all(Scheme.of(a.scheme) in kinds for a in c.ats())]


def phases(grid: Grid, kinds: list[Scheme]) -> list[tuple[str, list[Arm], tuple[int, ...]]]:
    """Rounds run phase by phase: the shallow bisection (first seed), the shallow boundaries' other
    seeds, then the deep bisection and its boundaries."""
    shallow, deeper = min(grid.depths), sorted(set(grid.depths) - {min(grid.depths)})
    arms = lambda d: [Arm(sc, w, d) for sc in kinds for w in grid.warmups]  # noqa: E731
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


def overrides(cell: Job, grid: Grid, scale: str) -> list[str]:
    a = cell.arm
    dt = [] if a.dt == 1.0 else [f"residual_scale={a.dt:g}"]
    return [
        f"experiment={experiment_name(scale)}",
        f"placement={a.scheme.placement}",
        f"norm={a.scheme.norm}",
        f"depth={a.depth}",
        f"lr={grid.lrs[cell.lr_index]:g}",
        f"warmup={a.warmup}",
        f"seed={cell.seed}",
        *dt,
    ]


class SeenRuns:
    """Finished runs of the atlas's experiments (atlas_SCALE, and atlas_dt_SCALE's dt column) under
    ``runs_root``, as cells on the grid's lrs. A finished run does not change, so each folder is read
    once (reading a run costs ~15 ms)."""

    def __init__(self, runs_root: Path, grid: Grid, scale: str) -> None:
        self.root, self.grid = runs_root, grid
        self.experiments = (experiment_name(scale), f"atlas_dt_{scale}")
        self.final: dict[Path, object] = {}

    def __call__(self) -> Cells:
        from lnexp.results import find_run_dirs, load_run

        for d in find_run_dirs(self.root) if self.root.is_dir() else []:
            if d in self.final:
                continue
            run = load_run(d, self.root)
            if outcome(run) == "missing":
                continue  # not finished: read again next round
            lr = float(run.get("lr", math.nan))
            on_grid = any(math.isclose(x, lr, rel_tol=1e-6) for x in self.grid.lrs)
            self.final[d] = run if run.experiment in self.experiments and on_grid else None
        got = cells(r for r in self.final.values() if r is not None)
        return {(a, self._lr(lr)): c for (a, lr), c in got.items()}

    def _lr(self, lr: float) -> float:
        return next(x for x in self.grid.lrs if math.isclose(x, lr, rel_tol=1e-6))


def seen_outcomes(got: Cells, grid: Grid) -> Seen:
    """The plan's view of the cells: (arm, lr index) -> {seed: outcome} of the finished runs."""
    return {(a, grid.lrs.index(lr)): {s: o for s, o in c.outcomes().items() if o != "missing"}
            for (a, lr), c in got.items()}


def read_plan(runs_root: Path) -> dict:
    """What lnexp atlas wrote of its last session (cells launched, not run, the grid's lrs); {} if
    none. A damaged file is refused (UserError naming the mend), never read as no plan."""
    path = runs_root / PLAN_FILE
    doc = _read_doc(path, f"rerun lnexp atlas --runs-root {runs_root} to write it again, or delete it")
    return doc if doc is not None else {}


def read_state(runs_root: Path) -> dict:
    """The atlas's budget spent so far and the cells' measured costs (runs_root/atlas_state.json;
    a fresh one if none). A damaged file is refused, never reset: it holds the budget spent."""
    path = runs_root / STATE_FILE
    mend = ("it holds the budget spent so far: mend it (e.g. {\"spent_s\": 1800, \"costs\": {}} for "
            "30 minutes spent), or delete it to grant the atlas a fresh budget")
    doc = _read_doc(path, mend)
    if doc is None:
        return {"spent_s": 0.0, "costs": {}}
    spent, costs = doc.get("spent_s", 0.0), doc.get("costs", {})
    ok = (isinstance(spent, int | float) and not isinstance(spent, bool) and math.isfinite(spent)
          and spent >= 0 and isinstance(costs, dict)
          and all(isinstance(v, list) and all(isinstance(x, int | float) for x in v) for v in costs.values()))
    if not ok:
        raise UserError(f"{path} is damaged (spent_s must be seconds >= 0, costs lists of seconds by "
                        f"depth): {mend}")
    return {**doc, "spent_s": float(spent), "costs": costs}


def _read_doc(path: Path, mend: str) -> dict | None:
    """A JSON object file; None if there is none; UserError naming ``mend`` if it is damaged."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path} cannot be read ({e}): {mend}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UserError(f"{path} is damaged (not JSON: {e}): {mend}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} is damaged (not a JSON object): {mend}")
    return doc


# --- one atlas at a time on a runs root; a signal stops it ------------------------------------------


class AtlasLocked(UserError):
    """Another lnexp atlas runs on this runs root; the message names it and what to do."""


def _atlas_holder_alive(holder: dict) -> bool:
    """The holder's process runs on this host; on another host its atlas is taken to be alive (no
    heartbeat to tell): the refusal says which file to delete once it is gone."""
    from lnexp.rundir import same_process

    pid = int(holder.get("pid") or 0)
    if holder.get("host") == socket.gethostname():
        return pid > 0 and same_process(pid, holder.get("started"))
    return True


def _atlas_refusal(runs_root: Path, holder: dict) -> AtlasLocked:
    since = time.strftime("%H:%M:%S", time.localtime(float(holder.get("since", 0))))
    pid, host = holder.get("pid"), holder.get("host")
    here = host == socket.gethostname()
    stop = f"kill {pid}" if here else f"kill {pid} on {host}; if it is gone, delete {runs_root / LOCK_FILE}"
    return AtlasLocked(f"{runs_root} is already used by lnexp atlas pid {pid} on host {host} (since "
                       f"{since}): wait for it to finish, or stop it ({stop}) and run the same command "
                       "again to resume")


@contextmanager
def atlas_lock(runs_root: Path) -> Iterator[None]:
    """One lnexp atlas at a time on ``runs_root`` (two would each skip the cell the other trains and
    run twice the jobs); a lock whose process is gone is taken over, as a run's is."""
    from lnexp.runtime import runlock

    path = runlock.take(runs_root / LOCK_FILE, _atlas_holder_alive,
                        lambda h: _atlas_refusal(runs_root, h), f"{runs_root} (lnexp atlas)")
    try:
        yield
    finally:
        runlock.release(path)


class _Stop:
    """The handler of SIGINT and SIGTERM while rounds run, and of SIGALRM when the budget is spent:
    it asks the launcher to stop (its queued cells never start, running ones stop as lnexp train
    stops, kept to resume); the driver then ends after the round. It raises nothing, so no lock or
    wait is cut in the middle."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher, self.asked, self.out_of_time = launcher, False, False
        self.timed = False  # SIGALRM is ours: the rounds may set the budget's alarm

    def __call__(self, signum: int, frame: object) -> None:
        if signum == signal.SIGALRM:
            self.out_of_time = True
        else:
            self.asked = True
        self.launcher.stop()

    def alarm(self, seconds: float) -> None:
        """SIGALRM in ``seconds`` (0: none): the budget's end, where the cells still running stop."""
        if self.timed:
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001) if seconds > 0 else 0.0)


@contextmanager
def _stopped_by_signals(launcher: Launcher) -> Iterator[_Stop]:
    stop = _Stop(launcher)
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield stop
        return
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    stop.timed = True
    try:
        yield stop
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        for s, h in old.items():
            signal.signal(s, h)


class _Interrupted(Exception):
    """Unwinds the rounds once a signal stopped the launcher."""


class _OutOfTime(Exception):
    """Unwinds the rounds once the budget's end stopped the launcher."""


def run_atlas(
    runs_root: Path,
    scale: str,
    budget_s: float,
    jobs: int,
    launcher: Launcher,
    grid: Grid | None = None,
    log: Callable[[str], None] = print,
    kinds: list[Scheme] | None = None,
    extra: list[str] | None = None,
    cost_s: dict[int, float] | None = None,
    max_seeds: int | None = None,
    costs_for: dict | None = None,
) -> dict:
    """Rounds of cells until every phase is done, the budget cannot hold the next cell, or a signal
    stops it (``plan["interrupted"]``); returns the plan (also written to runs_root/atlas_plan.json).
    ``kinds``: the schemes (default: all); ``extra``: overrides every cell gets (runs_root, the
    user's); ``cost_s``: a cell's seconds by depth until cells are measured (default: 2 CPU cores'
    at the experiment's length); ``max_seeds``: seeds per arm at most (default claims.MAX_SEEDS);
    ``costs_for``: what the measured costs hold for (length, device, jobs): costs measured for
    another are set aside."""
    grid = grid or read_grid(scale)
    kinds = kinds or schemes()
    extra = list(extra or [])
    max_seeds = max_seeds or C.MAX_SEEDS
    first = cost_s or first_cost(scale, grid.depths, 0, gpu=False)
    runs_root.mkdir(parents=True, exist_ok=True)
    state_path, plan_path = runs_root / STATE_FILE, runs_root / PLAN_FILE
    state = read_state(runs_root)
    if costs_for is not None and state.get("costs_for", costs_for) != costs_for and state["costs"]:
        log(f"lnexp atlas: the costs measured before were for {state['costs_for']}, not {costs_for}: "
            "set aside")
        state["costs"] = {}
    if costs_for is not None:
        state["costs_for"] = costs_for
    plan = {
        "scale": scale,
        "budget_s": budget_s,
        "jobs": jobs,
        "launcher": getattr(launcher, "name", type(launcher).__name__),
        "lrs": grid.lrs,
        "shared_lr": grid.shared_lr,
        "max_seeds": max_seeds,
        "launched": [],
        "interrupted": [],
        "failed": [],
        "not_run": [],
        "stopped": None,
        "claims": {},
        "same_network": same_networks(),  # placements not run: their cells are these ones'
    }

    def cost(depth: int) -> float:
        measured = state["costs"].get(str(depth))
        if measured:
            return 1.1 * max(measured)
        return first.get(depth, max(first.values()) * depth / max(first))

    def remaining() -> float:
        return budget_s - FIGURE_RESERVE_S - state["spent_s"]

    def left() -> str:
        if budget_s >= NO_LIMIT_S:
            return "no budget limit"
        return f"{max(remaining(), 0.0) / 60:.1f} min of the budget left"

    tried: set[Job] = set()

    def run_round(batch: list[Job]) -> int:
        """Launch the cells that fit; how many did (the rest are the plan's ``not_run``)."""
        if stop.asked:
            raise _Interrupted
        k = fits([cost(c.arm.depth) for c in batch], jobs, remaining())
        plan["not_run"] = [_cell_doc(c, grid) for c in batch[k:]]
        tried.update(batch[:k])
        t_round = [time.monotonic()]

        def spend() -> None:
            now = time.monotonic()
            state["spent_s"] += now - t_round[0]  # wall time, counted as it passes
            t_round[0] = now

        def ended(e: Ended) -> None:
            c, doc = batch[e.index], _cell_doc(batch[e.index], grid)
            if e.status == INTERRUPTED:  # cut short: its time says nothing of a cell's cost
                plan["interrupted"].append(doc)
            else:
                state["costs"].setdefault(str(c.arm.depth), []).append(round(e.seconds, 1))
                plan["launched"].append(doc)
                if e.status != 0:
                    plan["failed"].append({**doc, "status": e.status})
            spend()
            write_json(state_path, state)

        if budget_s < NO_LIMIT_S:  # cells still running when the budget is spent are stopped, kept
            stop.alarm(budget_s - state["spent_s"])
        try:
            launcher.run_round([[*overrides(c, grid, scale), *extra] for c in batch[:k]], jobs, ended)
        finally:
            stop.alarm(0)
            spend()
            write_json(state_path, state)
            write_json(plan_path, plan)
        if stop.asked:
            raise _Interrupted
        if stop.out_of_time:
            raise _OutOfTime
        return k

    seen = SeenRuns(runs_root, grid, scale)

    def unfinished(batch: list[Job]) -> list[Job]:
        got = seen()
        done = {(a, grid.lrs.index(lr), s) for (a, lr), c in got.items()
                for s, o in c.outcomes().items() if o != "missing"}
        return [j for j in batch if j not in tried and (j.arm, j.lr_index, j.seed) not in done]

    budget = ("no budget limit" if budget_s >= NO_LIMIT_S else
              f"budget {budget_s / 60:g} min ({FIGURE_RESERVE_S:.0f} s of it kept for the figures; a cell "
              f"still running when it is spent is stopped and kept), {state['spent_s'] / 60:.1f} spent")
    log(
        f"lnexp atlas: {len(kinds)} schemes, lrs {', '.join(f'{x:g}' for x in grid.lrs)}, warm-up "
        f"{grid.warmups}, depth {grid.depths}; {budget}, {jobs} {'job' if jobs == 1 else 'jobs'}, at "
        f"most {max_seeds} seeds a cell"
    )
    for copy, of in plan["same_network"].items():
        log(f"lnexp atlas: {copy} is the same network as {of} (configs/placement/): not run twice")
    own = claims_of(kinds)
    with _stopped_by_signals(launcher) as stop:
        try:
            _rounds(plan, grid, kinds, own, seen, unfinished, run_round, tried, jobs, cost, remaining,
                    left, log, max_seeds)
        except _Interrupted:
            plan["stopped"] = "interrupted: a signal stopped the rounds"
            write_json(plan_path, plan)
            return plan
        except _OutOfTime:
            plan["stopped"] = ("budget: spent while cells ran; they were stopped and kept (status "
                               "interrupted): a larger --budget-min resumes them")
    log(f"lnexp atlas: {plan['stopped']}; {len(plan['not_run'])} cells of the last round not run")
    plan["claims"] = {v.claim.id: v.text for v in C.evaluate(grid, seen(), own, tried, max_seeds=max_seeds)}
    for cid, text in plan["claims"].items():
        log(f"lnexp atlas: {cid}: {text}")
    write_json(plan_path, plan)
    return plan


def _rounds(plan: dict, grid: Grid, kinds: list[Scheme], own: list[C.Claim], seen: SeenRuns,
            unfinished: Callable[[list[Job]], list[Job]], run_round: Callable[[list[Job]], int],
            tried: set[Job], jobs: int, cost: Callable[[int], float], remaining: Callable[[], float],
            left: Callable[[], str], log: Callable[[str], None], max_seeds: int) -> None:
    """Coverage, the claims, the bisection phases: each round's cells launched through ``run_round``
    while the budget holds them; sets ``plan["stopped"]``."""
    ok = True
    while ok and (cov := unfinished(coverage(grid, kinds))):
        log(f"lnexp atlas: coverage: {len(cov)} cells; {left()}")
        ok = run_round(cov) > 0  # cut by the budget: offered again, as every round is
    if not ok:
        plan["stopped"] = f"budget: the coverage cells did not fit in {max(remaining(), 0):.0f} s"
    while ok:
        verdicts = C.evaluate(grid, seen(), own, tried, max_seeds=max_seeds)
        plan["claims"] = {v.claim.id: v.text for v in verdicts}
        nxt = allocate(C.needs(verdicts, {d: cost(d) for d in grid.depths}), jobs, remaining())
        if not nxt:
            break
        names = sorted({v.claim.id for v in verdicts if set(v.jobs) & set(nxt)})
        log(f"lnexp atlas: claims ({', '.join(names)}): {len(nxt)} cells; {left()}")
        ok = run_round(nxt) > 0
    if not ok and not plan["stopped"]:
        plan["stopped"] = f"budget: the claims' next cells did not fit in {max(remaining(), 0):.0f} s"
    for name, arms, seeds in phases(grid, kinds) if ok else []:
        while ok:
            # a cell tried once in this session and still unfinished (the run failed) is not retried
            # now: it is what a rerun retries, and it cannot hold the rounds in a loop
            batch = next_cells(arms, len(grid.lrs), grid.shared, seen_outcomes(seen(), grid), seeds,
                               pending=tried)
            if not batch:
                break
            log(f"lnexp atlas: {name}: {len(batch)} cells; {left()}")
            # a round cut by the budget is offered again: runs faster than their estimate leave room
            ok = run_round(batch) > 0
        if not ok:
            plan["stopped"] = (f"budget: the next cells of '{name}' did not fit in "
                               f"{max(remaining(), 0):.0f} s")
            break
    if ok:
        plan["stopped"] = "done: every phase finished"


def _cell_doc(c: Job, grid: Grid) -> dict:
    return {
        "scheme": c.arm.scheme.label,
        "placement": c.arm.scheme.placement,
        "norm": c.arm.scheme.norm,
        "warmup": c.arm.warmup,
        "depth": c.arm.depth,
        "lr": grid.lrs[c.lr_index],
        "seed": c.seed,
        "dt": c.arm.dt,
    }


def full_grid_commands(scale: str, grid: Grid) -> list[str]:
    """The whole grid as Hydra multiruns (``lnexp train -m``), for GPUs: no adaptivity, no budget."""
    placements = atlas_placements()
    common = (
        f"experiment={experiment_name(scale)} lr={','.join(f'{x:g}' for x in grid.lrs)} "
        f"warmup={','.join(map(str, grid.warmups))} depth={','.join(map(str, grid.depths))} "
        f"seed={','.join(map(str, grid.seeds))}"
    )
    # each other norm's placements, grouped so that one command sweeps every norm a placement shares
    by_placement: dict[str, list[str]] = {}
    for n, ps in norm_placements().items():
        for p in ps:
            if p in placements:
                by_placement.setdefault(p, []).append(n)
    same_norms: dict[tuple[str, ...], list[str]] = {}
    for p, ns in by_placement.items():
        same_norms.setdefault(tuple(ns), []).append(p)
    return [
        f"lnexp train -m {common} placement={','.join(placements)} norm=layernorm",
        *(f"lnexp train -m {common} placement={','.join(ps)} norm={','.join(ns)}"
          for ns, ps in same_norms.items()),
    ]


def machine(ovr: list[str]) -> tuple[int, list[tuple[str, str, float]], str]:
    """(usable CPU cores, the GPUs the cells can use as (CUDA id, name, memory GiB), how they were
    found). Found without CUDA in the driver (torch's CUDA start-up takes seconds, and the driver has
    no use for a CUDA context): ``nvidia-smi`` lists the GPUs with their names and memory,
    CUDA_VISIBLE_DEVICES narrows them, and a CPU build of torch (its version ends in +cpu, read from
    its metadata) or ``device=cpu`` among the overrides means none."""
    cores = sharing.cores()
    if any(o.split("=", 1) == ["device", "cpu"] for o in ovr):
        return cores, [], "device=cpu given"
    try:
        from importlib.metadata import version

        if version("torch").endswith("+cpu"):
            return cores, [], f"torch {version('torch')} is a CPU build"
    except Exception:  # noqa: BLE001 - no torch metadata: nvidia-smi decides
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return cores, [], "no nvidia-smi"
    gpus = gpus_of(out.stdout if out.returncode == 0 else "", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return cores, gpus, "nvidia-smi" if gpus else "nvidia-smi lists no GPU"


def gpus_of(listing: str, visible: str | None) -> list[tuple[str, str, float]]:
    """(CUDA id as the cells will see it, name, memory GiB) of each GPU in ``nvidia-smi
    --query-gpu=index,name,memory.total --format=csv,noheader,nounits`` output, narrowed to
    ``visible`` (CUDA_VISIBLE_DEVICES: indices, or UUIDs counted; None: every GPU)."""
    gpus = []
    for line in listing.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3:
            try:
                gpus.append((parts[0], parts[1], float(parts[2]) / 1024))
            except ValueError:
                continue
    if visible is None:
        return gpus
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    wanted = wanted[:wanted.index("-1")] if "-1" in wanted else wanted  # CUDA stops at an invalid id
    if all(v.isdigit() for v in wanted):  # renumbered from 0 in CUDA_VISIBLE_DEVICES's order
        by_index = {g[0]: g for g in gpus}
        return [(str(k), by_index[v][1], by_index[v][2]) for k, v in enumerate(wanted) if v in by_index]
    return [(str(k), g[1], g[2]) for k, g in enumerate(gpus[:len(wanted)])]  # UUIDs: as many as listed


def _memory_gib() -> float | None:
    """The host's memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _max_update(ovr: list[str]) -> int:
    """The cells' max_update given among the overrides (0: the experiment's own)."""
    for o in ovr:
        key, _, value = o.lstrip("+~").partition("=")
        if key == "max_update":
            try:
                return max(int(value), 0)
            except ValueError:
                return 0  # check_overrides names the mistake
    return 0


def main(argv: list[str]) -> int:
    known = launchers.names()
    ap = ArgumentParser(
        prog="lnexp atlas",
        description="the zoo atlas: every scheme x lr x warm-up x depth, cells chosen in rounds within a "
        "time budget (coverage of every scheme, then the claims' runs to the claim cheapest to decide, then "
        "bisection for the largest stable lr); rerun to resume. Jobs, budget and a cell's first cost are "
        "chosen from the machine (its cores and GPUs) and printed. Then: lnexp figure atlas --scale SCALE",
    )
    ap.add_argument("--scale", default="mini", help="mini (CPU) or paper (GPU): experiment=atlas_SCALE")
    ap.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help=f"minutes for all rounds (default: mini {MINI_BUDGET_MIN['cpu']:g} on CPU, "
        f"{MINI_BUDGET_MIN['gpu']:g} on a GPU; other scales no limit); a resumed atlas spends what is left",
    )
    ap.add_argument(
        "--jobs", type=int, default=None,
        help="runs at once (default: one 1-thread job a CPU core; on GPUs what they sustain, at most "
        "one a core); more than the machine sustains is capped, saying so",
    )
    ap.add_argument("--runs-root", default="runs")
    ap.add_argument(
        "--shared-lr",
        type=float,
        default=None,
        help="the lr every arm is tried at first (default: the grid's second lr)",
    )
    ap.add_argument(
        "--launcher", default=None,
        help=f"how cells are trained (default {DEFAULT_LAUNCHER}, or submitit_* where "
        "hydra/launcher=submitit_* is among the overrides): "
        + "; ".join(f"{n}: {h}" for n, h in known.items()),
    )
    ap.add_argument(
        "--full", action="store_true", help="print the full grid's lnexp train -m commands and exit"
    )
    ap.add_argument(
        "--yes", action="store_true",
        help="train a GPU scale (gpu, paper: the paper's model) on this machine's CPU with no budget "
        "limit, where it has no GPU (else give --budget-min)",
    )
    ap.add_argument(
        "overrides",
        nargs="*",
        help="more lnexp train overrides for every run (e.g. "
        "hydra/launcher=basic is not needed; max_update=20 for a smoke test)",
    )
    args = ap.parse_args(argv)
    # checked once before any run: a mistake is one line, not one per cell
    for flag, value, eg in (("--budget-min", args.budget_min, 100), ("--shared-lr", args.shared_lr, 1e-3)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag} {value:g}: give a positive number, e.g. {flag} {eg:g}")
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: give 1 or more")
    if not args.runs_root.strip():
        raise UserError("--runs-root is empty: give the folder that holds the runs, e.g. --runs-root runs")
    _check_runs_root(Path(args.runs_root))
    args.launcher = args.launcher or launchers.named_in(args.overrides) or DEFAULT_LAUNCHER
    if args.launcher not in known:
        raise UserError(f"--launcher {args.launcher}: not a launcher; use one of {', '.join(known)}")
    # hydra/launcher=... and hydra.launcher.* set a cluster's job arrays, not the cells' training
    launch_over = [o for o in args.overrides if o.lstrip("+~").startswith(("hydra/launcher=",
                                                                            "hydra.launcher."))]
    args.overrides = [o for o in args.overrides if o not in launch_over]
    if launch_over and not args.launcher.startswith("submitit_"):
        raise UserError(f"{launch_over[0]}: a cluster's setting; give it with --launcher submitit_slurm "
                        "(or hydra/launcher=submitit_slurm), or drop it")
    args.runs_root = Path(args.runs_root)
    grid = read_grid(args.scale, args.shared_lr)
    if args.full:
        print("\n".join(full_grid_commands(args.scale, grid)))
        return 0
    extra = [f"runs_root={args.runs_root}", *args.overrides]
    from lnexp.train.run import check_overrides

    cover = coverage(grid, schemes())
    sample = overrides(cover[0], grid, args.scale) if cover else [f"experiment={experiment_name(args.scale)}"]
    own = {o.split("=", 1)[0] for o in sample} | {"residual_scale"}  # dt is a grid axis too
    for o in args.overrides:
        if o.lstrip("+~").split("=", 1)[0] in own:
            raise UserError(f"{o}: lnexp atlas sets {o.lstrip('+~').split('=', 1)[0]} for each cell "
                            f"(configs/experiment/{experiment_name(args.scale)}.yaml's grid): drop it")
    check_overrides([*sample, *extra])
    read_state(args.runs_root)  # a damaged one is refused before anything is written
    cores, gpus, found = machine(args.overrides)
    if args.scale not in CPU_SCALES and not gpus and not args.yes and args.budget_min is None:
        raise UserError(f"--scale {args.scale} trains the paper's model, sized for a GPU, and this machine "
                        f"has none ({found}): give --budget-min M to train it on this CPU within M minutes, "
                        "or --yes to train it with no limit, or use --scale mini")
    max_update = _max_update(args.overrides)
    choice = choose_resources(cores, [(n, m) for _, n, m in gpus], args.scale, grid.depths, max_update,
                              args.jobs, args.budget_min, _memory_gib())
    _check_budget(choice, args.budget_min)
    cheapest = min(choice.cost_s.values())
    cap = seed_cap(choice.budget_s, choice.jobs, cheapest, C.MAX_SEEDS)
    print(f"lnexp atlas: {cores} cores, {choice.device} ({found}): " + "; ".join(choice.why)
          + f"; at most {cap} seeds a cell", flush=True)
    launcher = launchers.make(args.launcher, LaunchSetup(args.runs_root, args.scale,
                                                          tuple(i for i, _, _ in gpus), tuple(launch_over)))
    with atlas_lock(args.runs_root):
        plan = run_atlas(args.runs_root, args.scale, choice.budget_s, choice.jobs, launcher, grid,
                         extra=extra, cost_s=choice.cost_s, max_seeds=cap,
                         costs_for={"max_update": max_update, "device": choice.device, "jobs": choice.jobs,
                                    "launcher": args.launcher})
    if str(plan.get("stopped")).startswith("interrupted"):
        done, stopped = session_counts(args.runs_root, args.scale, plan["launched"] + plan["interrupted"])
        print(f"lnexp atlas: interrupted: {done} {'cell' if done == 1 else 'cells'} finished in this "
              f"session, {stopped} stopped and kept (status interrupted); the same command resumes",
              file=sys.stderr)
        return INTERRUPTED
    failed = [int(f["status"]) for f in plan["failed"]]
    if failed:
        print(f"lnexp atlas: error: {len(failed)} runs ended with an error ({_how(failed)}): their "
              "messages are above; fix, then run the same command again to resume", file=sys.stderr)
        return 2 if 2 in failed else 1
    return 0


def _how(statuses: list[int]) -> str:
    """How cells ended, in words: exit statuses, and a signal's death as such (128 + N)."""
    codes = sorted({s for s in statuses if s <= 128})
    killed = sorted({s - 128 for s in statuses if s > 128 and s != INTERRUPTED})
    words = [f"exit status {', '.join(map(str, codes))}"] if codes else []
    for n in killed:
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = "an unknown signal"
        words.append(f"killed by signal {n} ({name})")
    return "; ".join(words)


def _check_runs_root(root: Path) -> None:
    """A runs root that is a file (or lies under one) is refused before anything is read or written:
    it is the folder of the runs, made if missing."""
    for p in (root, *root.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == root else f"lies under {p}, a file"
                raise UserError(f"--runs-root {root} {where}, not a folder: give a folder (made if "
                                "missing), e.g. --runs-root runs")
            return


def session_counts(runs_root: Path, scale: str, docs: list[dict]) -> tuple[int, int]:
    """(finished, stopped and kept) among the cells of ``docs`` (those this session launched), as
    each cell's own status.json says: a cell without a folder is neither."""
    from lnexp.results import find_run_dirs, load_run
    from lnexp.run_status import FINAL

    experiments = (experiment_name(scale), f"atlas_dt_{scale}")
    status: dict[tuple, str] = {}  # (scheme, warm-up, depth, dt, lr, seed) -> status word
    for d in find_run_dirs(runs_root):
        run = load_run(d, runs_root)
        if run.experiment in experiments:
            a = arm_of(run)
            lr = f"{float(run.get('lr', math.nan)):.6g}"
            status[(a.scheme.label, a.warmup, a.depth, a.dt, lr, int(run.get("seed", 0)))] = run.state

    def of(doc: dict) -> str | None:
        return status.get((doc["scheme"], doc["warmup"], doc["depth"], doc["dt"], f"{doc['lr']:.6g}",
                           doc["seed"]))

    words = [of(d) for d in docs]
    return sum(w in FINAL for w in words), sum(w == "interrupted" for w in words)


def _check_budget(choice: Choice, given: float | None) -> None:
    """A budget that cannot hold one cell (the cheapest, with the figures' reserve) is refused before
    anything is written, naming the smallest that can."""
    cheapest = min(choice.cost_s.values())
    if choice.budget_s - FIGURE_RESERVE_S >= cheapest:
        return
    least = smallest_budget_min(choice.cost_s, FIGURE_RESERVE_S)
    what = (f"--budget-min {given:g}" if given is not None
            else f"the default budget of {choice.budget_s / 60:g} min")
    raise UserError(f"{what} cannot hold one cell ({cheapest:.0f} s) and the {FIGURE_RESERVE_S:.0f} s kept "
                    f"for the figures: give --budget-min {least:g} or more")
