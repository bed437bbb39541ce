"""``lnexp figure atlas``: where each normalisation scheme trains, stalls or diverges, and the zoo
papers' claims answered by their tests.

Reads the runs of ``experiment=atlas_SCALE`` (and ``atlas_dt_SCALE``'s dt column,
``atlas_lrs_SCALE``'s half-decade grid) through lnexp.atlas.outcomes, computes every claim's verdict
with lnexp.atlas.claims (the records the driver chose the cells from) and writes
figures/atlas_maps, atlas_lr, atlas_loss, atlas_growth (PNG + PDF, drawn by atlas_zoo.py), where an
arm has a seed over the whole half-decade grid atlas_lr_sensitivity (drawn by lr_sensitivity.py,
with atlas_lr_sensitivity.csv and atlas_lr_curves.csv), atlas.csv (one row per run),
atlas_summary.csv (one row per cell, with the Wilson interval of its trained share), atlas_lr.csv,
atlas_loss.csv, atlas_growth.csv, atlas_table.md and atlas_checks.json (per claim: its test, arms
with n, statistic, raw and Holm-adjusted p, verdict; the date and machine measured).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

from lnexp.atlas import claims as C
from lnexp.atlas.grid import Grid, experiments, read_grid
from lnexp.atlas.outcomes import (
    OUTCOMES,
    SeedsAt,
    arm_of,
    final,
    largest_stable,
    norms_of,
    outcome,
    seeds_at,
)
from lnexp.figures import atlas_zoo as Z
from lnexp.figures import lr_sensitivity as F
from lnexp.figures import runs as R
from lnexp.figures.checks import Check, write_checks
from lnexp.figures.figure import Figure
from lnexp.figures.measured import write_csv
from lnexp.plural import count
from lnexp.results import Run
from lnexp.rundir import write_text
from lnexp.runtime.host import cpu_model
from lnexp.stats import summarise, wilson

RUN_FIELDS = ("experiment", "run", "scheme", "depth", "lr", "warmup", "dt", "seed", "status", "outcome",
              "diverged_update", "diverged_reason", "updates", "final_valid_loss", "final_valid_nll_loss",
              "final_valid_bleu")
CELL_FIELDS = ("scheme", "depth", "warmup", "dt", "lr", "seeds", *OUTCOMES, "stable", "trained_low",
               "trained_high", "mean_valid_loss")
TABLES = ("atlas.csv", "atlas_summary.csv", "atlas_lr.csv", "atlas_loss.csv", "atlas_growth.csv",
          "atlas_table.md", "atlas_checks.json")
SENSITIVITY_TABLES = ("atlas_lr_sensitivity.csv", "atlas_lr_curves.csv")  # where an arm has a whole grid

FIGURE = Figure(
    "atlas", "stability atlas: scheme x lr x warm-up x depth (x dt), and the zoo papers' claims tested",
    "Stability atlas: every scheme x peak lr x warm-up x depth, the zoo papers' claims tested", order=5,
    experiments=experiments,
    images=("atlas_maps", "atlas_lr", "atlas_loss", "atlas_growth", "atlas_lr_sensitivity"),
    summary_columns=CELL_FIELDS, tables=("atlas_table.md",))


def run_row(run: Run) -> dict[str, Any]:
    row, div = run.row(), run.diverged or {}
    return {"experiment": run.experiment, "run": run.name, "scheme": Z.scheme_label(run),
            "depth": run.get("depth.encoder_layers") or 6, "lr": row["lr"], "warmup": row["warmup"],
            "dt": run.get("residual_scale", 1.0), "seed": row["seed"], "status": row["status"],
            "outcome": outcome(run), "diverged_update": div.get("update"),
            "diverged_reason": div.get("reason"),
            "updates": row["updates"], "final_valid_loss": R.rounded(final(run, "valid_loss")),
            "final_valid_nll_loss": R.rounded(final(run, "valid_nll_loss")),
            "final_valid_bleu": R.rounded(final(run, "valid_bleu"))}


def cell_row(c) -> dict[str, Any]:
    low, high = wilson(c.trained, c.finished)
    loss = c.losses()
    return {**c.row(), "trained_low": R.rounded(low, 3), "trained_high": R.rounded(high, 3),
            "mean_valid_loss": R.rounded(sum(loss) / len(loss) if loss else math.nan)}


def to_check(v: C.Verdict, grid: Grid) -> Check:
    """A claim's verdict in the figures' one schema; ``measured`` carries the claims table's columns."""
    p = f"p = {v.p:.3g} (Holm {v.p_holm:.3g})"
    if v.verdict == "not supported":
        p = f"refuted: p = {v.p_refute:.3g} (Holm {v.p_refute_holm:.3g})"
    measured = {"test": C.TESTS[v.claim.test], "arms": [f"{a.text(grid)}: n={v.n[a]}" for a in v.claim.ats()],
                "statistic": [x.text for x in v.parts], "p": v.p, "p_holm": v.p_holm, "p_refute": v.p_refute,
                "p_refute_holm": v.p_refute_holm, "verdict": v.text, "runs_needed": v.runs_needed,
                "comparisons": [x.numbers for x in v.parts], "effect": v.claim.effect}
    ours = "; ".join(x.text for x in v.parts) + f"; {p}"
    return Check(v.claim.id, v.claim.claim, v.claim.paper, measured, ours, v.holds, required=False)


