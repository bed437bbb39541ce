#!/usr/bin/env python
"""Start-up time of the CLI: ``lnexp --help`` and ``lnexp train --cfg job`` (median of runs).

    python scripts/bench_startup.py            # 5 runs each
    python scripts/bench_startup.py --quick    # 1 run each (used by the tests)

It also checks that ``lnexp --help`` imports neither torch nor fairseq (they take seconds).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

from lnexp.plural import count

TARGET_HELP_S = 1.5
HEAVY = ("torch", "fairseq", "hydra", "numpy")
PROBE = ("import sys; from lnexp.cli import main; main(['--help']); "
         f"print('HEAVY', ' '.join(m for m in {HEAVY!r} if m in sys.modules))")


def lnexp_argv() -> list[str]:
    exe = Path(sys.executable).with_name("lnexp")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "lnexp.cli"]


def wall(argv: list[str], runs: int) -> list[float]:
    times = []
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for _ in range(runs):
        t = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=B.REPO, env=env)
        times.append(time.perf_counter() - t)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="one run each (for tests)")
    args = p.parse_args()
    runs = 1 if args.quick else args.runs
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} | load avg (1/5/15 min) {load} | {os.cpu_count()} CPUs"
          f" | {count(runs, 'run')} each, after one untimed run (warm file cache)")
    lnexp = lnexp_argv()
    rows = []
    for label, argv, target in [("lnexp --help", [*lnexp, "--help"], TARGET_HELP_S),
                                ("lnexp train --cfg job", [*lnexp, "train", "--cfg", "job"], None),
                                ("python -c pass (interpreter)", [sys.executable, "-c", "pass"],
                                 None)]:
        wall(argv, 1)
        ts = wall(argv, runs)
        med = B.median(ts)
        met = "-" if target is None else ("yes" if med <= target else "NO")
        rows.append([label, med, min(ts), max(ts), "-" if target is None else f"<= {target}", met])
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=B.REPO)
    heavy = proc.stdout.rsplit("HEAVY", 1)[-1].strip() if "HEAVY" in proc.stdout else "?"
    print(B.table(["command", "median s", "min s", "max s", "target", "met"], rows))
    print(f"# modules imported by `lnexp --help` among {', '.join(HEAVY)}: {heavy or 'none'}")


if __name__ == "__main__":
    main()
