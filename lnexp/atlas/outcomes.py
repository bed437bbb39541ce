"""What the atlas trains and reads from a run, defined once for the plan, the driver, the claims,
the launchers and the figures: a :class:`Cell` (one run: an arm at one lr with one seed, and its
``lnexp train`` command line), a run's outcome (:func:`outcome`, the one place a run's status is
read), the arm and lr it belongs to, the per-run measures the claims compare (:func:`measure`), the
runs of one arm at one lr over seeds (:class:`Seeds`: stable when every finished seed trained) and
an arm's largest stable lr.

A run ends ``trained``, ``plateau`` (its validation NLL still at the unigram entropy, see
lnexp/train/divergence.py) or ``diverged`` (NaN/inf loss or gradient, or a non-finite valid loss);
a run not finished yet (running, failed, pending) is ``missing`` and leaves its cell as it was.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lnexp.results import Run
from lnexp.run_status import ATLAS_OUTCOMES as OUTCOMES
from lnexp.run_status import atlas_outcome
from lnexp.rundir import run_paths

FAILED = ("plateau", "diverged")
SENSITIVITY = "lr_sensitivity"  # the measure over an lr grid (Wortsman et al. 2023), not over one run


def final(run: Run, key: str) -> float:
    vals = run.series(key)
    return vals[-1] if vals else math.nan


def outcome(run: Run) -> str:
    """trained | plateau | diverged | missing: the one reading of a run's status in the atlas
    (lnexp.run_status.atlas_outcome of its status and last validation loss)."""
    return atlas_outcome(run.state, final(run, "valid_loss") if run.metrics else None)


def stable_of(outcomes: Iterable[str]) -> bool | None:
    """True: every finished seed trained; False: one plateaued or diverged; None: none finished."""
    done = [o for o in outcomes if o != "missing"]
    if not done:
        return None
    return all(o == "trained" for o in done)


@dataclass(frozen=True, order=True)
class Scheme:
    """A placement with a norm (the norm is its own group, combinable with any placement)."""

    placement: str
    norm: str = "layernorm"

    @property
    def label(self) -> str:
        return self.placement if self.norm == "layernorm" else f"{self.placement}+{self.norm}"

    @classmethod
    def of(cls, label: str) -> Scheme:
        p, _, n = label.partition("+")
        return cls(p, n or "layernorm")


@dataclass(frozen=True, order=True)
class Arm:
    """What a cell varies but the lr and the seed: scheme, warm-up, depth, residual step dt."""

    scheme: Scheme
    warmup: int
    depth: int
    dt: float = 1.0

    @property
    def label(self) -> str:
        w = "no warm-up" if self.warmup == 0 else f"warm-up {self.warmup}"
        dt = "" if self.dt == 1.0 else f", dt {self.dt:g}"
        return f"{self.scheme.label}, {self.depth}+{self.depth}, {w}{dt}"


def lr_text(lr: float) -> str:
    """An lr as a command line writes it: its shortest form that reads back as the same number."""
    short = f"{lr:g}"
    return short if float(short) == lr else repr(float(lr))


@dataclass(frozen=True, order=True)
class Cell:
    """One run of the atlas: an arm at one lr (a value: a grid's index is the grid's business) with
    one seed."""

    arm: Arm
    lr: float
    seed: int

    # the keys a cell's command line sets, in its order (residual_scale where dt is not 1)
    KEYS: ClassVar = ("experiment", "placement", "norm", "depth", "lr", "warmup", "seed", "residual_scale")

    def overrides(self, experiment: str | None = None) -> list[str]:
        """The cell's ``lnexp train`` overrides: ``experiment`` (None: none), its scheme, depth, lr,
        warm-up, seed and dt; the overrides every cell of an atlas gets follow them."""
        a = self.arm
        values = (experiment, a.scheme.placement, a.scheme.norm, a.depth, lr_text(self.lr), a.warmup,
                  self.seed, None if a.dt == 1.0 else f"{a.dt:g}")
        return [f"{k}={v}" for k, v in zip(self.KEYS, values, strict=True) if v is not None]

    @property
    def label(self) -> str:
        return f"{self.arm.label}, lr {self.lr:g}, seed {self.seed}"

    def doc(self) -> dict[str, Any]:
        """The cell as atlas_plan.json lists it."""
        a = self.arm
        return {"scheme": a.scheme.label, "placement": a.scheme.placement, "norm": a.scheme.norm,
                "warmup": a.warmup, "depth": a.depth, "lr": self.lr, "seed": self.seed, "dt": a.dt}


def arm_of(run: Run) -> Arm:
    return Arm(Scheme(str(run.get("placement.name")), str(run.get("norm.name", "layernorm"))),
               int(run.get("warmup")), int(run.get("depth.encoder_layers") or 6),
               float(run.get("residual_scale", 1.0)))


# --- per-run measures -----------------------------------------------------------------------------


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
        at_end = {int(r["layer"]): math.sqrt(max(float(r["h_sq_norm_per_d"]), 0.0))
                  for r in rs if int(r["update"]) == last}
        deep = set(layers[-max(1, len(layers) // 3):])
        g = [math.hypot(float(r["w1_grad_norm"]), float(r["w2_grad_norm"]))
             for r in rs if int(r["layer"]) in deep]
        g = [x for x in g if math.isfinite(x)]
        out[side] = {"first": at_end.get(layers[0], math.nan), "last": at_end.get(layers[-1], math.nan),
                     "grad": sum(g) / len(g) if g else math.nan}
    return out


MEASURES = {  # name -> (what it is, unit)
    "valid_loss": ("final valid loss", "bits/token"),
    # not one run's: a seed's runs over the half-decade lr grid (sensitivity_by_seed)
    SENSITIVITY: ("LR sensitivity over the half-decade grid", "bits/token"),
    "last_rms.encoder": ("encoder last-layer hidden-state RMS", "log2"),
    "last_rms.decoder": ("decoder last-layer hidden-state RMS", "log2"),
    "deep_grad.encoder": ("encoder FFN gradient norm, last third of the layers", "log2"),
    "deep_grad.decoder": ("decoder FFN gradient norm, last third of the layers", "log2"),
}


def measure(run: Run, name: str) -> float:
    """One of MEASURES for a run whose loss is finite (nan otherwise): ratios are compared as log2.
    SENSITIVITY is a seed's over its grid, not a run's: :func:`sensitivity_by_seed`."""
    if name == SENSITIVITY:
        raise ValueError(f"{SENSITIVITY} is measured over a seed's lr grid: use sensitivity_by_seed")
    loss = final(run, "valid_loss")
    if not math.isfinite(loss):
        return math.nan
    if name == "valid_loss":
        return loss
    kind, side = name.split(".")
    v = norms_of(run).get(side, {}).get("last" if kind == "last_rms" else "grad", math.nan)
    return math.log2(v) if math.isfinite(v) and v > 0 else math.nan


# --- the runs of one arm at one lr ---------------------------------------------------------------


@dataclass
class Seeds:
    """The runs of one arm at one lr, one per seed (the cells of that arm and lr that ran)."""

    arm: Arm
    lr: float
    runs: list[Run] = field(default_factory=list)

    def outcomes(self) -> dict[int, str]:
        return {int(r.get("seed")): outcome(r) for r in self.runs}

    @property
    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        for o in self.outcomes().values():
            out[o] += 1
        return out

    @property
    def finished(self) -> int:
        return sum(o != "missing" for o in self.outcomes().values())

    @property
    def trained(self) -> int:
        return self.counts["trained"]

    @property
    def stable(self) -> bool | None:
        return stable_of(self.outcomes().values())

    def by_seed(self, name: str) -> dict[int, float]:
        """{seed: measure} of the finished runs with a finite value."""
        vals = {int(r.get("seed")): measure(r, name) for r in self.runs if outcome(r) != "missing"}
        return {s: v for s, v in vals.items() if math.isfinite(v)}

    def losses(self) -> list[float]:
        return list(self.by_seed("valid_loss").values())

    def row(self) -> dict[str, Any]:
        a, c = self.arm, self.counts
        return {"scheme": a.scheme.label, "depth": a.depth, "warmup": a.warmup, "dt": a.dt, "lr": self.lr,
                "seeds": len(self.runs), **{o: c[o] for o in OUTCOMES}, "stable": self.stable}


SeedsAt = dict[tuple[Arm, float], Seeds]  # (arm, lr) -> its runs


def seeds_at(runs: Iterable[Run]) -> SeedsAt:
    """The runs grouped by arm and lr."""
    out: SeedsAt = {}
    for r in runs:
        a, lr = arm_of(r), float(r.get("lr"))
        out.setdefault((a, lr), Seeds(a, lr)).runs.append(r)
    return dict(sorted(out.items()))


def sensitivity_by_seed(got: SeedsAt, arm: Arm, lrs: tuple[float, ...]) -> dict[int, float]:
    """{seed: the arm's LR sensitivity over ``lrs``} for each seed whose run at every lr has finished
    (a seed of the grid is one seed of every lr: common random numbers); a seed that lacks an lr
    has none. The measure is lnexp.lr_sensitivity's: each run's final valid loss (a diverged run's
    not finite), capped at its loss at initialisation."""
    from lnexp.lr_sensitivity import final_loss, loss_at_init
    from lnexp.stats import lr_sensitivity

    per_lr = [{int(r.get("seed")): r for r in got[(arm, lr)].runs} if (arm, lr) in got else {} for lr in lrs]
    seeds = set.intersection(*(set(d) for d in per_lr)) if lrs else set()
    out = {}
    for s in sorted(seeds):
        runs = [d[s] for d in per_lr]
        final = [final_loss(r) for r in runs]
        if any(f is None for f in final):  # not finished
            continue
        value = lr_sensitivity(dict(zip(lrs, final, strict=True)),
                               {lr: loss_at_init(r) for lr, r in zip(lrs, runs, strict=True)}, lrs)
        if value.complete and math.isfinite(value.value):
            out[s] = value.value
    return out


def boundary(states: list[bool | None]) -> tuple[int, int]:
    """(lo, hi) over an arm's lrs by increasing index (stable, failed, or None: not known): hi the
    first failure's index (len(states): none), lo the largest index stable below it (-1: none).
    The largest stable lr lies between them: the plan bisects there, the figures draw it."""
    hi = next((i for i, s in enumerate(states) if s is False), len(states))
    return max((i for i in range(hi) if states[i] is True), default=-1), hi


def largest_stable(grid: SeedsAt, lrs: list[float], arm: Arm) -> dict[str, Any]:
    """Largest lr stable with every lower *measured* lr stable (bisection leaves gaps): ``known``
    once a failure is seen right above it or it is the grid's top; ``first_fail``: the lowest
    failing lr."""
    lo, hi = boundary([grid[(arm, lr)].stable if (arm, lr) in grid else None for lr in lrs])
    first_fail = lrs[hi] if hi < len(lrs) else None
    if lo < 0:
        return {"lr": None, "top": False, "known": hi == 0, "first_fail": first_fail}
    top = hi == len(lrs) and lo == len(lrs) - 1
    return {"lr": lrs[lo], "top": top, "known": top or hi == lo + 1, "first_fail": first_fail}
