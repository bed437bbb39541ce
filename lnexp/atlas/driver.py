"""``lnexp atlas``: the zoo atlas, trained adaptively in rounds within a time budget.

Why a driver and not a Hydra Sweeper plugin: Hydra instantiates sweepers only from the
``hydra_plugins`` namespace package, a top-level package this repository's fixed layout has no room
for. So the choice of cells lives in :mod:`lnexp.atlas.plan` (pure, unit-tested), the rounds in
:class:`lnexp.atlas.rounds.AtlasRun`, and each chosen cell is one ``lnexp train`` run of
``experiment=atlas_SCALE`` (its folder, resume and skip-if-finished are lnexp train's own), trained
by a :class:`lnexp.atlas.launchers.Launcher` (``--launcher``), ``--jobs`` at a time. The full grid
without adaptivity is Hydra's own multirun (``--full`` prints the commands; Hydra's joblib or
submitit launcher runs them).

This module is the command: its options, everything checked before anything is written (one line
naming the fix each), the jobs, budget and a cell's first cost chosen from the machine
(:func:`lnexp.atlas.resources.choose_resources`, printed with why), one atlas at a time on a runs
root (:func:`atlas_lock`), and the last line and exit status: 130 when a signal stopped it (the same
command resumes).
"""

from __future__ import annotations

import math
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from lnexp import overrides as override
from lnexp.atlas import claims as C
from lnexp.atlas import launchers
from lnexp.atlas.budget import FIGURE_RESERVE_S, Budget, read_state
from lnexp.atlas.grid import Grid, experiment_name, read_grid
from lnexp.atlas.launchers import LaunchSetup
from lnexp.atlas.outcomes import Cell
from lnexp.atlas.plan import coverage
from lnexp.atlas.resources import (
    CPU_SCALES,
    MINI_BUDGET_MIN,
    Choice,
    choose_resources,
    machine,
    seed_cap,
    smallest_budget_min,
)
from lnexp.atlas.rounds import AtlasRun
from lnexp.atlas.schemes import full_grid_commands, schemes
from lnexp.errors import ArgumentParser, UserError
from lnexp.exit_status import Exit, describe
from lnexp.runtime.host import memory_gib

# How cells are trained unless --launcher (or hydra/launcher=submitit_*) says: one process a cell
# (lnexp.atlas.launchers; `worker` trains them in long-lived processes, docs/performance.md)
DEFAULT_LAUNCHER = "process"
LOCK_FILE = ".lnexp-atlas-lock.json"  # in runs_root: pid and host of the lnexp atlas that runs there


def main(argv: list[str]) -> int:
    args = _parser(launchers.names()).parse_args(argv)
    setup = _checked_setup(args)  # a mistake is one line, not one per cell, and nothing is written
    grid = read_grid(args.scale, args.shared_lr)
    if args.full:
        print("\n".join(full_grid_commands(args.scale, grid)))
        return Exit.OK
    if args.claims_cost:
        print(claims_cost(grid))
        return Exit.OK
    _check_cell_overrides(setup, args.scale, grid)
    read_state(setup.runs_root)  # a damaged one is refused before anything is written
    cores, gpus, found = machine(list(setup.overrides))
    if args.scale not in CPU_SCALES and not gpus and not args.yes and args.budget_min is None:
        raise UserError(f"--scale {args.scale} trains the paper's model, sized for a GPU, and this machine "
                        f"has none ({found}): give --budget-min M to train it on this CPU within M minutes, "
                        "or --yes to train it with no limit, or use --scale mini")
    max_update = _max_update(list(setup.overrides))
    choice = choose_resources(cores, gpus, args.scale, grid.depths, max_update, args.jobs, args.budget_min,
                              memory_gib())
    _check_budget(choice, args.budget_min)
    cap = seed_cap(choice.budget_s, choice.jobs, min(choice.cost_s.values()), C.MAX_SEEDS)
    print(f"lnexp atlas: {cores} cores, {choice.device} ({found}): " + "; ".join(choice.why)
          + f"; at most {cap} seeds a cell", flush=True)
    setup = replace(setup, gpus=tuple(g.id for g in gpus))
    launcher = launchers.make(args.launcher, setup)
    costs_for = {"max_update": max_update, "device": choice.device, "jobs": choice.jobs,
                 "launcher": args.launcher}
    with atlas_lock(setup.runs_root):
        budget = Budget(setup.runs_root, choice.budget_s, choice.cost_s, costs_for)
        run = AtlasRun(setup.runs_root, args.scale, budget, choice.jobs, launcher, grid, schemes(), cap)
        run.run()
    return _last_word(run)


