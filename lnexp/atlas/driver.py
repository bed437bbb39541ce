"""``lnexp atlas``: the zoo atlas, trained adaptively in rounds within a time budget.

Why a driver and not a Hydra Sweeper plugin: Hydra instantiates sweepers only from the
``hydra_plugins`` namespace package, a top-level package this repository's fixed layout has no room
for. So the choice of cells lives in :mod:`lnexp.atlas.plan` (pure, unit-tested) and each chosen
cell is one ``lnexp train`` run of ``experiment=atlas_SCALE`` (its folder, resume and skip-if-finished
are lnexp train's own), ``--jobs`` at a time. The full grid without adaptivity is Hydra's own
multirun (``--full`` prints the commands; Hydra's joblib or submitit launcher runs them).

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
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from lnexp.atlas import claims as C
from lnexp.atlas.grid import Grid, experiment_name, read_grid
from lnexp.atlas.outcomes import Arm, Cells, Scheme, cells, outcome
from lnexp.atlas.plan import Job, Seen, allocate, fits, next_cells
from lnexp.errors import ArgumentParser, UserError

# Each norm but LayerNorm (lnexp.names.NORMS) is a scheme in these placements, compared with LayerNorm
# in the same placement: Pre-LN, and Post-LN too for DyT (its parity claim covers both)
NORM_PLACEMENTS = {"dyt": ("pre_ln", "post_ln")}
NORM_PLACEMENTS_DEFAULT = ("pre_ln",)
# Seconds per run, two jobs of one thread each on 2 idle cores, before any run of this atlas has
# been timed (mini: the medians of the Intel make atlas of 2026-12-02, docs/results.md); measured runs replace
# them (the slowest, +10%).
DEFAULT_COST_S = {"mini": {6: 155.0, 18: 350.0}, "paper": {6: 3600.0, 18: 9000.0}}
FIGURE_RESERVE_S = 60.0  # kept back for lnexp figure atlas at the end
# Default budget at mini scale: make atlas = install (~2 min) + the dt column (~11 min) + these
# rounds + the figures, which must end within 2 hours on 2 cores with room for a slow run or install.
MINI_BUDGET_MIN = 100.0
STATE_FILE = "atlas_state.json"  # in runs_root: time spent so far (a resumed atlas spends the rest)
PLAN_FILE = "atlas_plan.json"  # in runs_root: cells launched, and the ones the budget left out


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
    """What lnexp atlas wrote of its last session (cells launched, not run, the grid's lrs); {} if none."""
    return _read(runs_root / PLAN_FILE)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


Launch = Callable[[list[str]], float]  # overrides -> seconds the run took


def launch_subprocess(extra: list[str], failed: list[int] | None = None) -> Launch:
    """``failed`` collects the exit status of each run that did not end well (main's exit status)."""

    def launch(ovr: list[str]) -> float:
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", "lnexp", "train", *ovr, *extra], check=False).returncode
        if rc != 0 and failed is not None:
            failed.append(rc)
        return time.monotonic() - t0

    return launch


def run_atlas(
    runs_root: Path,
    scale: str,
    budget_s: float,
    jobs: int,
    launch: Launch,
    grid: Grid | None = None,
    log: Callable[[str], None] = print,
    kinds: list[Scheme] | None = None,
) -> dict:
    """Rounds of cells until every phase is done or the budget cannot hold the next cell; returns the
    plan (also written to runs_root/atlas_plan.json). ``kinds``: the schemes (default: all)."""
    grid = grid or read_grid(scale)
    kinds = kinds or schemes()
    runs_root.mkdir(parents=True, exist_ok=True)
    state_path, plan_path = runs_root / STATE_FILE, runs_root / PLAN_FILE
    state = _read(state_path)
    state.setdefault("spent_s", 0.0)
    state.setdefault("costs", {})
    plan = {
        "scale": scale,
        "budget_s": budget_s,
        "jobs": jobs,
        "lrs": grid.lrs,
        "shared_lr": grid.shared_lr,
        "launched": [],
        "not_run": [],
        "stopped": None,
        "claims": {},
        "same_network": same_networks(),  # placements not run: their cells are these ones'
    }

    def cost(depth: int) -> float:
        measured = state["costs"].get(str(depth))
        if measured:
            return 1.1 * max(measured)
        table = DEFAULT_COST_S.get(scale, DEFAULT_COST_S["paper"])
        return table.get(depth, max(table.values()) * depth / max(table))

    def remaining() -> float:
        return budget_s - FIGURE_RESERVE_S - state["spent_s"]

    tried: set[Job] = set()

    def run_round(batch: list[Job]) -> int:
        """Launch the cells that fit; how many did (the rest are the plan's ``not_run``)."""
        k = fits([cost(c.arm.depth) for c in batch], jobs, remaining())
        plan["not_run"] = [_cell_doc(c, grid) for c in batch[k:]]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            t_round = time.monotonic()
            tried.update(batch[:k])
            futures = {pool.submit(launch, overrides(c, grid, scale)): c for c in batch[:k]}
            try:
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=30, return_when=FIRST_COMPLETED)
                    for f in done:
                        c = futures[f]
                        state["costs"].setdefault(str(c.arm.depth), []).append(round(f.result(), 1))
                        plan["launched"].append(_cell_doc(c, grid))
                    now = time.monotonic()
                    state["spent_s"] += now - t_round  # wall time, counted as it passes
                    t_round = now
                    _write(state_path, state)
            finally:
                _write(state_path, state)
                _write(plan_path, plan)
        return k

    seen = SeenRuns(runs_root, grid, scale)

    def unfinished(batch: list[Job]) -> list[Job]:
        got = seen()
        done = {(a, grid.lrs.index(lr), s) for (a, lr), c in got.items()
                for s, o in c.outcomes().items() if o != "missing"}
        return [j for j in batch if j not in tried and (j.arm, j.lr_index, j.seed) not in done]

    log(
        f"lnexp atlas: {len(kinds)} schemes, lrs {', '.join(f'{x:g}' for x in grid.lrs)}, warm-up "
        f"{grid.warmups}, depth {grid.depths}; budget {budget_s / 60:.0f} min, {state['spent_s'] / 60:.1f} "
        f"spent, {jobs} jobs"
    )
    for copy, of in plan["same_network"].items():
        log(f"lnexp atlas: {copy} is the same network as {of} (configs/placement/): not run twice")
    ok = True
    while ok and (cov := unfinished(coverage(grid, kinds))):
        log(f"lnexp atlas: coverage: {len(cov)} cells; {remaining() / 60:.1f} min of the budget left")
        ok = run_round(cov) > 0  # cut by the budget: offered again, as every round is
    if not ok:
        plan["stopped"] = f"budget: the coverage cells did not fit in {remaining():.0f} s"
    own = claims_of(kinds)
    while ok:
        verdicts = C.evaluate(grid, seen(), own, tried)
        plan["claims"] = {v.claim.id: v.text for v in verdicts}
        nxt = allocate(C.needs(verdicts, {d: cost(d) for d in grid.depths}), jobs, remaining())
        if not nxt:
            break
        names = sorted({v.claim.id for v in verdicts if set(v.jobs) & set(nxt)})
        log(f"lnexp atlas: claims ({', '.join(names)}): {len(nxt)} cells; {remaining() / 60:.1f} min left")
        ok = run_round(nxt) > 0
    if not ok and not plan["stopped"]:
        plan["stopped"] = f"budget: the claims' next cells did not fit in {remaining():.0f} s"
    for name, arms, seeds in phases(grid, kinds) if ok else []:
        while ok:
            # a cell tried once in this session and still unfinished (the run failed) is not retried
            # now: it is what a rerun retries, and it cannot hold the rounds in a loop
            batch = next_cells(arms, len(grid.lrs), grid.shared, seen_outcomes(seen(), grid), seeds,
                               pending=tried)
            if not batch:
                break
            log(f"lnexp atlas: {name}: {len(batch)} cells; {remaining() / 60:.1f} min of the budget left")
            # a round cut by the budget is offered again: runs faster than their estimate leave room
            ok = run_round(batch) > 0
        if not ok:
            plan["stopped"] = f"budget: the next cells of '{name}' did not fit in {remaining():.0f} s"
            break
    if ok:
        plan["stopped"] = "done: every phase finished"
    log(f"lnexp atlas: {plan['stopped']}; {len(plan['not_run'])} cells of the last round not run")
    plan["claims"] = {v.claim.id: v.text for v in C.evaluate(grid, seen(), own, tried)}
    for cid, text in plan["claims"].items():
        log(f"lnexp atlas: {cid}: {text}")
    _write(plan_path, plan)
    return plan


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
    return [
        f"lnexp train -m {common} placement={','.join(placements)} norm=layernorm",
        *(f"lnexp train -m {common} placement={','.join(ps)} norm={n}"
          for n, ps in norm_placements().items()),
    ]


