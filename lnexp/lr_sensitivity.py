"""``lnexp results --lr-sensitivity``: Wortsman et al.'s learning-rate sensitivity
(lnexp.stats.lr_sensitivity) of every arm and seed of a folder of runs, for a user's own sweep
(``lnexp train -m lr=1e-4,3e-4,1e-3,3e-3 placement=pre_ln,post_ln``) as for the atlas's grid.

An *arm* is what the runs vary besides the lr and the seed (read from their resolved configs, so
that a run at the default lr joins its arm); the *grid* is every lr of the folder. For each arm and
seed: the final validation loss of each lr (the last epoch's; a diverged run's counts as not
finite), the loss at initialisation (``loss_0``: the first update's training loss in updates.csv,
computed before any step), ``loss*``, and the measure. An lr of the grid that an arm and seed lack,
or whose run has not finished, is named as missing: the measure is then over fewer points.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lnexp import run_status
from lnexp.plural import count
from lnexp.results import Run, _fmt, _leaves
from lnexp.rundir import read_updates, run_paths
from lnexp.stats import LrSensitivity, lr_sensitivity, summarise

NOT_ARM = ("lr", "seed", "scale.lr")  # what a grid point varies, not the arm
SKIP = (".about.",)  # descriptive text of a config group (a scheme's label, colour, paper)


def loss_at_init(run: Run) -> float:
    """The first update's training loss (bits/token): the model's loss at initialisation on the
    first batch, before any step; nan where updates.csv has no first update."""
    rows = read_updates(run_paths(run.dir)["updates"])
    first = next((r for r in rows if str(r.get("update")) == "1"), None)
    try:
        return float(first["loss"]) if first else math.nan
    except (TypeError, ValueError):
        return math.nan


def final_loss(run: Run) -> float | None:
    """The run's final validation loss; nan if it diverged; None if it has not finished."""
    if run.state not in run_status.FINAL:
        return None
    if run.state == "diverged":
        return math.nan
    losses = run.series("valid_loss")
    return losses[-1] if losses else math.nan


def arm_keys(runs: list[Run]) -> list[str]:
    """The config keys that tell arms apart: those that vary, but the lr, the seed and text; of a
    config group whose name varies (placement.name), the name alone."""
    leaves = [_leaves(r.config) for r in runs]
    keys = sorted({k for d in leaves for k in d})
    keys = [k for k in keys if k not in NOT_ARM and not any(s in f".{k}." for s in SKIP)
            and len({d.get(k) for d in leaves}) > 1]
    named = {k.removesuffix(".name") for k in keys if k.endswith(".name")}
    return [k for k in keys if k.endswith(".name") or k.split(".")[0] not in named]


@dataclass(frozen=True)
class ArmSeed:
    arm: Any  # "key=value, ..." of arm_keys ("all runs"), or what ``arm_of`` gave (its .label)
    seed: Any
    result: LrSensitivity
    final: dict[float, float]  # each lr's final valid loss (nan: diverged)
    init: dict[float, float]  # each lr's loss at initialisation

    @property
    def label(self) -> str:
        return str(getattr(self.arm, "label", self.arm))


def measure(runs: list[Run], arm_of: Callable[[Run], Any] | None = None,
            grid: list[float] | None = None) -> tuple[list[float], list[ArmSeed]]:
    """The lr grid, and the measure of each arm and seed over it. ``arm_of``: a run's arm (the
    atlas's: scheme, warm-up, depth, dt); by default the config values that vary but the lr and the
    seed. ``grid``: the lrs (the atlas's half-decade grid: a run at another lr is left out, one the
    grid has and no run does is missing); by default every lr of the runs."""
    if arm_of is None:
        keys = arm_keys(runs)

        def arm_of(run: Run) -> str:
            leaves = _leaves(run.config)
            return ", ".join(f"{k.removesuffix('.name')}={_fmt(_plain(leaves.get(k)))}"
                             for k in keys) or "all runs"
    if grid is None:
        grid = sorted({float(r.get("lr")) for r in runs if r.get("lr") is not None})
    groups: dict[tuple[Any, Any], dict[float, Run]] = {}
    for run in runs:
        lr = _on(grid, run.get("lr"))
        if lr is not None:
            groups.setdefault((arm_of(run), run.get("seed")), {})[lr] = run
    out = []
    for (arm, seed), by_lr in sorted(groups.items(), key=lambda kv: (str(getattr(kv[0][0], "label",
                                                                                 kv[0][0])),
                                                                      str(kv[0][1]))):
        final, init = {}, {}
        for lr, run in by_lr.items():
            loss = final_loss(run)
            if loss is None:
                continue
            final[lr], init[lr] = loss, loss_at_init(run)
        out.append(ArmSeed(arm, seed, lr_sensitivity(final, init, grid), final, init))
    return grid, out


def _on(grid: list[float], lr: Any) -> float | None:
    """The grid's lr that a run's lr is (as its config wrote it), or None."""
    if lr is None:
        return None
    return next((x for x in grid if math.isclose(x, float(lr), rel_tol=1e-6)), None)


def _plain(text: Any) -> Any:
    """A leaf as _leaves wrote it (JSON text), back to its value for printing."""
    import json

    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def table(grid: list[float], rows: list[ArmSeed]) -> str:
    """One line per arm and seed, then one per arm over its seeds (mean ± 95% t-interval)."""
    head = ["arm", "seed", "lrs", "best lr", "loss*", "sensitivity", "capped", "missing"]
    cells = [head]
    for r in rows:
        s = r.result
        cells.append([r.label, _fmt(r.seed), f"{len(s.lrs)}/{len(grid)}",
                      _fmt(s.best_lr) if s.lrs else "-", _num(s.best), _num(s.value),
                      ",".join(_fmt(x) for x in s.capped) or "-",
                      ",".join(_fmt(x) for x in s.missing) or "-"])
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    arms: dict[str, list[float]] = {}
    for r in rows:
        if r.result.complete:
            arms.setdefault(r.label, []).append(r.result.value)
    if arms:
        lines += ["", "over seeds (complete grids only): mean ± half-width of the 95% t-interval"]
        lines += [f"  {arm}: {summarise(vals).text(3)}" for arm, vals in sorted(arms.items())]
    return "\n".join(lines)


def _num(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.3f}"


def report(runs: list[Run]) -> str:
    """What ``lnexp results --lr-sensitivity`` prints for these runs."""
    grid, rows = measure(runs)
    if len(grid) < 2:
        return (f"{count(len(runs), 'run')} at {len(grid)} lr: the LR sensitivity needs a sweep over lrs, "
                "e.g. lnexp train -m lr=1e-4,3e-4,1e-3,3e-3,1e-2")
    partial = sum(not r.result.complete for r in rows)
    return "\n".join([
        f"LR sensitivity (Wortsman et al. 2023): mean over the grid of min(final valid loss, loss at "
        f"init) - loss*, bits/token; grid {', '.join(_fmt(x) for x in grid)}",
        table(grid, rows),
        *([f"{partial} of {len(rows)} arm-seeds lack lrs of the grid (missing: not run or not "
           "finished): their measure is over fewer points"] if partial else []),
    ])
