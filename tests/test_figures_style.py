"""The schemes' colours: one per scheme, readable on white, told apart from each other."""

from __future__ import annotations

import itertools
import math

from matplotlib.colors import to_rgb

from lnexp.figures import style
from lnexp.names import PLACEMENTS


def _linear(v: float) -> float:
    return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4


def contrast_on_white(colour: str) -> float:
    """WCAG 2 contrast ratio against white: 1.05 / (relative luminance + 0.05)."""
    r, g, b = map(_linear, to_rgb(colour))
    return 1.05 / (0.2126 * r + 0.7152 * g + 0.0722 * b + 0.05)


def lab(colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour."""
    r, g, b = map(_linear, to_rgb(colour))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    f = lambda t: t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116  # noqa: E731
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_every_scheme_has_its_own_colour():
    colours = [style.COLORS[p] for p in PLACEMENTS]
    assert len(set(colours)) == len(colours), "two schemes share a colour: give one its own about.color"
    assert set(PLACEMENTS) <= set(style.LABELS)


def test_scheme_colours_read_on_white_and_differ():
    """Names are written in these colours: 3:1 at least (tab20's pale half, used before: 1.58:1 for
    LN Scaling). Two colours at least 30 apart in CIE Lab (delta E 1976; the palette's closest
    pair: 31.4)."""
    colours = {p: style.COLORS[p] for p in PLACEMENTS}
    low = {p: round(contrast_on_white(c), 2) for p, c in colours.items() if contrast_on_white(c) < 3.0}
    assert not low
    close = [(a, b, round(math.dist(lab(colours[a]), lab(colours[b])), 1))
             for a, b in itertools.combinations(colours, 2)
             if math.dist(lab(colours[a]), lab(colours[b])) < 30.0]
    assert not close


def test_epoch_axes_tick_whole_epochs_for_a_one_epoch_run():
    """matplotlib's integer locator falls back to 0.945, 0.96, ... when one epoch is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, bleu_ax) = plt.subplots(1, 2)
    for ax in (loss_ax, bleu_ax):
        ax.plot([1], [7.0], marker="o")
    style.epoch_panels(loss_ax, bleu_ax, "(a)")
    fig.canvas.draw()
    lo, hi = loss_ax.get_xlim()
    shown = [t for t in loss_ax.get_xticks() if lo <= t <= hi]
    plt.close(fig)
    assert shown == [1.0]