def _parser(known: dict[str, str]) -> ArgumentParser:
    ap = ArgumentParser(
        prog="lnexp atlas",
        description="the zoo atlas: every scheme x lr x warm-up x depth, cells chosen in rounds within a "
        "time budget (coverage of every scheme, then the claims' runs to the claim cheapest to decide, then "
        "bisection for the largest stable lr); rerun to resume. Jobs, budget and a cell's first cost are "
        "chosen from the machine (its cores and GPUs) and printed. Then: lnexp figure atlas --scale SCALE",
    )
    ap.add_argument("--scale", default="mini", help="mini (CPU) or paper (GPU): experiment=atlas_SCALE")
    ap.add_argument(
        "--budget-min", type=float, default=None,
        help=f"minutes for all rounds (default: mini {MINI_BUDGET_MIN['cpu']:g} on CPU, "
        f"{MINI_BUDGET_MIN['gpu']:g} on a GPU; other scales no limit); a resumed atlas spends what is left",
    )
    ap.add_argument(
        "--jobs", type=int, default=None,
        help="runs at once (default: one 1-thread job a CPU core; on GPUs what they sustain, at most "
        "one a core); more than the machine sustains is capped, saying so",
    )
    ap.add_argument("--runs-root", default="runs")
    ap.add_argument("--shared-lr", type=float, default=None,
                    help="the lr every arm is tried at first (default: the grid's second lr)")
    ap.add_argument(
        "--launcher", default=None,
        help=f"how cells are trained (default {DEFAULT_LAUNCHER}, or submitit_* where "
        "hydra/launcher=submitit_* is among the overrides): "
        + "; ".join(f"{n}: {h}" for n, h in known.items()),
    )
    ap.add_argument("--full", action="store_true",
                    help="print the full grid's lnexp train -m commands and exit")
    ap.add_argument("--claims-cost", action="store_true",
                    help="print the cells each claim needs at its stated effect (before any run) and exit")
    ap.add_argument(
        "--yes", action="store_true",
        help="train a GPU scale (gpu, paper: the paper's model) on this machine's CPU with no budget "
        "limit, where it has no GPU (else give --budget-min)",
    )
    ap.add_argument(
        "overrides", nargs="*",
        help="more lnexp train overrides for every run (e.g. "
        "hydra/launcher=basic is not needed; max_update=20 for a smoke test)",
    )
    return ap


