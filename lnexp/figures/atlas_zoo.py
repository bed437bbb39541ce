"""What ``lnexp figure atlas`` draws (lnexp/figures/atlas.py computes; this module only draws):
atlas_maps (per scheme a stability map, lr x warm-up/dt, one panel per depth), atlas_lr (largest
stable lr of every scheme, with and without warm-up, shallow and deep), atlas_loss and
atlas_growth (a value per scheme and arm with its interval), and the per-scheme table.
"""

from __future__ import annotations

import math
from typing import Any

from lnexp.atlas.outcomes import SeedsAt
from lnexp.results import Run

LR_FIELDS = ("scheme", "depth", "warmup", "largest_stable_lr", "top", "known", "first_failing_lr")
LOSS_FIELDS = ("scheme", "depth", "warmup", "lr", "n", "mean_valid_loss", "ci_low", "ci_high", "std")
GROWTH_FIELDS = ("scheme", "depth", "warmup", "dt", "lr", "seed", "side", "first_layer_rms", "last_layer_rms",
                 "deep_ffn_grad_norm")


def scheme_label(run: Run) -> str:
    p, n = str(run.get("placement.name")), str(run.get("norm.name", "layernorm"))
    return p if n == "layernorm" else f"{p}+{n}"


def order(schemes: list[str], lr_rows: list[dict[str, Any]], depth: int) -> list[str]:
    """Schemes sorted by their largest stable lr at ``depth`` (no warm-up first, then with), highest first."""

    def score(s: str) -> tuple:
        vals = [r["largest_stable_lr"] or 0.0 for r in lr_rows if r["scheme"] == s and r["depth"] == depth]
        return tuple(-v for v in sorted(vals, reverse=True)), s  # schemes may have fewer rows

    return sorted(schemes, key=score)


def label(scheme: str) -> str:
    from lnexp.figures import style
    from lnexp.names import NORM_LABELS

    p, _, n = scheme.partition("+")
    return style.LABELS.get(p, p) + (f"+{NORM_LABELS.get(n, n)}" if n else "")


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


def _arm_name(depth: int, warmup: int) -> str:
    return f"{depth}+{depth}, " + (f"warm-up {warmup}" if warmup else "no warm-up")


def scheme_table(
    lr_rows: list[dict[str, Any]],
    loss_rows: list[dict[str, Any]],
    schemes: list[str],
    depths: list[int],
    warmups: list[int],
    shared: float,
    sens_rows: list[dict[str, Any]] | None = None,
) -> str:
    """The per-scheme table (atlas_table.md, quoted in docs/atlas.md): per arm the largest stable lr
    and the final valid loss at the shared lr (mean over seeds, n when more than one); where arms
    have one (``sens_rows``: lnexp.figures.lr_sensitivity.sensitivity_rows), a column per such arm
    of the LR sensitivity over the half-decade grid (the zoo column: 6+6 with and without warm-up)."""
    from lnexp.figures.lr_sensitivity import caveat, mark

    bounds = {(r["scheme"], r["depth"], r["warmup"]): r for r in lr_rows}
    losses = {(r["scheme"], r["depth"], r["warmup"]): r for r in loss_rows}
    sens = {(r["scheme"], r["depth"], r["warmup"]): r for r in sens_rows or [] if r["complete_seeds"]}
    arms = [(d, w) for d in depths for w in warmups]
    sens_arms = [(d, w) for d, w in arms if any(k[1:] == (d, w) for k in sens)]
    head = ["scheme", *[_arm_name(d, w) for d, w in arms],
            *[f"LR sensitivity, {_arm_name(d, w)}" for d, w in sens_arms]]
    lines = [
        f"Largest stable lr; final valid loss (bits/token) at the shared lr {shared:g}, mean over seeds."
        + (" LR sensitivity (Wortsman et al. 2023): bits/token over the half-decade lr grid, mean over the "
           "seeds with every lr (n when more than one)." if sens_arms else ""),
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
        for d, w in sens_arms:
            r = sens.get((s, d, w))
            n = r["complete_seeds"] if r else 0
            cells.append(f"{r['mean']:.2f}" + (f" (n={n})" if n > 1 else "") if r else "not run")
        lines.append(f"| {label(s)}{mark(s) if sens_arms else ''} | " + " | ".join(cells) + " |")
    note = caveat(schemes) if sens_arms else ""
    return "\n".join(lines + (["", note] if note else [])) + "\n"


def _colour(scheme: str) -> str:
    from lnexp.figures import style

    return style.COLORS.get(scheme.partition("+")[0], "0.4")


def draw_maps(grid: SeedsAt, schemes: list[str], lrs: list[float], depths: list[int]):
    """Per scheme and depth a map, lr x (warm-up, dt): green = every finished seed trained, red = one
    failed, grey = not run; a number = seeds when more than one."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from lnexp.figures import style

    plt = style.setup()
    by = {(a.scheme.label, a.depth, a.warmup, a.dt, lr): c for (a, lr), c in grid.items()}
    rows = sorted({(w, dt) for (_, _, w, dt, _) in by}, key=lambda r: (-r[1], r[0]))
    per_row, nrow = 3, -(-len(schemes) // 3)
    fig, axes = plt.subplots(nrow, per_row * len(depths), figsize=(2.2 * per_row * len(depths),
                             (0.25 + 0.2 * len(rows)) * nrow + 0.8), squeeze=False, layout="constrained")
    codes = {None: 0, True: 1, False: 2}
    cmap = ListedColormap([style.OUTCOME_COLORS[k] for k in ("not run", "trained", "failed")])
    for ax in axes.flat:
        ax.set_visible(False)
    for i, s in enumerate(schemes):
        for j, d in enumerate(depths):
            ax = axes[i // per_row, (i % per_row) * len(depths) + j]
            ax.set_visible(True)
            data = np.zeros((len(rows), len(lrs)))
            for a, (w, dt) in enumerate(rows):
                for b, lr in enumerate(lrs):
                    c = by.get((s, d, w, dt, lr))
                    data[a, b] = codes[None if c is None else c.stable]
                    if c is not None:
                        n = [o for o in c.outcomes().values() if o != "missing"]
                        tag = ("NaN" if "diverged" in n else "") + (f"{len(n)}" if len(n) > 1 else "")
                        ax.text(b, a, tag, ha="center", va="center", fontsize=5, color="white")
            ax.imshow(data, cmap=cmap, vmin=0, vmax=2, aspect="auto")
            ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs] if i // per_row == nrow - 1 else [],
                          fontsize=5, rotation=90)
            names = [f"wu {w}" + ("" if dt == 1.0 else f" dt {dt:g}") for w, dt in rows]
            ax.set_yticks(range(len(rows)), names if j == 0 else [], fontsize=5)
            ax.set_title(f"{label(s)}, {d}L" if j == 0 else f"{d}L", fontsize=6.5,
                         color=_colour(s) if j == 0 else "black")
            ax.grid(False)
    keys = ("trained", "failed", "not run")
    fig.legend(handles=[Patch(color=style.OUTCOME_COLORS[k], label=k) for k in keys],
               loc="outside upper center", ncol=3, fontsize=7)
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
