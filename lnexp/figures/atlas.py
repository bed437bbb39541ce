"""``lnexp figure atlas``: where each LayerNorm placement trains, stalls or diverges.

Reads the runs of ``experiment=atlas_SCALE`` (placement x peak lr x warm-up x seed) and
``experiment=atlas_dt_SCALE`` (the residual step dt < 1 for Pre-/Peri-LN at the highest lrs) and
writes figures/atlas.{png,pdf} (one heatmap per placement), atlas_stability.{png,pdf} (largest
stable lr per placement; per-layer hidden-state RMS at the end of training, Pre-LN vs Peri-LN),
atlas.csv (one row per run), atlas_summary.csv (one row per cell), atlas_norms.csv and
atlas_checks.json (the claims of Kim et al. 2025 and Kan et al. 2025, and whether our runs support
them).

A run ends in one of three states (``lnexp.run_status.atlas_outcome`` of its status): ``trained``
(status done or stopped: it ran its length); ``plateau`` (status plateau: its validation NLL is
still within the margin of the unigram entropy, see lnexp/train/divergence.py); ``diverged``
(NaN/inf loss or gradient, or a non-finite valid loss). Runs not finished yet (running, failed,
interrupted, pending) are ``missing`` and leave their cell unknown.
A cell is stable when every seed trained; it fails when any seed plateaued or diverged.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from lnexp.figures import atlas_zoo
from lnexp.figures import runs as R
from lnexp.figures.checks import Check, write_checks
from lnexp.figures.figure import Figure
from lnexp.figures.measured import write_csv
from lnexp.names import PLACEMENTS
from lnexp.results import Run
from lnexp.run_status import atlas_outcome
from lnexp.rundir import run_paths, write_text

OUTCOMES = ("trained", "plateau", "diverged", "missing")
DT_PLACEMENTS = ("pre_ln", "peri_ln")  # the placements with a dt column
# the first atlas's placements (its heatmaps and Peri-LN / dt claims)
LEGACY_PLACEMENTS = ("post_ln", "pre_ln", "peri_ln", "deepnorm")
ZOO_FIGURES = ("atlas_maps", "atlas_lr", "atlas_loss", "atlas_growth")
RUN_FIELDS = ("experiment", "run", "placement", "lr", "warmup", "residual_scale", "seed", "status",
              "outcome", "diverged_update", "diverged_reason", "updates", "final_valid_loss",
              "final_valid_nll_loss", "final_valid_bleu")
CELL_FIELDS = ("placement", "lr", "warmup", "residual_scale", "seeds", "trained", "plateau",
               "diverged", "missing", "mean_valid_loss", "spread_valid_loss", "stable")
NORM_FIELDS = ("run", "placement", "lr", "warmup", "residual_scale", "seed", "update", "side", "layer",
               "hidden_rms")


FIGURE = Figure(
    "atlas", "stability atlas: placement x peak lr x warm-up (x dt), trained/stalled/diverged",
    "Stability atlas: placement x peak lr x warm-up x dt (Kim et al. 2025, Kan et al. 2025)", order=5,
    experiments=lambda scale: [f"atlas_{scale}", f"atlas_dt_{scale}"],
    images=("atlas_stability", "atlas_maps", "atlas_lr", "atlas_loss", "atlas_growth"),
    summary_columns=("placement", "lr", "warmup", "residual_scale", "seeds", "trained", "plateau", "diverged",
                     "missing", "mean_valid_loss", "spread_valid_loss", "stable"))


def outcome(run: Run) -> str:
    """trained | plateau | diverged | missing: lnexp.run_status.atlas_outcome of the run's status."""
    return atlas_outcome(run.state, R.final(run, "valid_loss") if run.metrics else None)


def _key(run: Run) -> tuple[str, float, int, float]:
    return (str(run.get("placement.name")), float(run.get("lr")), int(run.get("warmup")),
            float(run.get("residual_scale", 1.0)))


@dataclass
class Cell:
    """The runs of one (placement, lr, warm-up, dt), over seeds."""

    placement: str
    lr: float
    warmup: int
    dt: float
    runs: list[Run] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        for r in self.runs:
            out[outcome(r)] += 1
        return out

    @property
    def losses(self) -> list[float]:
        """Final valid losses of the seeds that ended with a finite one (trained or plateau)."""
        vals = [R.final(r, "valid_loss") for r in self.runs if outcome(r) in ("trained", "plateau")]
        return [v for v in vals if math.isfinite(v)]

    @property
    def mean(self) -> float:
        v = self.losses
        return sum(v) / len(v) if v else math.nan

    @property
    def spread(self) -> float:
        """max - min of the final valid loss over seeds (nan with fewer than 2 finite seeds)."""
        v = self.losses
        return max(v) - min(v) if len(v) >= 2 else math.nan

    @property
    def stable(self) -> bool | None:
        """True: every seed trained; False: a seed plateaued or diverged; None: not known yet."""
        c = self.counts
        if c["plateau"] or c["diverged"]:
            return False
        if c["missing"] or not self.runs:
            return None
        return True

    def row(self) -> dict[str, Any]:
        return {"placement": self.placement, "lr": self.lr, "warmup": self.warmup,
                "residual_scale": self.dt, "seeds": len(self.runs), **self.counts,
                "mean_valid_loss": R.rounded(self.mean), "spread_valid_loss": R.rounded(self.spread),
                "stable": self.stable}


