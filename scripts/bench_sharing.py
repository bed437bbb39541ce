#!/usr/bin/env python
"""Fair sharing: N lnexp trainings side by side against the same N one after another.

    python scripts/bench_sharing.py                      # 1, 2 and 4 runs of 150 updates each
    python scripts/bench_sharing.py --runs 2 --updates 300
    python scripts/bench_sharing.py --quick --runs 1,2   # tiny runs, seconds (used by the tests)

Each run is ``lnexp train`` in its own process, as a user starts it, with the default thread
setting (``threads`` not given: lnexp takes its fair share of the cores) and seeds 1..N (same
config, so the same work per run). OMP_NUM_THREADS and OMP_WAIT_POLICY are removed from the runs'
environment unless ``--keep-env``, so that lnexp's defaults are what is measured. The corpus is
prepared before any timing. For each N: the wall time of the N runs started together (until the
last ends) against the sum of their wall times one after another; ratio = total target tokens/s
side by side / one after another (1.0: sharing loses nothing; the issue-23 target is >= 0.9; a
machine whose runs took every core measured about 0.25 for 2 runs on 2 cores). Wall times are of
whole processes (start-up and the end-of-run validation included), so give enough ``--updates``
that training dominates. The thread count each run's first log line gave is shown (and the last one,
if the run changed it as others started or ended).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

from lnexp.plural import count

# the mini model at its default size, warm-up schedule; validation BLEU on a few sentences only
BASE = ["placement=post_ln", "divergence.plateau_epoch=99", "log_interval=1000"]
THREADS_LINE = re.compile(r"threads: (\d+) \(([^)]*)\)", re.M)


def overrides(args: argparse.Namespace) -> list[str]:
    out = [*BASE, f"max_update={args.updates}", f"save_interval_updates={args.updates}",
           f"eval.subset={5 if args.quick else 20}"]
    if args.quick:
        out += B.QUICK_OVERRIDES
    return out + B.data_overrides(args) + args.override


def prepare(over: list[str]) -> None:
    """Prepare the corpus once, before anything is timed."""
    from lnexp.data.registry import load_for_training

    load_for_training(B.compose(over).dataset)


def child_env(keep: bool) -> dict[str, str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if not keep:
        for key in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS"):
            env.pop(key, None)
    return env


def launch(over: list[str], seed: int, root: Path, env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "lnexp.cli", "train", *over, f"seed={seed}", f"runs_root={root}"]
    return subprocess.Popen(cmd, cwd=B.REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"a run exited {proc.returncode}:\n{out[-3000:]}")
    return out


def target_tokens(root: Path) -> float:
    from lnexp.rundir import UPDATES

    total = 0.0
    for path in root.glob(f"*/{UPDATES}"):
        with open(path, newline="") as f:
            total += sum(float(r["ntokens"]) for r in csv.DictReader(f))
    return total


def threads_taken(outputs: list[str]) -> str:
    """Each run's thread count as its first log line gave it, then (if it changed while the run
    went on: another run started or ended) the last one, with the last reason."""
    seen = []
    for out in outputs:
        found = THREADS_LINE.findall(out)
        if not found:
            seen.append("?")
            continue
        counts = found[0][0] if found[0][0] == found[-1][0] else f"{found[0][0]}->{found[-1][0]}"
        seen.append(f"{counts} ({found[-1][1]})")
    return "; ".join(sorted(set(seen)))


def one_after_another(over: list[str], n: int, root: Path, env: dict[str, str]):
    walls, outs = [], []
    for seed in range(1, n + 1):
        t = time.perf_counter()
        outs.append(finish(launch(over, seed, root, env)))
        walls.append(time.perf_counter() - t)
    return walls, outs


def side_by_side(over: list[str], n: int, root: Path, env: dict[str, str]):
    t = time.perf_counter()
    procs = [launch(over, seed, root, env) for seed in range(1, n + 1)]
    outs = [finish(p) for p in procs]
    return time.perf_counter() - t, outs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="1,2,4", help="comma list of how many runs go side by side")
    p.add_argument("--updates", type=int, default=None, help="updates per run (150; --quick: 3)")
    p.add_argument("--quick", action="store_true", help="2+2 layers, small batches, 3 updates")
    B.add_data_args(p)
    p.add_argument("--keep-env", action="store_true",
                   help="keep OMP_NUM_THREADS / OMP_WAIT_POLICY of this shell for the runs")
    p.add_argument("override", nargs="*", help="more lnexp train overrides for every run")
    args = p.parse_args()
    args.updates = args.updates or (3 if args.quick else 150)
    counts = sorted({int(x) for x in args.runs.split(",") if x})
    over = overrides(args)
    env = child_env(args.keep_env)
    prepare(over)
    print(B.machine_line())
    print(f"# lnexp train {' '.join(over)} "
          f"seed=1..N, {count(args.updates, 'update')} each; runs' env: OMP_NUM_THREADS="
          f"{env.get('OMP_NUM_THREADS', 'unset')}, OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')}")
    with tempfile.TemporaryDirectory(prefix="lnexp-bench-sharing-") as d:
        seq_root = Path(d) / "one_after_another"
        seq_walls, seq_outs = one_after_another(over, max(counts), seq_root, env)
        rows = []
        for n in counts:
            seq_wall = sum(seq_walls[:n])
            if n == 1:
                par_wall, par_outs = seq_walls[0], seq_outs[:1]
            else:
                par_wall, par_outs = side_by_side(over, n, Path(d) / f"side_by_side_{n}", env)
            rows.append((n, seq_wall, par_wall, threads_taken(seq_outs[:n]), threads_taken(par_outs)))
        per_run = target_tokens(seq_root) / max(counts)
    table = []
    for n, seq_wall, par_wall, _, par_threads in rows:
        tok = per_run * n
        table.append([n, seq_wall, par_wall, tok / seq_wall, tok / par_wall,
                      f"{seq_wall / par_wall:.2f}", par_threads])
    print()
    print(B.table(["runs", "apart_s", "together_s", "tok/s apart", "tok/s together", "ratio",
                   "threads taken together"], table))
    print(f"# ratio = total target tokens/s side by side / one after another; alone each run took "
          f"{threads_taken(seq_outs[:1])}")


if __name__ == "__main__":
    main()
