"""The atlas's grid (lrs, warm-ups, depths, seeds, shared lr), read from the sweeper params of
configs/experiment/atlas_SCALE.yaml, its half-decade lr grid (the LR sensitivity's, Wortsman et al.
2023: the lr sweeper param of atlas_lrs_SCALE.yaml, where the scale has one) and its cells' run
length (atlas_SCALE.yaml's max_update): one home for the driver and the figure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lnexp.errors import UserError


@dataclass(frozen=True)
class Grid:
    """A value: the plan's rules take the grid they bisect, so that a second grid (another lr
    spacing) is another value, not another code path."""

    lrs: tuple[float, ...]
    warmups: tuple[int, ...]
    depths: tuple[int, ...]
    seeds: tuple[int, ...]
    shared_lr: float
    # the half-decade grid the LR sensitivity is measured over (() where the scale has none): a cell
    # at one of its lrs is a cell like any other (the shared lr's are both grids' points)
    sensitivity_lrs: tuple[float, ...] = ()

    @property
    def shared(self) -> int:
        return self.lrs.index(self.shared_lr)

    @property
    def all_lrs(self) -> tuple[float, ...]:
        """Every lr a cell of the atlas may have: both grids'."""
        return tuple(sorted(set(self.lrs) | set(self.sensitivity_lrs)))

    def on_grid(self, lr: float) -> float | None:
        """The grid's lr that ``lr`` is (as a run's config wrote it), or None."""
        return next((x for x in self.all_lrs if math.isclose(x, lr, rel_tol=1e-6)), None)


def experiment_name(scale: str) -> str:
    return f"atlas_{scale}"


def sensitivity_experiment(scale: str) -> str:
    """The experiment holding atlas_SCALE's half-decade lr grid (its runs are atlas_SCALE's runs)."""
    return f"atlas_lrs_{scale}"


def experiments(scale: str) -> list[str]:
    """The experiments whose runs are the atlas's: atlas_SCALE, its dt column atlas_dt_SCALE and,
    where the scale has one, its half-decade grid atlas_lrs_SCALE."""
    lrs = sensitivity_experiment(scale)
    return [experiment_name(scale), f"atlas_dt_{scale}", *([lrs] if _config(lrs).is_file() else [])]


def _config(name: str) -> Path:
    from lnexp.names import CONFIG_DIR

    return Path(CONFIG_DIR) / "experiment" / f"{name}.yaml"


def _values(v: object) -> list[str]:
    """A sweep's values; group names are quoted for Hydra (depth: "'6','18'")."""
    return [x.strip().strip("'\"") for x in str(v).split(",") if x.strip()]


def _experiment(scale: str, name: str | None = None) -> dict:
    """configs/experiment/atlas_SCALE.yaml (or NAME.yaml), as plain values."""
    from omegaconf import OmegaConf

    path = _config(name or experiment_name(scale))
    if not path.is_file():
        raise UserError(f"no {path}: use --scale mini, gpu or paper")
    doc = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(doc, dict)
    return doc


def _params(doc: dict) -> dict:
    return doc.get("hydra", {}).get("sweeper", {}).get("params", {})


def sensitivity_lrs(scale: str) -> tuple[float, ...]:
    """The half-decade lr grid of atlas_lrs_SCALE.yaml; () where the scale has no such file."""
    name = sensitivity_experiment(scale)
    if not _config(name).is_file():
        return ()
    return tuple(sorted(float(x) for x in _values(_params(_experiment(scale, name))["lr"])))


def run_length(scale: str) -> int:
    """The updates a cell of atlas_SCALE trains (its max_update)."""
    return int(_experiment(scale)["max_update"])


def read_grid(scale: str, shared_lr: float | None = None) -> Grid:
    """The grid from configs/experiment/atlas_SCALE.yaml's sweeper params."""
    params = _params(_experiment(scale))
    lrs = tuple(sorted(float(x) for x in _values(params["lr"])))
    shared = lrs[1] if shared_lr is None and len(lrs) > 1 else (shared_lr or lrs[0])
    match = [lr for lr in lrs if math.isclose(lr, shared, rel_tol=1e-6)]
    if not match:
        raise UserError(f"--shared-lr {shared:g} is not on the grid ({', '.join(f'{x:g}' for x in lrs)})")
    return Grid(
        lrs,
        tuple(int(x) for x in _values(params["warmup"])),
        tuple(int(x) for x in _values(params.get("depth", "6"))),
        tuple(int(x) for x in _values(params["seed"])),
        match[0],
        sensitivity_lrs(scale),
    )
