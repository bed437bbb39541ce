"""``lnexp plot``: any runs' curves in one figure, one panel per metric.

    lnexp plot [RUN ...] [KEY=VALUE ...] [--runs-root DIR] [--metric valid_loss,valid_bleu]
               [--x epoch|updates|wall] [--seeds band|each] --out FILE

RUN is a run folder or a folder of runs (a sweep); without one, every run under --runs-root.
Metrics are metrics.jsonl fields (per epoch) or, with ``--x updates``, updates.csv fields (per
update: loss, nll_loss, gnorm, lr).
KEY=VALUE filters as ``lnexp results`` does. The legend names each run by what differs between
the runs' configs. A diverged run ends in a cross; a run that did not finish (failed, running,
interrupted) is dashed. Runs that differ only by their seed are one line, the mean over the seeds,
with a band: the 95% t-interval of the mean at each point (``--seeds each`` draws every run).
Writes FILE.png, FILE.pdf and FILE.csv (the plotted points, with n and the band's ends).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lnexp.errors import ArgumentParser, UserError, output_file
from lnexp.results import Run, collect_runs, parse_filters
from lnexp.results import differing_keys as legend_keys
from lnexp.rundir import is_run_dir

X_KEYS = {"epoch": ("epoch", "epoch"), "updates": ("updates", "updates"),
          "wall": ("wall_s", "wall-clock (s)")}
UNFINISHED = ("failed", "running", "interrupted", "pending")
OUT_SUFFIXES = (".png", ".pdf", ".csv")  # --out FILE.png: FILE (a name's other dots are kept: lr=0.001)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".svg", ".svgz", ".eps", ".ps", ".tif", ".tiff", ".webp", ".gif",
                  ".bmp", ".pgf", ".raw", ".rgba", ".html")  # formats that --out would not write
PER_UPDATE = ("loss", "nll_loss", "gnorm", "lr")  # updates.csv columns, plotted with --x updates


LABEL_VALUE_MAX = 20  # characters of one value in a legend label, and of the whole label
LABEL_MAX = 60


def label(run: Run, keys: list[str]) -> str:
    parts = [f"{k.removesuffix('.name')}={_short(run.get(k))}" for k in keys]
    text = ", ".join(parts) or run.name
    if len(text) > LABEL_MAX:
        text = text[:LABEL_MAX - 1] + "…"
    return text + ("" if run.state == "done" else f" [{run.state}]")


def _short(v: Any) -> str:
    text = f"{v:g}" if isinstance(v, float) else str(v)
    return text if len(text) <= LABEL_VALUE_MAX else text[:LABEL_VALUE_MAX - 1] + "…"


def select(paths: list[Path], root: Path, filters: dict[str, str]) -> list[Run]:
    if not paths:
        return collect_runs(root, **filters)
    runs: list[Run] = []
    for p in paths:
        if not p.is_dir():
            raise UserError(f"no such folder: {p} (pass run folders or a sweep folder)")
        if is_run_dir(p):
            found = [r for r in collect_runs(p.parent, **filters) if r.dir == p]
        else:
            found = collect_runs(p, **filters)
        runs += found
    return runs


def _series(run: Run, metric: str, xkey: str) -> tuple[list[float], list[float]]:
    """(x, y) of one metric: per epoch from metrics.jsonl, else per update from updates.csv."""
    if any(metric in r for r in run.metrics):
        return run.series(xkey), run.series(metric)
    from lnexp.rundir import read_updates, run_paths

    rows = read_updates(run_paths(run.dir)["updates"])
    return ([float(r["update"]) for r in rows],
            [float(r[metric]) if r.get(metric) not in (None, "") else math.nan for r in rows])


def seed_groups(runs: list[Run], keys: list[str]) -> list[list[Run]]:
    """Runs whose legend keys other than ``seed`` agree, in first-seen order."""
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(repr(run.get(k)) for k in keys if k != "seed"), []).append(run)
    return list(groups.values())


def band(members: list[Run], metric: str, xkey: str) -> list[tuple[float, Any]]:
    """(x, seed summary) per point: per-epoch metrics meet at each epoch (x: the members' mean
    there, so ``--x wall`` works too), per-update ones at each update."""
    from lnexp.stats import summarise

    at: dict[float, list[tuple[float, float]]] = {}
    for run in members:
        xs, ys = _series(run, metric, xkey)
        where = run.series("epoch") if any(metric in r for r in run.metrics) else xs
        for w, a, b in zip(where, xs, ys, strict=True):
            at.setdefault(w, []).append((a, b))
    return [(sum(a for a, _ in v) / len(v), summarise([b for _, b in v])) for _, v in sorted(at.items())]


def draw(runs: list[Run], metrics: list[str], x: str, out: Path, seeds: str = "band") -> list[Path]:
    from lnexp.figures import style
    from lnexp.figures.measured import write_csv

    plt = style.setup()
    xkey, xlabel = X_KEYS[x]
    keys = legend_keys(runs)
    groups = seed_groups(runs, keys) if seeds == "band" else [[r] for r in runs]
    if any(len(g) > 1 for g in groups):  # the seed is what a band averages over: not a label
        keys = [k for k in keys if k != "seed"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.3), squeeze=False)
    points = []
    for i, members in enumerate(groups):
        run = members[0]
        name = label(run, keys)
        if len(members) > 1:
            name += f" (mean of {len(members)} seeds, 95% CI)"
        color = style.COLORS.get(str(run.get("placement.name"))) if len(
            {r.get("placement.name") for r in runs}) == len(groups) else None
        color = color or f"C{i % 10}"
        for ax, metric in zip(axes[0], metrics, strict=True):
            per_update = metric in PER_UPDATE and not any(metric in r for r in run.metrics)
            dashed = any(m.state in UNFINISHED for m in members)
            style_kw = dict(color=color, marker=None if per_update else "o", ms=3, label=name,
                            lw=0.8 if per_update else 1.5, ls="--" if dashed else "-")
            if len(members) == 1:
                xs, ys = _series(run, metric, xkey)
                ax.plot(xs, ys, **style_kw)
                points += [{"run": run.name, "label": name, "status": run.state, "metric": metric,
                            "x": a, "y": b, "n": 1} for a, b in zip(xs, ys, strict=True)]
            else:
                pts = band(members, metric, xkey)
                xs, ys = [a for a, _ in pts], [s.mean for _, s in pts]
                ax.plot(xs, ys, **style_kw)
                ax.fill_between(xs, [s.low for _, s in pts], [s.high for _, s in pts], color=color,
                                alpha=0.2, lw=0)
                points += [{"run": ",".join(m.name for m in members), "label": name,
                            "status": ",".join(sorted({m.state for m in members})), "metric": metric,
                            "x": a, "y": s.mean, "n": s.n, "low": s.low, "high": s.high}
                           for a, s in pts]
            for m in members:
                mx, my = _series(m, metric, xkey)
                finite = [(a, b) for a, b in zip(mx, my, strict=True) if math.isfinite(b)]
                if m.diverged and finite:
                    ax.plot(*finite[-1], marker="x", ms=9, mew=2, color=color)
    from matplotlib.ticker import MaxNLocator

    for ax, metric in zip(axes[0], metrics, strict=True):
        unit = " (bits/token)" if metric.endswith("loss") else ""
        ax.set(xlabel=xlabel, ylabel=metric + unit, title=metric)
        if x != "wall":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # also a 1-epoch run
    handles, labels = axes[0][0].get_legend_handles_labels()
    # as many columns as fit over the panels (~15 characters per inch at the legend's 8 pt), so
    # that the legend never widens the picture and squeezes the panels
    fits = int(fig.get_figwidth() * 15) // (max(len(s) for s in labels) + 6)
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0),
               ncol=max(1, min(len(groups), 3, fits)))
    fig.tight_layout()
    note = "x: diverged; dashed: did not finish" if any(
        r.diverged or r.state in UNFINISHED for r in runs) else None
    paths = style.save(fig, out.parent, out.name, note)
    table = out.with_name(out.name + ".csv")
    write_csv(table, ("run", "label", "status", "metric", "x", "y", "n", "low", "high"), points)
    return [*paths, table]


def main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="lnexp plot", description=__doc__.split("\n\n")[0])
    ap.add_argument("items", nargs="*", help="run folders, sweep folders and KEY=VALUE filters")
    ap.add_argument("--runs-root", default="runs", type=Path,
                    help="where to look when no run folder is given (default: runs)")
    ap.add_argument("--metric", default="valid_loss,valid_bleu",
                    help="comma-separated metrics.jsonl fields, one panel each")
    ap.add_argument("--x", default="epoch", choices=tuple(X_KEYS))
    ap.add_argument("--seeds", default="band", choices=("band", "each"),
                    help="runs that differ only by seed: one mean line with its 95%% band (default), "
                         "or each run")
    ap.add_argument("--out", required=True, help="FILE: writes FILE.png, FILE.pdf, FILE.csv")
    args = ap.parse_args(argv)
    out = output_file(args.out, "--out", "curves")  # checked before any run is read
    if out.suffix.lower() in IMAGE_SUFFIXES:
        raise UserError(f"--out {args.out}: lnexp plot writes FILE.png, FILE.pdf and FILE.csv, not "
                        f"{out.suffix}: pass --out {out.with_suffix('')} (convert the PNG for other "
                        "formats)")
    if out.suffix in OUT_SUFFIXES:
        out = out.with_suffix("")
    # run folders are named by their overrides (``lr=1e-3,warmup=0``): a folder is never a filter
    is_path = {a: Path(a).is_dir() or "=" not in a for a in args.items}
    filters = parse_filters([a for a in args.items if not is_path[a]])
    paths = [Path(a) for a in args.items if is_path[a]]
    metrics = [m.strip() for m in args.metric.split(",") if m.strip()]
    if not metrics:
        raise UserError("--metric is empty: e.g. --metric valid_loss,valid_bleu")
    if not paths and not args.runs_root.is_dir():
        raise UserError(f"no runs root {args.runs_root}: pass run folders or --runs-root")
    runs = sorted(select(paths, args.runs_root, filters), key=lambda r: r.name)
    runs = [r for r in runs if r.metrics]
    if not runs:
        raise UserError("no run with a finished epoch matches: check the folders and filters "
                        "(lnexp results lists the runs)")
    known = {k for r in runs for row in r.metrics for k in row}
    if args.x == "updates":
        known |= set(PER_UPDATE)
    for m in [*metrics, X_KEYS[args.x][0]]:
        if m not in known:
            raise UserError(f"no run logged {m!r}: use fields of metrics.jsonl, e.g. "
                            f"{', '.join(sorted(k for k in known if k.startswith('valid_')))}")
    for p in draw(runs, metrics, args.x, out, args.seeds):
        print(p)
    return 0