def cells(runs: list[Run]) -> dict[tuple[str, float, int, float], Cell]:
    out: dict[tuple[str, float, int, float], Cell] = {}
    for r in runs:
        k = _key(r)
        out.setdefault(k, Cell(*k)).runs.append(r)
    return dict(sorted(out.items()))


def run_row(run: Run) -> dict[str, Any]:
    row, div = run.row(), run.diverged or {}
    return {"experiment": run.experiment, "run": run.name, "placement": row["placement"],
            "lr": row["lr"], "warmup": row["warmup"], "residual_scale": run.get("residual_scale", 1.0),
            "seed": row["seed"], "status": row["status"], "outcome": outcome(run),
            "diverged_update": div.get("update"), "diverged_reason": div.get("reason"),
            "updates": row["updates"], "final_valid_loss": R.rounded(R.final(run, "valid_loss")),
            "final_valid_nll_loss": R.rounded(R.final(run, "valid_nll_loss")),
            "final_valid_bleu": R.rounded(R.final(run, "valid_bleu"))}


# --- stability per arm --------------------------------------------------------------------------


def arm(grid: dict, placement: str, warmup: int, dt: float = 1.0) -> list[Cell | None]:
    """The cells of one (placement, warm-up, dt) at every lr of the grid, by increasing lr
    (None where that cell was not run)."""
    lrs = sorted({k[1] for k in grid})
    return [grid.get((placement, lr, warmup, dt)) for lr in lrs]


def largest_stable_lr(cells_by_lr: list[Cell | None]) -> dict[str, Any]:
    """The largest lr up to which every cell is stable (lr None: the lowest lr already fails).

    ``top``: stable at the grid's highest lr (the true limit is higher); ``known``: False when a
    cell not run or unfinished comes before the first failure (the limit may be lower).
    """
    best, known = None, True
    for c in cells_by_lr:
        if c is None or c.stable is None:
            known = False
            break
        if not c.stable:
            break
        best = c.lr
    top = known and bool(cells_by_lr) and best is not None and cells_by_lr[-1] is not None \
        and best == cells_by_lr[-1].lr
    return {"lr": best, "top": top, "known": known}


def first_failure(cells_by_lr: list[Cell | None]) -> float | None:
    return next((c.lr for c in cells_by_lr if c is not None and c.stable is False), None)


# --- hidden-state norms -------------------------------------------------------------------------


def final_norms(run: Run) -> list[dict[str, Any]]:
    """Per-layer hidden-state RMS at the last tracked update of a run (norms.csv of track_norms)."""
    path = run_paths(run.dir)["norms"]
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("h_sq_norm_per_d") not in (None, "")]
    except OSError:
        return []
    if not rows:
        return []
    last = max(int(r["update"]) for r in rows)
    key = _key(run)
    out = []
    for r in rows:
        if int(r["update"]) == last:
            ms = float(r["h_sq_norm_per_d"])
            out.append({"run": run.name, "placement": key[0], "lr": key[1], "warmup": key[2],
                        "residual_scale": key[3], "seed": run.get("seed"), "update": last,
                        "side": r["side"], "layer": int(r["layer"]),
                        "hidden_rms": math.sqrt(ms) if ms >= 0 else math.nan})
    return sorted(out, key=lambda x: (x["side"], x["layer"]))


def growth(norm_rows: list[dict[str, Any]], side: str, absolute: bool = False) -> float:
    """RMS of the last layer over the first layer of one stack (``absolute``: the last layer's RMS;
    nan if missing)."""
    by = {r["layer"]: r["hidden_rms"] for r in norm_rows if r["side"] == side}
    if absolute:
        return by[max(by)] if by else math.nan
    if len(by) < 2 or not by[min(by)] > 0:
        return math.nan
    return by[max(by)] / by[min(by)]


def _mean_finite(values: list[float]) -> float | None:
    v = [x for x in values if math.isfinite(x)]
    return sum(v) / len(v) if v else None


# --- checks -------------------------------------------------------------------------------------


def _lr(x: float | None) -> str:
    return "none" if x is None else f"{x:g}"


