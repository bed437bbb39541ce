"""What the run-based figures (fig2, fig4, atlas) share: options, run selection, CSVs, printed checks.

Runs are read through :func:`lnexp.results.collect_runs`, never by guessing paths. Losses are in
bits/token, as the runs log them; nat values are converted explicitly (1 nat = 1/ln 2 bits).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from lnexp.errors import ArgumentParser, UserError
from lnexp.figures.checks import MARKS, Check, print_checks
from lnexp.names import SCALES
from lnexp.results import Run, collect_runs
from lnexp.rundir import atomic_file

BITS_PER_NAT = 1.0 / math.log(2.0)  # 1.4427 bits
UNITS = f"losses in bits/token unless a key says _nats; 1 nat = {BITS_PER_NAT:.4f} bits"
CURVE_FIELDS = ("experiment", "run", "placement", "optimizer", "lr", "warmup", "schedule", "seed",
                "status", "epoch", "updates", "lr_now", "train_loss", "valid_loss", "valid_nll_loss",
                "valid_bleu")
SUMMARY_FIELDS = ("experiment", "run", "placement", "optimizer", "lr", "warmup", "schedule", "seed",
                  "status", "diverged_update", "epochs", "final_epoch", "final_valid_loss",
                  "final_valid_loss_nats", "final_valid_bleu", "best_valid_loss", "best_bleu")


def parser(name: str, description: str) -> ArgumentParser:
    ap = ArgumentParser(prog=f"lnexp figure {name}", description=description)
    ap.add_argument("--scale", default="mini", choices=SCALES,
                    help=f"which experiment's runs to draw (experiment={name}_SCALE)")
    ap.add_argument("--runs-root", default="runs", type=Path, help="where the runs are (default: runs)")
    ap.add_argument("--out", default="figures", type=Path, help="output folder (default: figures)")
    return ap


def start(figure: Any, description: str, argv: list[str]) -> tuple[Any, list[str], dict[str, list[Run]]]:
    """A run-based figure's options, its experiments at ``--scale`` and their runs (:func:`select`)."""
    args = parser(figure.name, description).parse_args(argv)
    experiments = figure.experiments(args.scale)
    return args, experiments, select(args.runs_root, experiments)


def need_epochs(runs: list[Run], experiment: str, root: Path, target: str) -> None:
    """A figure drawn from epochs needs at least one: else the one line that says how to train them."""
    if not any(r.metrics for r in runs):
        raise UserError(f"no finished epochs of experiment={experiment} under {root}: run "
                        f"`lnexp train -m experiment={experiment}` ({target}) first")


def select(root: Path, experiments: list[str]) -> dict[str, list[Run]]:
    """Runs of each experiment that have at least one epoch (or a status), sorted by name."""
    out = {}
    for exp in experiments:
        out[exp] = sorted(collect_runs(root, experiment=exp), key=lambda r: r.name)
    return out


def final(run: Run, key: str) -> float:
    vals = run.series(key)
    return vals[-1] if vals else math.nan


def summary_row(run: Run) -> dict[str, Any]:
    row = run.row()
    fv = final(run, "valid_loss")
    return {
        "experiment": run.experiment, "run": run.name, "placement": row["placement"],
        "optimizer": row["optimizer"], "lr": row["lr"], "warmup": row["warmup"],
        "schedule": row["schedule"], "seed": row["seed"], "status": row["status"],
        "diverged_update": row["diverged_update"], "epochs": row["epochs"],
        "final_epoch": run.metrics[-1]["epoch"] if run.metrics else None,
        "final_valid_loss": rounded(fv), "final_valid_loss_nats": rounded(fv / BITS_PER_NAT),
        "final_valid_bleu": rounded(final(run, "valid_bleu")),
        "best_valid_loss": rounded(row["best_valid_loss"]), "best_bleu": rounded(row["best_bleu"]),
    }


def rounded(x: Any, nd: int = 4) -> Any:
    """A metric as the CSVs and checks print it: 4 decimals, None and inf/nan kept as they are."""
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else x


def write_csvs(out: Path, name: str, runs: list[Run]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    curves, summary = out / f"{name}.csv", out / f"{name}_summary.csv"
    with atomic_file(curves) as f:
        w = csv.DictWriter(f, fieldnames=CURVE_FIELDS, lineterminator="\n")
        w.writeheader()
        for run in runs:
            base = summary_row(run)
            for r in run.metrics:
                w.writerow({**{k: base[k] for k in CURVE_FIELDS if k in base}, "epoch": r["epoch"],
                            "updates": r["updates"], "lr_now": r.get("lr"),
                            "train_loss": r.get("train_loss"), "valid_loss": r.get("valid_loss"),
                            "valid_nll_loss": r.get("valid_nll_loss"), "valid_bleu": r.get("valid_bleu")})
    with atomic_file(summary) as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(summary_row(r) for r in runs)
    return curves, summary


def epochs_to_reach(epochs: list[float], losses: list[float], target: float) -> float | None:
    """First epoch at which the loss curve reaches ``target`` (linear between evaluated epochs)."""
    prev = None
    for e, v in zip(epochs, losses, strict=True):
        if math.isfinite(v) and v <= target:
            if prev is None or not math.isfinite(prev[1]) or prev[1] == v:
                return float(e)
            e0, v0 = prev
            return float(e0 + (v0 - target) / (v0 - v) * (e - e0))
        prev = (e, v)
    return None


def fmt(x: Any, nd: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def print_outputs(checks: list[Check], paths: list, out: Path, files: tuple[str, ...],
                  marks: tuple[str, str, str] = MARKS) -> None:
    """Each check's verdict on one line, then the files written (figures, then ``out``'s tables)."""
    print_checks(checks, marks)
    print("wrote " + ", ".join(str(p) for p in paths) + f", {out}/" + ", ".join(files))