def main(argv: list[str]) -> int:
    ap = ArgumentParser(
        prog="lnexp atlas",
        description="the zoo atlas: every scheme x lr x warm-up x depth, cells chosen in rounds within a "
        "time budget (coverage of every scheme, then the claims' runs to the claim cheapest to decide, then "
        "bisection for the largest stable lr); rerun to resume. Then: lnexp figure atlas --scale SCALE",
    )
    ap.add_argument("--scale", default="mini", help="mini (CPU) or paper (GPU): experiment=atlas_SCALE")
    ap.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help=f"minutes for all rounds (default: mini {MINI_BUDGET_MIN:g}, other scales no limit); "
        "a resumed atlas spends what is left",
    )
    ap.add_argument(
        "--jobs", type=int, default=2, help="runs at once (default 2: two 1-thread jobs on 2 cores)"
    )
    ap.add_argument("--runs-root", default="runs")
    ap.add_argument(
        "--shared-lr",
        type=float,
        default=None,
        help="the lr every arm is tried at first (default: the grid's second lr)",
    )
    ap.add_argument(
        "--full", action="store_true", help="print the full grid's lnexp train -m commands and exit"
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
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: give 1 or more")
    if not args.runs_root.strip():
        raise UserError("--runs-root is empty: give the folder that holds the runs, e.g. --runs-root runs")
    args.runs_root = Path(args.runs_root)
    grid = read_grid(args.scale, args.shared_lr)
    if args.full:
        print("\n".join(full_grid_commands(args.scale, grid)))
        return 0
    budget = (
        args.budget_min if args.budget_min is not None else (MINI_BUDGET_MIN if args.scale == "mini" else 1e9)
    ) * 60
    extra = [f"runs_root={args.runs_root}", *args.overrides]
    from lnexp.train.run import check_overrides

    jobs = coverage(grid, schemes())
    sample = overrides(jobs[0], grid, args.scale) if jobs else [f"experiment={experiment_name(args.scale)}"]
    own = {o.split("=", 1)[0] for o in sample} | {"residual_scale"}  # dt is a grid axis too
    for o in args.overrides:
        if o.lstrip("+~").split("=", 1)[0] in own:
            raise UserError(f"{o}: lnexp atlas sets {o.lstrip('+~').split('=', 1)[0]} for each cell "
                            f"(configs/experiment/{experiment_name(args.scale)}.yaml's grid): drop it")
    check_overrides([*sample, *extra])
    failed: list[int] = []
    run_atlas(args.runs_root, args.scale, budget, args.jobs, launch_subprocess(extra, failed), grid)
    if failed:
        print(f"lnexp atlas: error: {len(failed)} runs ended with an error (exit status "
              f"{', '.join(map(str, sorted(set(failed))))}): their messages are above; fix, then run "
              "the same command again to resume", file=sys.stderr)
        return 2 if 2 in failed else 1
    return 0