def _stable_text(s: dict[str, Any]) -> str:
    if s["lr"] is None:
        return "fails at the lowest lr" if s["known"] else "not known (cells not run)"
    return f"{s['lr']:g}" + (" (the grid's top)" if s["top"] else "") + ("" if s["known"] else " (so far)")


def grid_range(grid: dict, lrs: list[float], warmups: list[int]) -> Check:
    """The grid's own requirement: its lowest lr trains every arm (placement x warm-up, dt = 1,
    every seed) and its highest makes some arm fail; otherwise the atlas shows only part of the
    picture (a range too high or too low), whatever the claims below say."""
    def at(lr: float) -> dict[str, bool | None]:
        return {f"{p}/warm-up {w}": grid[(p, lr, w, 1.0)].stable for p in PLACEMENTS for w in warmups
                if (p, lr, w, 1.0) in grid}

    low, high = at(lrs[0]), at(lrs[-1])  # main() refuses an empty grid
    low_fail = [k for k, v in low.items() if v is False]
    high_fail = [k for k, v in high.items() if v is False]
    nan_top = sum(c.counts["diverged"] for k, c in grid.items() if k[1] == lrs[-1])
    known = bool(low) and None not in low.values() and (bool(high_fail) or None not in high.values())
    ours = (f"lowest lr {lrs[0]:g}: " + (f"fails in {', '.join(low_fail)}" if low_fail else
                                        f"every arm trains ({len(low)} arms)")
            + f"; highest lr {lrs[-1]:g}: "
            + (f"{', '.join(high_fail)} fail" if high_fail else "every arm trains")
            + f" ({nan_top} NaN/inf runs)")
    return Check(
        "atlas_grid_range", "the lr grid runs from an lr where every placement trains (every warm-up "
        "arm and seed, dt = 1) to one where some arm fails",
        "the atlas's design (not a paper claim): both ends of the stability picture are on the grid",
        {"lowest_lr": lrs[0], "stable_at_lowest": low, "highest_lr": lrs[-1],
         "failing_at_highest": high_fail, "nan_runs_at_highest": nan_top},
        ours, (not low_fail and bool(high_fail)) if known else None, required=False)


