"""The zoo part of ``lnexp figure atlas``: every scheme (placement, or placement+norm) x depth x
warm-up x lr, drawn as small multiples, and the zoo papers' claims checked on those runs.

Figures (PNG + PDF, each with the CSV behind it): atlas_maps (per scheme a stability map, lr x
warm-up, one panel per depth), atlas_lr (largest stable lr of every scheme, with and without
warm-up, shallow and deep), atlas_loss (final valid loss at the shared lr, mean and 95%
t-interval over seeds), atlas_growth (hidden-state RMS of the last layer at the end of training).
Seed statistics come from :mod:`lnexp.stats`.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from typing import Any

from lnexp.figures import runs as R
from lnexp.figures.checks import Check
from lnexp.results import Run
from lnexp.rundir import run_paths
from lnexp.stats import SeedSummary, summarise

NO_NORM = (
    "input_norm",
    "output_norm",
    "sum_norm",
    "inner_norm",
    "qk_norm",
    "v_norm",
    "final_norm",
    "embed_norm",
)  # a placement with all of these false has no norm anywhere
MAP_FIELDS = (
    "scheme",
    "depth",
    "warmup",
    "lr",
    "seeds",
    "trained",
    "plateau",
    "diverged",
    "stable",
    "mean_valid_loss",
)
LR_FIELDS = ("scheme", "depth", "warmup", "largest_stable_lr", "top", "known", "first_failing_lr")
LOSS_FIELDS = ("scheme", "depth", "warmup", "lr", "n", "mean_valid_loss", "ci_low", "ci_high", "std")
GROWTH_FIELDS = (
    "scheme",
    "depth",
    "warmup",
    "lr",
    "seed",
    "side",
    "first_layer_rms",
    "last_layer_rms",
    "deep_ffn_grad_norm",
)


def scheme_of(run: Run) -> str:
    p, n = str(run.get("placement.name")), str(run.get("norm.name", "layernorm"))
    return p if n == "layernorm" else f"{p}+{n}"


def depth_of(run: Run) -> int:
    return int(run.get("depth.encoder_layers") or 6)


ZKey = tuple[str, int, int, float]  # scheme, depth, warm-up, lr


@dataclass
class ZCell:
    runs: list[Run] = field(default_factory=list)

    def outcomes(self) -> list[str]:
        from lnexp.figures.atlas import outcome

        return [outcome(r) for r in self.runs]

    @property
    def stable(self) -> bool | None:
        o = [x for x in self.outcomes() if x != "missing"]
        if any(x in ("plateau", "diverged") for x in o):
            return False
        return True if o else None

    def losses(self) -> list[float]:
        vals = [
            R.final(r, "valid_loss")
            for r, o in zip(self.runs, self.outcomes(), strict=True)
            if o in ("trained", "plateau")
        ]
        return [v for v in vals if math.isfinite(v)]


def zoo_cells(runs: list[Run]) -> dict[ZKey, ZCell]:
    out: dict[ZKey, ZCell] = {}
    for r in runs:
        if float(r.get("residual_scale", 1.0)) != 1.0:
            continue
        k = (scheme_of(r), depth_of(r), int(r.get("warmup")), float(r.get("lr")))
        out.setdefault(k, ZCell()).runs.append(r)
    return dict(sorted(out.items()))


def largest_stable(
    grid: dict[ZKey, ZCell], lrs: list[float], scheme: str, depth: int, warmup: int
) -> dict[str, Any]:
    """Largest lr stable with every lower *measured* lr stable (bisection leaves gaps): ``known``
    once a failure is seen right above it or it is the grid's top."""
    states = [
        (lr, grid[(scheme, depth, warmup, lr)].stable if (scheme, depth, warmup, lr) in grid else None)
        for lr in lrs
    ]
    fail = next((i for i, (_, s) in enumerate(states) if s is False), None)
    below = states[:fail] if fail is not None else states
    best = max((i for i, (_, s) in enumerate(below) if s is True), default=None)
    if best is None:
        known = fail == 0
        return {
            "lr": None,
            "top": False,
            "known": known,
            "first_fail": states[fail][0] if fail is not None else None,
        }
    known = (fail is not None and fail == best + 1) or (fail is None and best == len(lrs) - 1)
    return {
        "lr": lrs[best],
        "top": fail is None and best == len(lrs) - 1,
        "known": known,
        "first_fail": states[fail][0] if fail is not None else None,
    }


