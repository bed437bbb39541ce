"""The LR-sensitivity figure in Wortsman et al.'s style (2023, Fig. 1 and appendix B: the measure
is always shown beside its curves): final validation loss against the peak lr, one line per scheme
(the mean over seeds), a panel per depth and warm-up, the loss at initialisation that caps a run
drawn dashed; beside them each arm's sensitivity with its 95% t-interval over seeds.

Its rows come from lnexp.lr_sensitivity.measure (one per arm and seed); ``lnexp figure atlas``
draws it for the atlas's half-decade grid, and ``curve_rows``/``sensitivity_rows`` are its CSVs.
A scheme that changes what the lr means (``LR_MEANING``) is marked: Wortsman et al.'s appendix B
says the measure says little there.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from lnexp.stats import summarise

CURVE_FIELDS = ("scheme", "depth", "warmup", "lr", "seeds", "mean_final_loss", "capped_mean",
                "mean_loss_at_init", "diverged")
SENSITIVITY_FIELDS = ("scheme", "depth", "warmup", "arm", "seeds", "complete_seeds", "mean", "ci_low",
                      "ci_high", "per_seed")
# placements whose lr is not Adam's plain step on every weight (Wortsman et al. 2023, appendix B: the
# measure says little where a scheme changes what the lr means), and how
LR_MEANING = {
    "ngpt": "nGPT renormalises its weights after each step and learns its own step sizes (eigen lrs)",
    "rezero": "ReZero's gates start at 0: the lr sets how fast each residual branch opens",
    "rezero_per_sublayer": "ReZero's gates start at 0: the lr sets how fast each residual branch opens",
}
MARK = "†"


def mark(scheme: str) -> str:
    """" †" where the scheme changes what the lr means, else ''."""
    return f" {MARK}" if scheme.partition("+")[0] in LR_MEANING else ""


def caveat(schemes: list[str]) -> str:
    """The note under a figure or table naming the marked schemes among ``schemes`` ('' if none)."""
    hit = sorted({s.partition("+")[0] for s in schemes} & set(LR_MEANING))
    if not hit:
        return ""
    return (f"{MARK} {', '.join(hit)} change what the lr means (Wortsman et al. 2023, appendix B: the "
            "measure says little there): " + "; ".join(dict.fromkeys(LR_MEANING[h] for h in hit)))


def _panel(arm: Any) -> tuple[int, int]:
    return int(getattr(arm, "depth", 0)), int(getattr(arm, "warmup", 0))


def _scheme(arm: Any) -> str:
    scheme = getattr(arm, "scheme", None)
    return str(getattr(scheme, "label", scheme if scheme is not None else arm))


def curve_rows(rows: list, grid: list[float]) -> list[dict[str, Any]]:
    """Per arm and lr: the mean over seeds of the final loss, raw (diverged left out) and capped
    at the loss at initialisation as the measure counts it, the mean loss at init, divergences."""
    by: dict[tuple, dict[float, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for lr, loss in r.final.items():
            by[(_scheme(r.arm), *_panel(r.arm))][lr].append((loss, r.init.get(lr, math.nan)))
    out = []
    for (scheme, depth, warmup), per_lr in sorted(by.items()):
        for lr in grid:
            pairs = per_lr.get(lr, [])
            if not pairs:
                continue
            raw = [x for x, _ in pairs if math.isfinite(x)]
            capped = [x if math.isfinite(x) and x <= c else c for x, c in pairs]
            out.append({"scheme": scheme, "depth": depth, "warmup": warmup, "lr": lr,
                        "seeds": len(pairs),
                        "mean_final_loss": statistics.fmean(raw) if raw else math.nan,
                        "capped_mean": statistics.fmean(capped),
                        "mean_loss_at_init": statistics.fmean(c for _, c in pairs),
                        "diverged": sum(not math.isfinite(x) for x, _ in pairs)})
    return out


def sensitivity_rows(rows: list) -> list[dict[str, Any]]:
    """Per arm: the sensitivity's mean and 95% t-interval over the seeds whose grid is complete."""
    by: dict[Any, list] = defaultdict(list)
    for r in rows:
        by[r.arm].append(r)
    out = []
    for arm, members in sorted(by.items(), key=lambda kv: str(getattr(kv[0], "label", kv[0]))):
        done = [m.result.value for m in members if m.result.complete]
        s = summarise(done)
        out.append({"scheme": _scheme(arm), "depth": _panel(arm)[0], "warmup": _panel(arm)[1],
                    "arm": members[0].label, "seeds": len(members), "complete_seeds": len(done),
                    "mean": s.mean, "ci_low": s.low, "ci_high": s.high,
                    "per_seed": ";".join(f"{m.seed}:{m.result.value:.4f}" for m in members)})
    return out


def colour(scheme: str) -> str:
    """The placement's colour in every figure (configs/placement's ``about``)."""
    from lnexp.figures import style

    return style.COLORS.get(scheme.partition("+")[0], "0.4")


def marker(scheme: str) -> str:
    """Another norm than LayerNorm in the same placement (pre_ln+dyt): squares."""
    return "s" if "+" in scheme else "o"


def draw(curves: list[dict[str, Any]], sens: list[dict[str, Any]]):
    """Loss against lr, a panel per (depth, warm-up), and the sensitivities beside them."""
    from lnexp.figures import style

    plt = style.setup()
    panels = sorted({(c["depth"], c["warmup"]) for c in curves})
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(3.2 * (len(panels) + 1), 3.4),
                             layout="constrained", squeeze=False)
    for ax, (depth, warmup) in zip(axes[0], panels, strict=False):
        mine = [c for c in curves if (c["depth"], c["warmup"]) == (depth, warmup)]
        for scheme in sorted({c["scheme"] for c in mine}):
            pts = [c for c in mine if c["scheme"] == scheme]
            ax.plot([c["lr"] for c in pts], [c["capped_mean"] for c in pts], marker=marker(scheme),
                    ms=3.5, lw=1.2, label=scheme + mark(scheme), color=colour(scheme))
            for c in pts:  # a lr where a seed diverged: an open marker on the capped line
                if c["diverged"]:
                    ax.plot([c["lr"]], [c["capped_mean"]], marker=marker(scheme), ms=6, mfc="white",
                            color=colour(scheme), ls="none")
        cap = statistics.fmean(c["mean_loss_at_init"] for c in mine)
        ax.axhline(cap, color="0.4", ls="--", lw=0.9, label="loss at init (cap)")
        if any(c["diverged"] for c in mine):
            ax.plot([], [], marker="o", mfc="white", color="0.4", ls="none",
                    label="a seed diverged (at its cap)")
        ax.set_xscale("log")
        w = "no warm-up" if warmup == 0 else f"warm-up {warmup}"
        ax.set(title=f"{depth}+{depth}, {w}", xlabel="peak lr", ylabel="final valid loss (bits/token)")
        ax.legend(fontsize=6, loc="upper center")
    ax = axes[0][-1]
    ok = [s for s in sens if math.isfinite(s["mean"])]
    for y, s in enumerate(ok):
        ax.plot([s["mean"]], [y], marker=marker(s["scheme"]), ms=4.5, ls="none",
                color=colour(s["scheme"]))
        if math.isfinite(s["ci_low"]):
            ax.plot([s["ci_low"], s["ci_high"]], [y, y], color="black", lw=0.8)
    ax.set_yticks(range(len(ok)), [s["arm"] + mark(s["scheme"]) for s in ok], fontsize=6)
    ax.invert_yaxis()
    ax.set(title="LR sensitivity (line: 95% t over seeds)", xlabel="bits/token")
    return fig