def checks(grid: dict, warmups: list[int], norms: dict[str, list[dict]]) -> list[Check]:
    lrs = sorted({k[1] for k in grid})
    out = [grid_range(grid, lrs, warmups)]
    # 1. Peri-LN stable wherever Pre-LN is
    pairs = [(w, lr, grid.get(("pre_ln", lr, w, 1.0)), grid.get(("peri_ln", lr, w, 1.0)))
             for w in warmups for lr in lrs]
    known = [(w, lr, a, b) for w, lr, a, b in pairs if a and b and a.stable is True and b.stable is not None]
    broken = [f"lr {lr:g}, warm-up {w}" for w, lr, a, b in known if not b.stable]
    ok = bool(known) and not broken
    out.append(Check(
        "atlas_peri_stable_where_pre", "Peri-LN trains in every cell (lr, warm-up; dt=1) where Pre-LN does",
        "Peri-LN trains wherever Pre-LN does, and beyond (Kim et al. 2025)",
        {"cells_where_pre_ln_trains": len(known), "peri_ln_fails_at": broken},
        f"Pre-LN trains in {len(known)} finished cells; Peri-LN "
        + (f"fails in {', '.join(broken)}" if broken else "trains in all of them"),
        ok if known else None, required=False))
    # 2. ... and at a higher lr
    per_w = {w: {p: largest_stable_lr(arm(grid, p, w)) for p in ("pre_ln", "peri_ln")} for w in warmups}

    def rank(s: dict[str, Any]) -> float:
        return -1.0 if s["lr"] is None else s["lr"]

    higher = [w for w, s in per_w.items() if rank(s["peri_ln"]) > rank(s["pre_ln"])]
    # lower is settled once Peri-LN's limit is known: Pre-LN is stable at least up to its own
    lower = [w for w, s in per_w.items() if s["peri_ln"]["known"] and rank(s["peri_ln"]) < rank(s["pre_ln"])]
    all_known = all(s[p]["known"] for s in per_w.values() for p in s)
    # both stable at the grid's top: their limits lie above it, the grid cannot order them
    decidable = [w for w, s in per_w.items() if not (s["pre_ln"]["top"] and s["peri_ln"]["top"])]
    text = "; ".join(f"warm-up {w}: Pre-LN {_stable_text(s['pre_ln'])}, Peri-LN {_stable_text(s['peri_ln'])}"
                     for w, s in per_w.items())
    if not higher and all(s["pre_ln"]["top"] for s in per_w.values()):
        text += " (Pre-LN is stable at every lr of the grid: the grid does not reach its limit)"
    out.append(Check(
        "atlas_peri_higher_lr", "Peri-LN's largest stable lr is higher than Pre-LN's (and never lower)",
        "Peri-LN trains at learning rates where Pre-LN diverges (Kim et al. 2025)",
        {str(w): s for w, s in per_w.items()}, text,
        False if lower else (bool(higher) if all_known and decidable else None), required=False))
    # 3. smaller seed spread
    both = [(lr, w, grid[("pre_ln", lr, w, 1.0)], grid[("peri_ln", lr, w, 1.0)]) for w in warmups
            for lr in lrs if ("pre_ln", lr, w, 1.0) in grid and ("peri_ln", lr, w, 1.0) in grid]
    both = [(lr, w, a, b) for lr, w, a, b in both
            if a.stable and b.stable and math.isfinite(a.spread) and math.isfinite(b.spread)]
    sp_pre = sum(a.spread for *_, a, _ in both) / len(both) if both else None
    sp_peri = sum(b.spread for *_, b in both) / len(both) if both else None
    out.append(Check(
        "atlas_peri_smaller_spread", "Peri-LN's final valid loss varies less over seeds than Pre-LN's "
        "(mean max-min over the cells where both train)",
        "smaller spread across seeds (Kim et al. 2025; GPT-2 Pre-LN diverged in some of 5 trials)",
        {"cells": len(both), "mean_spread_pre_ln": R.rounded(sp_pre),
         "mean_spread_peri_ln": R.rounded(sp_peri),
         "cells_peri_smaller": sum(b.spread < a.spread for *_, a, b in both)},
        f"{len(both)} cells: mean spread Pre-LN {R.fmt(sp_pre, 3)} vs Peri-LN {R.fmt(sp_peri, 3)} bits"
        if both else "no cell where both train on >= 2 seeds yet",
        bool(sp_peri < sp_pre) if both else None, required=False))
    # 4. dt < 1 never less stable
    comps, worse = [], []
    for (p, lr, w, dt), c in grid.items():
        base = grid.get((p, lr, w, 1.0))
        if dt >= 1.0 or base is None or c.stable is None or base.stable is None:
            continue
        frac = c.counts["trained"] / len(c.runs)
        frac1 = base.counts["trained"] / len(base.runs)
        comps.append({"placement": p, "lr": lr, "warmup": w, "dt": dt, "trained": frac, "trained_dt1": frac1})
        if frac < frac1:
            worse.append(f"{p} lr {lr:g} dt {dt:g}")
    out.append(Check(
        "atlas_dt_never_less_stable", "a residual step dt < 1 never trains fewer seeds than dt = 1 "
        "(Pre-/Peri-LN, same lr and warm-up)", "dt < 1 tightens hidden-state growth and stabilises "
        "training (Kan et al. 2025)", {"comparisons": comps, "less_stable": worse},
        (f"{len(comps)} comparisons; "
         + (f"less stable: {', '.join(worse)}" if worse else "never less stable")
         + f"; more seeds train with dt < 1 in {sum(x['trained'] > x['trained_dt1'] for x in comps)}")
        if comps else "dt runs missing",
        (not worse) if comps else None, required=False))
    # 5. Post-LN without warm-up fails first
    first = {f"{p}/warm-up {w}": first_failure(arm(grid, p, w)) for p in PLACEMENTS for w in warmups
             if any(arm(grid, p, w))}
    post = first.get("post_ln/warm-up 0")
    others = {k: v for k, v in first.items() if k != "post_ln/warm-up 0"}
    tied = [k for k, v in others.items() if v is not None and post is not None and v == post]
    earlier = [k for k, v in others.items() if v is not None and (post is None or v < post)]

    def failing(name: str) -> float:  # share of the seeds that fail at Post-LN's first failing lr
        p, w = name.split("/warm-up ")
        c = grid[(p, post, int(w), 1.0)]
        return (c.counts["plateau"] + c.counts["diverged"]) / len(c.runs)

    # a tie at that lr is broken by the share of seeds that fail there
    tie_lost = [k for k in tied if failing(k) >= failing("post_ln/warm-up 0")]
    ok = None if "post_ln/warm-up 0" not in first else (post is not None and not earlier and not tie_lost)
    out.append(Check(
        "atlas_post_ln_no_warmup_first", "Post-LN without warm-up is the first arm to fail as lr grows "
        "(at a tie, it fails in more of the seeds)",
        "Post-LN needs warm-up, Pre-LN does not (Xiong et al. 2020)",
        {"first_failing_lr": first, "failing_seed_share_at_that_lr":
            {k: R.rounded(failing(k)) for k in ["post_ln/warm-up 0", *tied]} if post is not None else {}},
        f"Post-LN without warm-up first fails at lr {_lr(post)}"
        + (f" ({failing('post_ln/warm-up 0'):.0%} of its seeds)" if post is not None else "")
        + ("; tied with " + ", ".join(f"{k} ({failing(k):.0%} of its seeds)" for k in tied) if tied else "")
        + (f"; earlier: {', '.join(earlier)}" if earlier else ""), ok, required=False))
    # 6. hidden-state growth, Pre-LN vs Peri-LN (Kan et al.)
    sides = ("encoder", "decoder")
    mean_g = {p: {s: _mean_finite([growth(rows, s) for rows in norms.get(p, [])]) for s in sides}
              for p in DT_PLACEMENTS}
    top = {p: {s: _mean_finite([growth(rows, s, absolute=True) for rows in norms.get(p, [])])
               for s in sides} for p in DT_PLACEMENTS}
    have = all(mean_g[p][s] is not None for p in mean_g for s in mean_g[p])
    out.append(Check(
        "atlas_hidden_growth", "at the end of training, Pre-LN's hidden-state RMS grows more from the "
        "first to the last layer than Peri-LN's (trained runs, dt=1, mean over lr and seeds)",
        "Pre-LN's hidden states can grow without bound, Peri-LN's at most linearly (Kan et al. 2025)",
        {"growth_last_over_first": mean_g, "last_layer_rms": top},
        "; ".join(f"{s}: Pre-LN x{R.fmt(mean_g['pre_ln'][s])} (last layer RMS {R.fmt(top['pre_ln'][s], 1)}), "
                  f"Peri-LN x{R.fmt(mean_g['peri_ln'][s])} ({R.fmt(top['peri_ln'][s], 1)})"
                  for s in sides) if have else "norms.csv missing",
        all(mean_g["pre_ln"][s] > mean_g["peri_ln"][s] for s in ("encoder", "decoder")) if have else None,
        required=False))
    return out