def _text(s: dict[str, Any]) -> str:
    if s["lr"] is None:
        return "fails at the lowest lr" if s["known"] else "not known"
    return ("≥" if s["top"] else "") + f"{s['lr']:g}" + ("" if s["known"] else " (bound not bracketed)")


def norms_of(run: Run) -> dict[str, dict[str, float]]:
    """{side: {first, last (hidden RMS at the last tracked update), grad (mean over updates of the FFN
    gradient norm, sqrt(W1² + W2²), over the last third of the stack's layers)}} from norms.csv."""
    try:
        with open(run_paths(run.dir)["norms"], newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("h_sq_norm_per_d") not in (None, "")]
    except OSError:
        return {}
    if not rows:
        return {}
    last = max(int(r["update"]) for r in rows)
    out: dict[str, dict[str, float]] = {}
    for side in ("encoder", "decoder"):
        rs = [r for r in rows if r["side"] == side]
        if not rs:
            continue
        layers = sorted({int(r["layer"]) for r in rs})
        at_end = {
            int(r["layer"]): math.sqrt(max(float(r["h_sq_norm_per_d"]), 0.0))
            for r in rs
            if int(r["update"]) == last
        }
        deep = set(layers[-max(1, len(layers) // 3) :])
        g = [
            math.hypot(float(r["w1_grad_norm"]), float(r["w2_grad_norm"]))
            for r in rs
            if int(r["layer"]) in deep
        ]
        g = [x for x in g if math.isfinite(x)]
        out[side] = {
            "first": at_end.get(layers[0], math.nan),
            "last": at_end.get(layers[-1], math.nan),
            "grad": sum(g) / len(g) if g else math.nan,
        }
    return out


# --- checks -------------------------------------------------------------------------------------


def _apart(a: SeedSummary, b: SeedSummary) -> bool | None:
    """True: a's interval entirely above b's; False: entirely below; None: overlap or n < 2."""
    if a.n < 2 or b.n < 2:
        return None
    if a.low > b.high:
        return True
    if a.high < b.low:
        return False
    return None


def zoo_checks(
    grid: dict[ZKey, ZCell],
    lrs: list[float],
    shared_lr: float,
    depths: list[int],
    warmups: list[int],
    placements: dict[str, dict],
) -> list[Check]:
    deep, shallow = max(depths), min(depths)
    _w_on, w_off = max(warmups), min(warmups)
    out: list[Check] = []

    def st(scheme: str, depth: int, w: int, lr: float) -> bool | None:
        c = grid.get((scheme, depth, w, lr))
        return None if c is None else c.stable

    # 1. deep Post-LN fails where Admin, DeepNorm, B2T train
    from lnexp.names import PLACEMENTS  # the configs': a rescuer the runs lack leaves the claim undecided

    rescuers = [p for p in ("admin", "deepnorm", "b2t") if p in PLACEMENTS]
    found, refuted, cols = [], [], {}
    for w in warmups if deep != shallow else []:
        for lr in lrs:
            s = {p: st(p, deep, w, lr) for p in ("post_ln", *rescuers)}
            cols[f"warm-up {w}, lr {lr:g}"] = s
            if None in s.values():
                continue
            (found if s["post_ln"] is False and all(s[p] for p in rescuers) else refuted).append((w, lr))
    measured = {k: v for k, v in cols.items() if None not in v.values()}
    out.append(
        Check(
            "atlas_deep_post_ln_rescued",
            f"at depth {deep}+{deep}, Post-LN fails at an lr where " + ", ".join(rescuers) + " train",
            "18L-18L Post-LN diverges on WMT'14 En-De where Admin trains "
            "(Liu et al. 2020); DeepNorm trains 1,000 layers (Wang et al. 2022); B2T trains deep Post-LN "
            "(Takase et al. 2022)",
            {"depth": deep, "cells": cols},
            (
                "; ".join(
                    f"{k}: " + ", ".join(f"{p} {'trains' if v else 'fails'}" for p, v in s.items())
                    for k, s in measured.items()
                )
                if measured
                else "cells not run (every scheme at one lr needed)"
            ),
            True if found else (False if measured and deep != shallow else None),
            required=False,
        )
    )
    # 2. ReZero and T-Fixup train without any norm and without warm-up
    cands = {
        p: all(not placements[p].get(k) for k in NO_NORM) for p in ("rezero", "t_fixup") if p in placements
    }
    res = {p: {d: st(p, d, w_off, shared_lr) for d in depths} for p in cands}
    vals = [v for p in res for v in res[p].values() if v is not None]
    out.append(
        Check(
            "atlas_no_norm_no_warmup",
            f"ReZero and T-Fixup (no norm anywhere: {cands}) train without warm-up at lr {shared_lr:g}",
            "ReZero trains without LayerNorm and warm-up (Bachlechner et al. 2020); "
            "T-Fixup trains without LayerNorm and warm-up (Huang et al. 2020)",
            {"no_norm": cands, "stable": res},
            "; ".join(
                f"{p}: "
                + ", ".join(
                    f"depth {d} {'trains' if v else 'fails' if v is False else 'not run'}"
                    for d, v in r.items()
                )
                for p, r in res.items()
            ),
            None
            if not all(cands.values())
            or res.get("rezero", {}).get(shallow) is None
            or res.get("t_fixup", {}).get(shallow) is None
            else all(vals),
            required=False,
        )
    )
    # 3. DyT within 0.1 bit of LayerNorm, same placement and recipe (paired by seed)
    pairs, verdicts = {}, []
    for p in ("pre_ln", "post_ln"):
        for w in warmups:
            a, b = grid.get((f"{p}+dyt", shallow, w, shared_lr)), grid.get((p, shallow, w, shared_lr))
            if a is None or b is None:
                continue
            la = {int(r.get("seed")): R.final(r, "valid_loss") for r in a.runs}
            lb = {int(r.get("seed")): R.final(r, "valid_loss") for r in b.runs}
            d = summarise([la[s] - lb[s] for s in la if s in lb])
            v = (
                None
                if d.n < 2
                else (
                    True if -0.1 < d.low and d.high < 0.1 else False if d.low > 0.1 or d.high < -0.1 else None
                )
            )
            pairs[f"{p}/warm-up {w}"] = {
                "n": d.n,
                "mean_diff": R.rounded(d.mean),
                "ci": [R.rounded(d.low), R.rounded(d.high)],
                "within_0.1": v,
            }
            verdicts.append(v)
    out.append(
        Check(
            "atlas_dyt_parity",
            f"DyT ends within 0.1 bit of LayerNorm (same placement, warm-up and lr "
            f"{shared_lr:g}; DyT - LayerNorm per seed, 95% t-interval inside ±0.1)",
            "DyT matches LayerNorm as a drop-in replacement (Zhu et al. 2025: parity across ViT, "
            "ConvNeXt, DiT and LLaMA)",
            pairs,
            "; ".join(f"{k}: {v['mean_diff']} bits, 95% CI {v['ci']} (n={v['n']})" for k, v in pairs.items())
            or "DyT runs not run",
            False if False in verdicts else (True if verdicts and all(verdicts) else None),
            required=False,
        )
    )

    # 4 and 5: deep Pre-LN against LayerNorm Scaling (hidden growth) and Mix-LN (deep-layer gradients)
    def per_seed(scheme: str, side: str, key: str) -> SeedSummary:
        c = grid.get((scheme, deep, w_off, shared_lr))
        vals = [
            norms_of(r).get(side, {}).get(key, math.nan)
            for r in (c.runs if c else [])
            if R.final(r, "valid_loss") == R.final(r, "valid_loss")
        ]
        return summarise(vals)

    for cid, other, key, claim, paper, want_lower in (
        (
            "atlas_ln_scaling_growth",
            "ln_scaling",
            "last",
            "LayerNorm Scaling keeps deep Pre-LN's last-layer hidden-state RMS below Pre-LN's",
            "LayerNorm Scaling (1/sqrt(l)) curbs the output variance "
            "growth of deep Pre-LN layers (Sun et al. 2025)",
            True,
        ),
        (
            "atlas_mix_ln_gradients",
            "mix_ln",
            "grad",
            "Mix-LN's deep layers (last third) get larger FFN gradients than Pre-LN's",
            "Mix-LN gives deeper layers larger, more uniform gradients than Pre-LN (Li et al. 2024)",
            False,
        ),
    ):
        if other not in PLACEMENTS:
            continue
        m, per = {}, []
        for side in ("encoder", "decoder"):
            a, b = per_seed(other, side, key), per_seed("pre_ln", side, key)
            above = _apart(a, b)
            v = None if above is None else (above is not want_lower)
            m[side] = {other: a.text(3), "pre_ln": b.text(3), "supported": v}
            per.append(v)
        out.append(
            Check(
                cid,
                f"{claim} (depth {deep}, no warm-up, lr {shared_lr:g}; 95% t-intervals apart)",
                paper,
                m,
                "; ".join(f"{s}: {other} {v[other]} vs Pre-LN {v['pre_ln']}" for s, v in m.items()),
                False if False in per else (True if all(x is True for x in per) else None),
                required=False,
            )
        )
    # 6. Pre-LN's largest stable lr >= Post-LN's
    cmp, verdicts = {}, []
    for d in depths:
        for w in warmups:
            a, b = largest_stable(grid, lrs, "pre_ln", d, w), largest_stable(grid, lrs, "post_ln", d, w)
            ra, rb = (-1.0 if a["lr"] is None else a["lr"]), (-1.0 if b["lr"] is None else b["lr"])
            if ra >= rb and (a["known"] or a["lr"] is not None) and b["known"]:
                v = True
            elif ra < rb and a["known"]:
                v = False
            else:
                v = None
            cmp[f"depth {d}, warm-up {w}"] = {"pre_ln": _text(a), "post_ln": _text(b), "holds": v}
            verdicts.append(v)
    out.append(
        Check(
            "atlas_pre_ge_post_lr",
            "Pre-LN's largest stable lr is at least Post-LN's (every depth and warm-up)",
            "Pre-LN trains without warm-up, Post-LN needs it; Pre-LN tolerates larger lrs (Xiong et al. "
            "2020)",
            cmp,
            "; ".join(f"{k}: Pre-LN {v['pre_ln']}, Post-LN {v['post_ln']}" for k, v in cmp.items()),
            False if False in verdicts else (True if verdicts and all(v is True for v in verdicts) else None),
            required=False,
        )
    )
    return out


# --- figures ------------------------------------------------------------------------------------


def order(schemes: list[str], lr_rows: list[dict[str, Any]], depth: int) -> list[str]:
    """Schemes sorted by their largest stable lr at ``depth`` (no warm-up first, then with), highest first."""

    def score(s: str) -> tuple:
        vals = [r["largest_stable_lr"] or 0.0 for r in lr_rows if r["scheme"] == s and r["depth"] == depth]
        return tuple(-v for v in sorted(vals, reverse=True)), s  # schemes may have fewer rows

    return sorted(schemes, key=score)


def label(scheme: str) -> str:
    from lnexp.figures import style

    p, _, n = scheme.partition("+")
    return style.LABELS.get(p, p) + (f"+{'DyT' if n == 'dyt' else n}" if n else "")


def bound_text(row: dict[str, Any] | None) -> str:
    """One arm's largest stable lr as the per-scheme table writes it: **bold** when a failure one grid
    step above brackets it, "≥" when nothing above it failed (cells not run), "a ok, b fails" when
    the step between was not run."""
    if row is None:
        return "not run"
    lr, fail = row["largest_stable_lr"], row["first_failing_lr"]
    if lr is None:  # no cell stable below the first failure (or no outcome yet)
        return f"fails at {fail:g}" + (" (the lowest lr)" if row["known"] else "") if fail else "not known"
    if row["top"]:
        return f"≥ {lr:g} (grid top)"
    if row["known"]:
        return f"**{lr:g}**"
    return f"{lr:g} ok, {fail:g} fails" if fail is not None else f"≥ {lr:g}"


def scheme_table(
    lr_rows: list[dict[str, Any]],
    loss_rows: list[dict[str, Any]],
    schemes: list[str],
    depths: list[int],
    warmups: list[int],
    shared: float,
) -> str:
    """The per-scheme table (atlas_table.md, quoted in docs/atlas.md): per arm the largest stable lr
    and the final valid loss at the shared lr (mean over seeds, n when more than one)."""
    bounds = {(r["scheme"], r["depth"], r["warmup"]): r for r in lr_rows}
    losses = {(r["scheme"], r["depth"], r["warmup"]): r for r in loss_rows}
    arms = [(d, w) for d in depths for w in warmups]
    head = ["scheme", *[f"{d}+{d}, " + (f"warm-up {w}" if w else "no warm-up") for d, w in arms]]
    lines = [
        f"Largest stable lr; final valid loss (bits/token) at the shared lr {shared:g}, mean over seeds.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for s in schemes:
        cells = []
        for d, w in arms:
            text, m = bound_text(bounds.get((s, d, w))), losses.get((s, d, w))
            if m is not None and m["mean_valid_loss"] is not None and math.isfinite(m["mean_valid_loss"]):
                text += f"; {m['mean_valid_loss']:.2f}" + (f" (n={m['n']})" if m["n"] > 1 else "")
            cells.append(text)
        lines.append(f"| {label(s)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _colour(scheme: str) -> str:
    from lnexp.figures import style

    return style.COLORS.get(scheme.partition("+")[0], "0.4")


def draw_maps(
    grid: dict[ZKey, ZCell], schemes: list[str], lrs: list[float], depths: list[int], warmups: list[int]
):
    import numpy as np

    from lnexp.figures import style

    plt = style.setup()
    from matplotlib.colors import ListedColormap

    per_row = 3
    nrow = -(-len(schemes) // per_row)
    fig, axes = plt.subplots(
        nrow,
        per_row * len(depths),
        figsize=(2.2 * per_row * len(depths), 1.25 * nrow + 0.8),
        squeeze=False,
        layout="constrained",
    )
    codes = {None: 0, True: 1, False: 2}
    cmap = ListedColormap([style.OUTCOME_COLORS[k] for k in ("not run", "trained", "failed")])
    for ax in axes.flat:
        ax.set_visible(False)
    for i, s in enumerate(schemes):
        for j, d in enumerate(depths):
            ax = axes[i // per_row, (i % per_row) * len(depths) + j]
            ax.set_visible(True)
            data = np.zeros((len(warmups), len(lrs)))
            for a, w in enumerate(warmups):
                for b, lr in enumerate(lrs):
                    c = grid.get((s, d, w, lr))
                    data[a, b] = codes[None if c is None else c.stable]
                    if c is not None:
                        n = [o for o in c.outcomes() if o != "missing"]
                        tag = f"{len(n)}" if len(n) > 1 else ""
                        ax.text(
                            b,
                            a,
                            ("NaN" if "diverged" in n else "") + tag,
                            ha="center",
                            va="center",
                            fontsize=5,
                            color="white",
                        )
            ax.imshow(data, cmap=cmap, vmin=0, vmax=2, aspect="auto")
            ax.set_xticks(
                range(len(lrs)),
                [f"{lr:g}" for lr in lrs] if i // per_row == nrow - 1 else [],
                fontsize=5,
                rotation=90,
            )
            ax.set_yticks(range(len(warmups)), [f"wu {w}" for w in warmups] if j == 0 else [], fontsize=5)
            ax.set_title(
                f"{label(s)}, {d}L" if j == 0 else f"{d}L",
                fontsize=6.5,
                color=_colour(s) if j == 0 else "black",
            )
            ax.grid(False)
    from matplotlib.patches import Patch

    fig.legend(
        handles=[Patch(color=style.OUTCOME_COLORS[k], label=k) for k in ("trained", "failed", "not run")],
        loc="outside upper center",
        ncol=3,
        fontsize=7,
    )
    return fig


def _row_of_panels(n_depths: int, n_schemes: int):
    """One panel per depth side by side, a row per scheme: the layout of the per-scheme charts."""
    from lnexp.figures import style

    plt = style.setup()
    return plt.subplots(1, n_depths, figsize=(4.2 * n_depths, 0.28 * n_schemes + 1.2), squeeze=False,
                        sharey=True, layout="constrained")


def draw_lr(
    lr_rows: list[dict[str, Any]], schemes: list[str], lrs: list[float], depths: list[int], warmups: list[int]
):
    fig, axes = _row_of_panels(len(depths), len(schemes))
    floor = lrs[0] / 2
    for ax, d in zip(axes[0], depths, strict=True):
        for y, s in enumerate(schemes):
            for k, w in enumerate(warmups):
                r = next(
                    (x for x in lr_rows if x["scheme"] == s and x["depth"] == d and x["warmup"] == w), None
                )
                if r is None:
                    continue
                v = r["largest_stable_lr"] or floor
                off = (k - (len(warmups) - 1) / 2) * 0.3
                ax.plot(
                    [v],
                    [y + off],
                    marker=">" if r["top"] else ("o" if k == 0 else "s"),
                    ms=5,
                    color=_colour(s),
                    mfc=_colour(s) if r["known"] else "white",
                    ls="none",
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks([floor, *lrs], ["none", *[f"{lr:g}" for lr in lrs]], fontsize=6)
        ax.minorticks_off()
        ax.set_xlim(floor / 1.4, lrs[-1] * 1.4)
        ax.set_yticks(range(len(schemes)), [label(s) for s in schemes], fontsize=6.5)
        if ax is axes[0, 0]:  # the axes share y: invert it once
            ax.invert_yaxis()
        ax.set(title=f"depth {d}+{d}: largest stable lr", xlabel="peak lr")
    from matplotlib.lines import Line2D

    fig.legend(
        handles=[
            Line2D([], [], marker="o", ls="none", color="0.3", label=f"warm-up {warmups[0]}"),
            Line2D([], [], marker="s", ls="none", color="0.3", label=f"warm-up {warmups[-1]}"),
            Line2D([], [], marker=">", ls="none", color="0.3", label="stable at the top"),
            Line2D(
                [], [], marker="o", ls="none", color="0.3", mfc="white", label="not bracketed (cells not run)"
            ),
        ],
        loc="outside upper center",
        ncol=4,
        fontsize=6.5,
    )
    return fig


def draw_bars(
    rows: list[dict[str, Any]],
    schemes: list[str],
    depths: list[int],
    warmups: list[int],
    value: str,
    low: str | None,
    high: str | None,
    xlabel: str,
    title: str,
    log: bool = False,
):
    fig, axes = _row_of_panels(len(depths), len(schemes))
    for ax, d in zip(axes[0], depths, strict=True):
        for y, s in enumerate(schemes):
            for k, w in enumerate(warmups):
                r = next((x for x in rows if x["scheme"] == s and x["depth"] == d and x["warmup"] == w), None)
                if r is None or r[value] is None or not math.isfinite(r[value]):
                    continue
                off = (k - (len(warmups) - 1) / 2) * 0.35
                # dots, not bars from 0: the differences that matter are tenths of a bit
                ax.plot(
                    [r[value]], [y + off], marker="o" if k == 0 else "s", ms=4.5, color=_colour(s), ls="none"
                )
                if low and r.get(low) is not None and math.isfinite(r[low]):
                    ax.plot([r[low], r[high]], [y + off] * 2, color="black", lw=0.8)
        ax.set_yticks(range(len(schemes)), [label(s) for s in schemes], fontsize=6.5)
        if ax is axes[0, 0]:  # the axes share y: invert it once
            ax.invert_yaxis()
        if log:
            ax.set_xscale("log")
        ax.set(title=f"depth {d}+{d}: {title}", xlabel=xlabel)
    from matplotlib.lines import Line2D

    fig.legend(
        handles=[
            Line2D([], [], marker="o", ls="none", color="0.3", label=f"warm-up {warmups[0]}"),
            Line2D([], [], marker="s", ls="none", color="0.3", label=f"warm-up {warmups[-1]}"),
        ],
        loc="outside upper center",
        ncol=2,
        fontsize=6.5,
    )
    return fig
