"""One plot style for every figure: series named as in the paper, same colours everywhere."""

from __future__ import annotations

from pathlib import Path

from lnexp.errors import cannot_write
from lnexp.rundir import write_with

# The atlas's stability maps: a cell where every seed trained, one where a seed failed, one not run
OUTCOME_COLORS = {"trained": "#4daf4a", "failed": "#e41a1c", "not run": "#dddddd"}


def _scheme_styles() -> tuple[dict[str, str], dict[str, str]]:
    """Each scheme's colour and label, as its configs/placement YAML states them (``about``), so that
    a scheme added as a YAML is drawn in every figure with no change here."""
    from lnexp.names import PLACEMENTS
    from lnexp.scheme import about

    shown = {p: about(p) for p in PLACEMENTS}
    return {p: a["color"] for p, a in shown.items()}, {p: a["label"] for p, a in shown.items()}


COLORS, LABELS = _scheme_styles()


def setup():
    """Headless matplotlib with lnexp's rc settings; returns pyplot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "figure.dpi": 120, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 10,
        "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8, "legend.frameon": False,
        "axes.spines.top": False, "axes.spines.right": False, "lines.linewidth": 1.6,
    })
    return plt


def epoch_panels(loss_ax, bleu_ax, title: str) -> None:
    """Titles, labels and whole-epoch ticks of a (validation loss, BLEU) pair of panels."""
    from matplotlib.ticker import MaxNLocator

    loss_ax.set(title=f"{title}: validation loss", xlabel="epoch", ylabel="valid loss (bits/token)")
    bleu_ax.set(title=f"{title}: BLEU", xlabel="epoch", ylabel="valid BLEU")
    for ax in (loss_ax, bleu_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # whole epochs, one run of 1 too


def save(fig, out_dir: Path, name: str, note: str | None = None) -> list[Path]:
    """Write NAME.png and NAME.pdf (atomically), then close the figure (pyplot keeps every open
    one alive: figure commands called in one process, as in the tests, would pile them up);
    ``note`` goes under the figure (scale, data)."""
    import matplotlib.pyplot as plt

    if note:  # under everything drawn (tick labels reach the figure's edge in small multiples)
        lowest = fig.get_tightbbox(fig.canvas.get_renderer()).y0 / fig.get_figheight()
        fig.text(0.01, min(lowest, 0.0) - 0.005, note, fontsize=7, color="0.35", ha="left", va="top")
    paths = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for ext in ("png", "pdf"):
            final = out_dir / f"{name}.{ext}"
            write_with(final, lambda tmp: fig.savefig(tmp, bbox_inches="tight"), suffix=f".{ext}")
            paths.append(final)
    except OSError as e:
        raise cannot_write(e, "pass --out a folder you can write") from None
    finally:
        plt.close(fig)
    return paths
