"""One plot style for every figure: series named as in the paper, same colours everywhere."""

from __future__ import annotations

from pathlib import Path

from lnexp.errors import cannot_write
from lnexp.rundir import write_with

COLORS = {"post_ln": "#d62728", "pre_ln": "#1f77b4", "peri_ln": "#2ca02c", "deepnorm": "#9467bd"}
LABELS = {"post_ln": "Post-LN", "pre_ln": "Pre-LN", "peri_ln": "Peri-LN", "deepnorm": "DeepNorm",
          "admin": "Admin", "b2t": "B2T", "hybridnorm": "HybridNorm", "ln_scaling": "LN Scaling",
          "mix_ln": "Mix-LN",
          "normformer": "NormFormer", "olmo2": "OLMo-2", "qk_norm": "QK-norm", "rezero": "ReZero",
          "resi_dual": "ResiDual", "sandwich_ln": "Sandwich-LN", "sub_ln": "Sub-LN", "t_fixup": "T-Fixup",
          "b2t_noinit": "B2T (no init)", "qk_layernorm": "QK-LayerNorm",
          "rezero_per_sublayer": "ReZero per sub-layer"}
# The atlas's stability maps: a cell where every seed trained, one where a seed failed, one not run
OUTCOME_COLORS = {"trained": "#4daf4a", "failed": "#e41a1c", "not run": "#dddddd"}


# The other schemes' colours, in lnexp.names.PLACEMENTS' order. Scheme names are written in these
# colours (map titles, tick labels), so each stands out on white at 3:1 at least (tab20's pale half
# did not: 1.6:1). Picked greedily among matplotlib's XKCD colours of contrast 3:1 to 8:1, each the
# farthest in CIE Lab from those above it and COLORS' four (tests/test_figures_style.py checks both).
# The last three (no XKCD colour was 30 apart from the others any more) the same way from the sRGB
# grid of step 8.
ZOO_PALETTE = ("#152eff", "#876e4b", "#ff08e8", "#ff0789", "#0f9b8e", "#c87606", "#a8415b",
               "#0165fc", "#929901", "#a00498", "#947e94", "#2b5d34", "#c760ff",
               "#903818", "#305860", "#e060b0")


def _zoo_styles() -> None:
    """The schemes without a fixed colour get one of ZOO_PALETTE (in lnexp.names.PLACEMENTS' order,
    so a scheme's colour is the same in every figure) and a label from their name."""
    from lnexp.names import PLACEMENTS

    rest = [p for p in PLACEMENTS if p not in COLORS]
    for i, p in enumerate(rest):
        COLORS[p] = ZOO_PALETTE[i % len(ZOO_PALETTE)]
        LABELS.setdefault(p, p.replace("_ln", "-LN").replace("_", " "))


_zoo_styles()


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
