"""Cells per hour of the atlas's launchers on this machine: the same N real atlas cells (coverage
cells of experiment=atlas_SCALE, shortened with max_update) trained by each launcher in turn, the
launchers' order alternated round by round so that a loaded machine's drift hits each alike; each
round trains into a fresh runs root, so nothing is skipped.

    python scripts/bench_atlas_cells.py --cells 3 --rounds 2 --max-update 5
    python scripts/bench_atlas_cells.py --launchers process,worker,submitit_local

``process`` is one ``python -m lnexp train`` per cell, as lnexp atlas launched its cells before
issue 43 (lnexp.atlas.launchers' "process" when that module has one, else a minimal copy here);
``worker`` is lnexp.atlas.worker (a new launcher each round: its start-up is counted);
``submitit_local`` is one submitit array per round on this machine (its submission overhead).
Prints each round's seconds per launcher, cells/hour, and the paired ratio of each to ``process``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lnexp.atlas.launchers import Ended, LaunchSetup, make  # noqa: E402


def launcher(name: str, setup: LaunchSetup):
    """The launcher the atlas itself would use (lnexp.atlas.launchers' registry)."""
    return make(name, setup)


def cells(scale: str, n: int) -> list:
    """The atlas's first ``n`` coverage cells."""
    from lnexp.atlas.grid import read_grid
    from lnexp.atlas.plan import coverage
    from lnexp.atlas.schemes import schemes

    return coverage(read_grid(scale), schemes())[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=3, help="cells per round (coverage cells, in order)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds; each runs every launcher once")
    ap.add_argument("--jobs", type=int, default=1, help="cells at once")
    ap.add_argument("--max-update", type=int, default=5, help="updates per cell (the atlas's: 120)")
    ap.add_argument("--scale", default="mini")
    ap.add_argument("--launchers", default="process,worker", help="comma-separated; the first is the base")
    ap.add_argument("--root", default=None, help="where the rounds' runs go (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("overrides", nargs="*", help="more lnexp train overrides for every cell")
    args = ap.parse_args(argv)
    root = Path(args.root or tempfile.mkdtemp(prefix="bench-atlas-cells-"))
    names = args.launchers.split(",")
    seconds: dict[str, list[float]] = {n: [] for n in names}
    overhead: dict[str, list[float]] = {n: [] for n in names}  # per round: mean launch-to-end - run
    failed: list[str] = []
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            runs_root = root / f"round{r}-{name}"
            batch = cells(args.scale, args.cells)
            setup = LaunchSetup(runs_root, args.scale,
                                overrides=(f"max_update={args.max_update}", "threads=1", *args.overrides))
            ends: list[Ended] = []
            lau = launcher(name, setup)
            t0 = time.monotonic()
            lau.run_round(batch, args.jobs, ends.append)
            if hasattr(lau, "close"):
                lau.close()
            seconds[name].append(time.monotonic() - t0)
            failed += [f"{name} round {r} cell {e.index}: status {e.status}" for e in ends if e.status]
            walls = [json.loads(p.read_text()).get("wall_s", 0.0) for p in runs_root.glob("*/status.json")]
            overhead[name].append((sum(e.seconds for e in ends) - sum(walls)) / max(len(ends), 1))
            print(f"bench_atlas_cells: round {r} {name}: {len(ends)} cells in {seconds[name][-1]:.1f} s",
                  file=sys.stderr, flush=True)
    base = names[0]
    out = {"cells": args.cells, "max_update": args.max_update, "jobs": args.jobs, "rounds": args.rounds,
           "load_1min": os.getloadavg()[0], "seconds": seconds, "overhead_s": overhead, "failed": failed}
    print(f"{'launcher':<16} {'s/round (median)':>16} {'cells/hour':>10} {'s/cell not training':>19} "
          f"{'paired ratio':>24}")
    for name in names:
        med = statistics.median(seconds[name])
        ratios = [b / s for b, s in zip(seconds[base], seconds[name], strict=True)]
        out[f"ratio_{name}"] = ratios
        print(f"{name:<16} {med:>16.1f} {3600 * args.cells / med:>10.0f} "
              f"{statistics.median(overhead[name]):>19.1f} "
              f"{statistics.median(ratios):>10.2f} ({', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"(cells/hour of {args.max_update}-update cells, {args.jobs} at a time; s/cell not training: "
          "its launch-to-end seconds minus its run's own wall_s, mean per round, median over rounds "
          f"(start-up, submission, exit); paired ratio: the {base} round's seconds / this launcher's, "
          f"per round; load {out['load_1min']:.1f})")
    if failed:
        print("failed: " + "; ".join(failed), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