def atlas_grid(scale: str, plan: dict, got: SeedsAt) -> Grid:
    """The grid lnexp atlas chose from (its plan's lrs and shared lr, else the experiment's), so that
    a bound is known only against it, not against the lrs that happened to run; the half-decade
    grid's lrs (the LR sensitivity's) stay out of it."""
    try:
        g = read_grid(scale)
    except Exception:  # a scale without the grid: what the runs show
        lrs = sorted({lr for _, lr in got})
        g = Grid(tuple(lrs), (0,), (6,), (1,), lrs[min(1, len(lrs) - 1)])
    sens = tuple(plan["sensitivity_lrs"] if "sensitivity_lrs" in plan else g.sensitivity_lrs)
    log2 = set(plan.get("lrs") or g.lrs)
    lrs = tuple(sorted(log2 | {lr for _, lr in got if lr not in sens}))
    shared = plan.get("shared_lr") or g.shared_lr
    depths = tuple(sorted(set(g.depths) | {a.depth for a, _ in got}))
    warmups = tuple(sorted(set(g.warmups) | {a.warmup for a, _ in got}))
    return Grid(lrs, warmups, depths, g.seeds, min(lrs, key=lambda x: abs(math.log(x / shared))), sens)


def main(argv: list[str]) -> int:
    from lnexp.atlas.rounds import read_plan
    from lnexp.errors import UserError

    args, exps, found = R.start(FIGURE, FIGURE.help, argv)
    runs = [r for e in exps for r in found[e]]
    if not runs:
        raise UserError(f"no runs of experiment={exps[0]} under {args.runs_root}: run `make atlas"
                        f"{'' if args.scale == 'mini' else ' SCALE=' + args.scale}` first")
    got, plan = seeds_at(runs), read_plan(args.runs_root)
    grid = atlas_grid(args.scale, plan, got)
    verdicts = C.evaluate(grid, got, max_seeds=int(plan.get("max_seeds") or C.MAX_SEEDS))  # the driver's cap
    cks = [to_check(v, grid) for v in verdicts]
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "atlas.csv", RUN_FIELDS, [run_row(r) for r in runs])
    write_csv(args.out / "atlas_summary.csv", CELL_FIELDS, [cell_row(c) for c in got.values()])
    sens_paths, sens_rows = draw_sensitivity(runs, grid, args)
    paths, plan_note = draw(got, grid, args, plan, sens_rows)
    paths += sens_paths
    counts = {o: sum(outcome(r) == o for r in runs) for o in OUTCOMES}
    decided = sum(v.verdict != "undecided" for v in verdicts)
    write_checks(args.out, "atlas", args.scale, cks, {
        "units": R.UNITS, "experiments": exps, "runs": len(runs), "outcomes": counts,
        "claims_supported": f"{sum(v.verdict == 'supported' for v in verdicts)} of {len(verdicts)}",
        "claims_decided": f"{decided} of {len(verdicts)}", "alpha": C.ALPHA,
        "correction": "Holm across the claims (statsmodels multipletests), support and refutation each",
        "measured": time.strftime("%Y-%m-%d"), "machine": cpu_model(),
        "max_update": sorted({r.get("max_update") for r in runs}, key=str),
        "stable_means": "every finished seed of the cell trained: no NaN/inf, not on the unigram plateau",
        "plan": plan_note})
    tables = TABLES + (SENSITIVITY_TABLES if sens_paths else ())
    R.print_outputs(cks, paths, args.out, tables, marks=("supported", "NOT supported", "undecided"))
    return 0


def draw_sensitivity(runs: list[Run], grid: Grid, args) -> tuple[list, list[dict[str, Any]]]:
    """The LR-sensitivity figure and its CSVs, from the arms with a seed over the whole half-decade
    grid (that seed's runs; a seed lacking an lr is left out, said in the note); none where no arm
    has one. Returns the figure's paths and its sensitivity rows (the per-scheme table's column)."""
    lrs = list(grid.sensitivity_lrs)
    if not lrs:
        return [], []
    from lnexp.figures import style
    from lnexp.lr_sensitivity import measure

    _, rows = measure(runs, arm_of=arm_of, grid=lrs)
    whole = [r for r in rows if r.result.complete and r.arm.dt == 1.0]
    if not whole:
        return [], []
    curves, sens = F.curve_rows(whole, lrs), F.sensitivity_rows(whole)
    write_csv(args.out / "atlas_lr_curves.csv", F.CURVE_FIELDS, curves)
    write_csv(args.out / "atlas_lr_sensitivity.csv", F.SENSITIVITY_FIELDS, sens)
    partial = sum(bool(r.final) and not r.result.complete for r in rows)
    note = (f"scale={args.scale}; lrs {', '.join(f'{x:g}' for x in lrs)}; {count(len(whole), 'arm-seed')} "
            f"over the whole grid" + (f", {partial} with lrs missing left out" if partial else "")
            + "; line = mean over seeds, capped at the loss at init (Wortsman et al. 2023)")
    caveat = F.caveat([s["scheme"] for s in sens])
    paths = style.save(F.draw(curves, sens), args.out, "atlas_lr_sensitivity",
                       note + (f"\n{caveat}" if caveat else ""))
    return paths, sens