# --- figures ------------------------------------------------------------------------------------


def _rows_of(placement: str, grid: dict, warmups: list[int]) -> list[tuple[int, float]]:
    dts = sorted({k[3] for k in grid if k[0] == placement and k[3] != 1.0}, reverse=True)
    return [(w, 1.0) for w in warmups] + [(0, dt) for dt in dts]


def _row_label(w: int, dt: float) -> str:
    return ("no warm-up" if w == 0 else f"warm-up {w}") + ("" if dt == 1.0 else f", dt {dt:g}")


def draw_heatmaps(grid: dict, lrs: list[float], warmups: list[int]):
    import numpy as np

    from lnexp.figures import style

    plt = style.setup()
    from matplotlib.patches import Rectangle

    placements = [p for p in PLACEMENTS if any(k[0] == p for k in grid)]
    means = [c.mean for c in grid.values() if math.isfinite(c.mean)]
    vmin, vmax = (min(means), max(means)) if means else (0.0, 1.0)
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    ncol = min(2, len(placements))
    nrow = -(-len(placements) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.6 * ncol, 3.3 * nrow), squeeze=False,
                             layout="constrained")
    fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))  # room for the note under the panels
    for ax in axes.flat[len(placements):]:
        ax.set_visible(False)
    im = None
    for ax, p in zip(axes.flat, placements, strict=False):
        rows = _rows_of(p, grid, warmups)
        data = np.full((len(rows), len(lrs)), np.nan)
        for i, (w, dt) in enumerate(rows):
            for j, lr in enumerate(lrs):
                c = grid.get((p, lr, w, dt))
                if c is not None:
                    data[i, j] = c.mean
        im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        for i, (w, dt) in enumerate(rows):
            for j, lr in enumerate(lrs):
                c = grid.get((p, lr, w, dt))
                if c is None:
                    ax.text(j, i, "not run", ha="center", va="center", fontsize=6, color="0.5")
                    continue
                n = c.counts
                lines = []
                if math.isfinite(c.mean):
                    lines.append(f"{c.mean:.2f}")
                    if math.isfinite(c.spread):
                        lines.append(f"±{c.spread / 2:.2f}")
                if n["diverged"]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="black" if n["diverged"] ==
                                           len(c.runs) else "none", edgecolor="0.1", hatch="xx", lw=0))
                    lines.append(f"NaN {n['diverged']}/{len(c.runs)}")
                if n["plateau"]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="none", edgecolor="white",
                                           hatch="///", lw=0))
                    lines.append(f"plateau {n['plateau']}/{len(c.runs)}")
                if n["missing"]:
                    lines.append(f"{n['missing']} unfinished")
                dark = n["diverged"] == len(c.runs) or (math.isfinite(c.mean) and
                                                        (c.mean - vmin) < 0.5 * (vmax - vmin + 1e-9))
                ax.text(j, i, "\n".join(lines), ha="center", va="center", fontsize=6.5,
                        color="white" if dark else "black",
                        bbox=dict(boxstyle="round,pad=0.15", fc="0.2" if dark else "white", alpha=0.55,
                                  lw=0) if (n["plateau"] or n["diverged"]) else None)
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.set_yticks(range(len(rows)), [_row_label(w, dt) for w, dt in rows], fontsize=7)
        ax.set_xlabel("peak learning rate")
        ax.set_title(style.LABELS.get(p, p), color=style.COLORS.get(p, "black"))
        ax.grid(False)
    if im is not None:
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.85, pad=0.01)
        cb.set_label("final valid loss, mean over seeds (bits/token)")
    return fig