def claims_cost(grid: Grid) -> str:
    """What ``--claims-cost`` prints: per claim the seeds a cell and the cells by depth that its test
    needs at its stated effect, planned before any run (lnexp.atlas.claims.planned), and the total."""
    from lnexp.plural import count

    rows = C.planned(grid)
    depths = sorted({d for r in rows for d in r["by_depth"]})
    head = ["claim", "test", "effect", "seeds a cell", *(f"cells {d}+{d}" for d in depths)]
    cells = [head] + [[r["claim"], r["test"], "-" if r["test"] in C.STABILITY else f"{r['effect']:.3g}",
                       str(r["seeds"]),
                       *(f"{r['by_depth'].get(d, 0):,}" for d in depths)] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    total = {d: sum(r["by_depth"].get(d, 0) for r in rows) for d in depths}
    distinct = C.distinct_by_depth(rows)
    return "\n".join([
        f"lnexp atlas: what deciding each of {count(len(rows), 'claim')} costs before any run: the seeds a "
        f"cell its test needs at its stated effect (stability: {C.SHARES[0]:g} of seeds train against "
        f"{C.SHARES[1]:g}; paired ones at the prior sd, "
        + ", ".join(f"{sd:g} {unit}" for unit, sd in C.PRIOR_SD.items())
        + f"), at Holm's first level ({C.ALPHA:g}/{len(rows)}), every cell of the claim at every seed",
        *lines,
        "total: " + ", ".join(f"{total[d]:,} cells at {d}+{d}" for d in depths)
        + " (cells two claims share counted in each); distinct: "
        + ", ".join(f"{distinct.get(d, 0):,} at {d}+{d}" for d in depths),
    ])


def _checked_setup(args) -> LaunchSetup:
    """The options checked (numbers, runs root, launcher) and the launch setup they give: the user's
    overrides for every cell, apart from a cluster's settings (hydra/launcher=..., hydra.launcher.*:
    they set its job arrays, not the cells' training)."""
    for flag, value, eg in (("--budget-min", args.budget_min, 100), ("--shared-lr", args.shared_lr, 1e-3)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag} {value:g}: give a positive number, e.g. {flag} {eg:g}")
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: give 1 or more")
    if not args.runs_root.strip():
        raise UserError("--runs-root is empty: give the folder that holds the runs, e.g. --runs-root runs")
    _check_runs_root(Path(args.runs_root))
    args.launcher = args.launcher or launchers.named_in(args.overrides) or DEFAULT_LAUNCHER
    known = launchers.names()
    if args.launcher not in known:
        raise UserError(f"--launcher {args.launcher}: not a launcher; use one of {', '.join(known)}")
    settings = [o for o in args.overrides if override.is_launcher(o)]
    if settings and not args.launcher.startswith("submitit_"):
        raise UserError(f"{settings[0]}: a cluster's setting; give it with --launcher submitit_slurm "
                        "(or hydra/launcher=submitit_slurm), or drop it")
    every_cell = tuple(o for o in args.overrides if o not in settings)
    return LaunchSetup(Path(args.runs_root), args.scale, overrides=every_cell, settings=tuple(settings))


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


def _check_cell_overrides(setup: LaunchSetup, scale: str, grid: Grid) -> None:
    """The user's overrides set no key the atlas sets for each cell, and compose with a cell's (every
    value checked once, as lnexp train checks its own)."""
    from lnexp.train.run import check_overrides

    for o in setup.overrides:
        if override.key(o) in Cell.KEYS:
            raise UserError(f"{o}: lnexp atlas sets {override.key(o)} for each cell "
                            f"(configs/experiment/{experiment_name(scale)}.yaml's grid): drop it")
    check_overrides(setup.command(coverage(grid, schemes())[0]))


def _max_update(overrides: list[str]) -> int:
    """The cells' max_update given among the overrides (0: the experiment's own)."""
    value = override.value(overrides, "max_update")
    try:
        return max(int(value), 0) if value is not None else 0
    except (TypeError, ValueError):
        return 0  # check_overrides names the mistake


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


def _last_word(run: AtlasRun) -> int:
    """The atlas's last line (on stderr) where it did not end by itself, and its exit status."""
    if run.interrupted:
        done, stopped = run.counts()
        print(f"lnexp atlas: interrupted: {done} {'cell' if done == 1 else 'cells'} finished in this "
              f"session, {stopped} stopped and kept (status interrupted); the same command resumes",
              file=sys.stderr)
        return Exit.INTERRUPTED
    failed = [int(f["status"]) for f in run.plan["failed"]]
    if failed:
        print(f"lnexp atlas: error: {len(failed)} runs ended with an error ({describe(failed)}): their "
              "messages are above; fix, then run the same command again to resume", file=sys.stderr)
    return Exit.worst(failed)


# --- one atlas at a time on a runs root ---------------------------------------------------------------


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