def draw(got: SeedsAt, grid: Grid, args, plan: dict,
         sens_rows: list[dict[str, Any]] | None = None) -> tuple[list, str]:
    """The four figures, their CSVs and the per-scheme table (with ``sens_rows``' LR sensitivities);
    the note says what the budget left out."""
    from lnexp.figures import style

    lrs, shared = list(grid.lrs), grid.shared_lr
    schemes = sorted({a.scheme.label for a, _ in got})
    depths, warmups = sorted({a.depth for a, _ in got}), sorted({a.warmup for a, _ in got})
    lr_rows = []
    for a in sorted({a for a, _ in got if a.dt == 1.0}):
        b = largest_stable(got, lrs, a)
        lr_rows.append({"scheme": a.scheme.label, "depth": a.depth, "warmup": a.warmup,
                        "largest_stable_lr": b["lr"], "top": b["top"], "known": b["known"],
                        "first_failing_lr": b["first_fail"]})
    ordered = Z.order(schemes, lr_rows, min(depths))
    loss_rows, growth_rows = [], []
    for (a, lr), c in got.items():
        if lr == shared and a.dt == 1.0:
            m = summarise(c.losses())
            loss_rows.append({"scheme": a.scheme.label, "depth": a.depth, "warmup": a.warmup, "lr": lr,
                              "n": m.n, "mean_valid_loss": R.rounded(m.mean), "ci_low": R.rounded(m.low),
                              "ci_high": R.rounded(m.high), "std": R.rounded(m.std)})
        for r in c.runs:
            for side, v in norms_of(r).items():
                growth_rows.append({"scheme": a.scheme.label, "depth": a.depth, "warmup": a.warmup,
                                    "dt": a.dt, "lr": lr, "seed": r.get("seed"), "side": side,
                                    "first_layer_rms": R.rounded(v["first"]),
                                    "last_layer_rms": R.rounded(v["last"]),
                                    "deep_ffn_grad_norm": R.rounded(v["grad"])})
    not_run = plan.get("not_run", [])
    note = (f"lnexp atlas stopped: {plan.get('stopped')}; {count(len(not_run), 'cell')} of its last "
            "round not run" if plan else "no atlas_plan.json (cells not chosen by lnexp atlas)")
    note += "".join(f"; {Z.label(c)} = {Z.label(o)}'s network, not run twice"
                    for c, o in plan.get("same_network", {}).items())
    write_csv(args.out / "atlas_lr.csv", Z.LR_FIELDS, lr_rows)
    write_csv(args.out / "atlas_loss.csv", Z.LOSS_FIELDS, loss_rows)
    write_csv(args.out / "atlas_growth.csv", Z.GROWTH_FIELDS, growth_rows)
    table = Z.scheme_table(lr_rows, loss_rows, ordered, depths, warmups, shared, sens_rows or [])
    write_text(args.out / "atlas_table.md", table)
    base = f"scale={args.scale}; {len(ordered)} schemes, sorted by largest stable lr at depth {min(depths)}"
    paths = style.save(Z.draw_maps(got, ordered, lrs, depths), args.out, "atlas_maps",
                       f"{base}; grey = not run; number = seeds when > 1; {note}")
    paths += style.save(Z.draw_lr(lr_rows, ordered, lrs, depths, warmups), args.out, "atlas_lr",
                        f"{base}; stable = every seed trained; open = boundary not bracketed (cells not run)")
    agg: dict[tuple, list[float]] = defaultdict(list)
    for g in growth_rows:
        if g["lr"] == shared and g["side"] == "decoder" and g["dt"] == 1.0:
            agg[(g["scheme"], g["depth"], g["warmup"])].append(g["last_layer_rms"])
    bars = [{"scheme": s, "depth": d, "warmup": w, "mean": (m := summarise(v)).mean,
             "low": m.low if m.n > 1 else None, "high": m.high if m.n > 1 else None}
            for (s, d, w), v in agg.items()]
    paths += style.save(Z.draw_bars(loss_rows, ordered, depths, warmups, "mean_valid_loss", "ci_low",
                                    "ci_high", "final valid loss (bits/token)", f"loss at lr {shared:g}"),
                        args.out, "atlas_loss", f"{base}; mean over seeds, line = 95% t-interval (n >= 2)")
    paths += style.save(Z.draw_bars(bars, ordered, depths, warmups, "mean", "low", "high",
                                    "decoder last-layer RMS at the end", f"hidden state, lr {shared:g}",
                                    log=True),
                        args.out, "atlas_growth", f"{base}; RMS = sqrt(E|h|^2/d) at the last tracked update "
                        "(norms.csv); line = 95% t-interval (n >= 2)")
    return paths, note