def draw_stability(grid: dict, lrs: list[float], warmups: list[int], norm_rows: list[dict[str, Any]]):
    from lnexp.figures import style

    plt = style.setup()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8), gridspec_kw={"width_ratios": [1.2, 1, 1]})
    ax = axes[0]
    placements = [p for p in PLACEMENTS if any(k[0] == p for k in grid)]
    width = 0.8 / max(len(warmups), 1)
    floor = min(lrs) / 2 if lrs else 1e-4
    for k, w in enumerate(warmups):
        for i, p in enumerate(placements):
            cells_by_lr = arm(grid, p, w)
            s = largest_stable_lr(cells_by_lr)
            x = i - 0.4 + width * (k + 0.5)
            h = s["lr"] if s["lr"] is not None else floor
            ax.bar(x, h, width * 0.9, color=style.COLORS.get(p, "0.5"), alpha=1.0 if w == 0 else 0.5,
                   hatch="" if w == 0 else "//", edgecolor="white",
                   label=("no warm-up" if w == 0 else f"warm-up {w}") if i == 0 else None)
            if not any(cells_by_lr):
                mark = "not run"
            elif s["lr"] is None:
                mark = "none" if s["known"] else "?"
            else:
                mark = ("≥" if s["top"] else "") + f"{s['lr']:g}" + ("" if s["known"] else "?")
            ax.text(x, h * 1.08, mark, ha="center", va="bottom", fontsize=6.5)
    ax.set_yscale("log", base=2)
    ax.set_yticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.minorticks_off()
    ax.set_xticks(range(len(placements)), [style.LABELS.get(p, p) for p in placements])
    ax.set(title="largest stable peak lr (dt = 1; every seed trains)", ylabel="peak lr")
    ax.set_ylim(floor / 1.5, (max(lrs) if lrs else 1e-3) * 2.5)
    ax.legend(fontsize=7)
    for ax, side in zip(axes[1:], ("encoder", "decoder"), strict=True):
        for p in DT_PLACEMENTS:
            by_cfg: dict[tuple[float, float], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
            for r in norm_rows:
                if r["placement"] == p and r["side"] == side and r["warmup"] == 0:
                    by_cfg[(r["lr"], r["residual_scale"])][r["layer"]].append(r["hidden_rms"])
            for (lr, dt), layers in sorted(by_cfg.items()):
                xs = sorted(layers)
                ys = [sum(layers[x]) / len(layers[x]) for x in xs]
                alpha = 0.35 + 0.65 * (lrs.index(lr) + 1) / len(lrs) if lr in lrs else 0.6
                label = f"{style.LABELS[p]}, lr {lr:g}" + ("" if dt == 1.0 else f", dt {dt:g}")
                ax.plot(xs, ys, "-" if dt == 1.0 else ":", marker="o", ms=3, color=style.COLORS[p],
                        alpha=alpha, label=label)
        ax.set_yscale("log")
        ax.set(title=f"{side}: hidden-state RMS at the end (no warm-up)", xlabel="layer",
               ylabel="RMS of the residual stream")
        if ax.get_legend_handles_labels()[0]:
            if side == "decoder":  # one legend, outside the panels
                ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
        else:
            ax.text(0.5, 0.5, "no norms.csv (track_norms)", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def main(argv: list[str]) -> int:
    from lnexp.errors import UserError
    from lnexp.figures import style

    ap = R.parser("atlas", "stability atlas: placement x peak lr x warm-up (x dt), trained/stalled/diverged")
    args = ap.parse_args(argv)
    exps = FIGURE.experiments(args.scale)
    found = R.select(args.runs_root, exps)
    runs = [r for e in exps for r in found[e]]
    if not runs:
        raise UserError(f"no runs of experiment={exps[0]} under {args.runs_root}: run `make atlas"
                        f"{'' if args.scale == 'mini' else ' SCALE=' + args.scale}` first")
    # the 2020 placements at the mini depth with LayerNorm: the Peri-LN / dt claims, as before
    legacy = [r for r in runs if atlas_zoo.depth_of(r) == 6 and atlas_zoo.scheme_of(r) in LEGACY_PLACEMENTS]
    grid = cells(legacy)  # empty when the zoo's runs have none of them yet: no first-atlas figures
    lrs = sorted({k[1] for k in grid})
    warmups = sorted({k[2] for k in grid if k[3] == 1.0})
    norm_rows: list[dict[str, Any]] = []
    norms_by_p: dict[str, list[list[dict]]] = defaultdict(list)
    for r in legacy:
        rows = final_norms(r)
        norm_rows += rows
        if rows and outcome(r) == "trained" and _key(r)[3] == 1.0 and _key(r)[0] in DT_PLACEMENTS:
            norms_by_p[_key(r)[0]].append(rows)
    cks = checks(grid, warmups, norms_by_p) if grid else []
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "atlas.csv", RUN_FIELDS, [run_row(r) for r in runs])
    write_csv(args.out / "atlas_summary.csv", CELL_FIELDS, [c.row() for c in grid.values()])
    write_csv(args.out / "atlas_norms.csv", NORM_FIELDS, norm_rows)
    counts = {o: sum(outcome(r) == o for r in runs) for o in OUTCOMES}
    tally = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    note = (f"scale={args.scale}; {len(runs)} runs ({tally}); "
            "cell: final valid loss (bits/token), mean ± half the range over seeds; "
            "xx = NaN/inf, /// = still on the unigram plateau")
    paths = []
    if grid:
        paths += style.save(draw_heatmaps(grid, lrs, warmups), args.out, "atlas", note)
        paths += style.save(draw_stability(grid, lrs, warmups, norm_rows), args.out, "atlas_stability",
                            f"scale={args.scale}; stable = every seed trained (no plateau, no NaN/inf); "
                            "'?' = cells not run or unfinished before the first failure; "
                            "RMS = sqrt(E|h|^2/d), norms.csv")
    zoo_cks, zoo_paths, plan_note = zoo_outputs(runs, args)
    cks += zoo_cks
    paths += zoo_paths
    claims = [c for c in cks if c.id != "atlas_grid_range"]
    supported = [c for c in claims if c.holds is True]
    write_checks(args.out, "atlas", args.scale, cks, {
        "units": R.UNITS, "experiments": exps, "runs": len(runs), "outcomes": counts,
        "claims_supported": f"{len(supported)} of {len(claims)}",
        "max_update": sorted({r.get("max_update") for r in runs}, key=str),
        "schedule": sorted({str(r.get("schedule.name")) for r in runs}),
        "stable_means": "every seed of the cell trained: no NaN/inf, not on the unigram plateau",
        "plan": plan_note})
    R.print_outputs(cks, paths, args.out, ("atlas.csv", "atlas_summary.csv", "atlas_norms.csv",
                                          *(f"{n}.csv" for n in ZOO_FIGURES), "atlas_table.md",
                                          "atlas_checks.json"),
                   marks=("supported", "NOT supported", "undecided (not measured, or beyond the grid)"))
    return 0


def zoo_outputs(runs: list[Run], args) -> tuple[list[Check], list, str]:
    """The zoo's four figures, their CSVs and checks (lnexp/figures/atlas_zoo.py); the note says
    which cells the budget left out (runs_root/atlas_plan.json of lnexp atlas)."""
    from lnexp.atlas.driver import read_plan
    from lnexp.atlas.grid import read_grid
    from lnexp.config import CONFIG_DIR
    from lnexp.figures import style

    Z = atlas_zoo
    zgrid = Z.zoo_cells(runs)
    lrs = sorted({k[3] for k in zgrid})
    depths = sorted({k[1] for k in zgrid})
    warmups = sorted({k[2] for k in zgrid})
    plan = read_plan(args.runs_root)
    # the lrs lnexp atlas chose from, not only those run: a bound is known only against the grid
    lrs = sorted(set(lrs) | set(plan.get("lrs", [])))
    try:
        shared = read_grid(args.scale).shared_lr
    except Exception:  # a scale without the grid: the second lr run
        shared = lrs[min(1, len(lrs) - 1)]
    schemes_found = sorted({k[0] for k in zgrid})
    placements = {}
    for r in runs:
        placements.setdefault(str(r.get("placement.name")), r.get("placement") or {})
    for p in ("rezero", "t_fixup"):  # their norm switches, from the configs when not run yet
        if p not in placements and (CONFIG_DIR / "placement" / f"{p}.yaml").is_file():
            from omegaconf import OmegaConf

            placements[p] = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "placement" / f"{p}.yaml"))
    lr_rows = []
    for s in schemes_found:
        for d in depths:
            for w in warmups:
                if not any(k[:3] == (s, d, w) for k in zgrid):
                    continue
                b = Z.largest_stable(zgrid, lrs, s, d, w)
                lr_rows.append({"scheme": s, "depth": d, "warmup": w, "largest_stable_lr": b["lr"],
                                "top": b["top"],
                                "known": b["known"], "first_failing_lr": b["first_fail"]})
    ordered = Z.order(schemes_found, lr_rows, min(depths))
    map_rows = [{"scheme": k[0], "depth": k[1], "warmup": k[2], "lr": k[3], "seeds": len(c.runs),
                 **{o: c.outcomes().count(o) for o in ("trained", "plateau", "diverged")}, "stable": c.stable,
                 "mean_valid_loss": R.rounded(sum(c.losses()) / len(c.losses()) if c.losses() else math.nan)}
                for k, c in zgrid.items()]
    loss_rows, growth_rows = [], []
    for (s, d, w, lr), c in zgrid.items():
        if lr == shared:
            m = Z.summarise(c.losses())
            loss_rows.append({"scheme": s, "depth": d, "warmup": w, "lr": lr, "n": m.n,
                              "mean_valid_loss": R.rounded(m.mean), "ci_low": R.rounded(m.low),
                              "ci_high": R.rounded(m.high),
                              "std": R.rounded(m.std)})
        for r in c.runs:
            for side, v in Z.norms_of(r).items():
                growth_rows.append({"scheme": s, "depth": d, "warmup": w, "lr": lr, "seed": r.get("seed"),
                                    "side": side, "first_layer_rms": R.rounded(v["first"]),
                                    "last_layer_rms": R.rounded(v["last"]),
                                    "deep_ffn_grad_norm": R.rounded(v["grad"])})
    not_run = plan.get("not_run", [])
    plan_note = (f"lnexp atlas stopped: {plan.get('stopped')}; {len(not_run)} cells of its last round not run"
                 if plan else "no atlas_plan.json (cells not chosen by lnexp atlas)")
    plan_note += "".join(f"; {Z.label(c)} = {Z.label(o)}'s network, not run twice"
                         for c, o in plan.get("same_network", {}).items())
    cks = Z.zoo_checks(zgrid, lrs, shared, depths, warmups, placements)
    write_csv(args.out / "atlas_maps.csv", Z.MAP_FIELDS, map_rows)
    write_csv(args.out / "atlas_lr.csv", Z.LR_FIELDS, lr_rows)
    write_csv(args.out / "atlas_loss.csv", Z.LOSS_FIELDS, loss_rows)
    write_csv(args.out / "atlas_growth.csv", Z.GROWTH_FIELDS, growth_rows)
    write_text(args.out / "atlas_table.md",
               Z.scheme_table(lr_rows, loss_rows, ordered, depths, warmups, shared))
    grey = sum(1 for s in ordered for d in depths for w in warmups for lr in lrs
               if (s, d, w, lr) not in zgrid)
    base = f"scale={args.scale}; {len(ordered)} schemes, sorted by largest stable lr at depth {min(depths)}"
    paths = style.save(Z.draw_maps(zgrid, ordered, lrs, depths, warmups), args.out, "atlas_maps",
                       f"{base}; grey = not run ({grey} cells); number = seeds when > 1; {plan_note}")
    paths += style.save(Z.draw_lr(lr_rows, ordered, lrs, depths, warmups), args.out, "atlas_lr",
                        f"{base}; stable = every seed trained; open = boundary not bracketed (cells not run)")
    last = [dict(g, value=g["last_layer_rms"]) for g in growth_rows
            if g["lr"] == shared and g["side"] == "decoder"]
    agg: dict[tuple, list[float]] = defaultdict(list)
    for g in last:
        agg[(g["scheme"], g["depth"], g["warmup"])].append(g["value"])
    growth_bars = []
    for (s, d, w), v in agg.items():
        m = Z.summarise(v)
        growth_bars.append({"scheme": s, "depth": d, "warmup": w, "mean": m.mean,
                            "low": m.low if m.n > 1 else None, "high": m.high if m.n > 1 else None})
    paths += style.save(Z.draw_bars(loss_rows, ordered, depths, warmups, "mean_valid_loss", "ci_low",
                                    "ci_high",
                                    "final valid loss (bits/token)", f"loss at lr {shared:g}"), args.out,
                        "atlas_loss", f"{base}; mean over seeds, line = 95% t-interval (n >= 2)")
    paths += style.save(Z.draw_bars(growth_bars, ordered, depths, warmups, "mean", "low", "high",
                                    "decoder last-layer RMS at the end", f"hidden state, lr {shared:g}",
                                    log=True),
                        args.out, "atlas_growth", f"{base}; RMS = sqrt(E|h|^2/d) at the last tracked update "
                        "(norms.csv); line = 95% t-interval (n >= 2)")
    return cks, paths, plan_note
