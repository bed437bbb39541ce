"""The atlas's claims: each a record stated before any run (the papers and their words, our claim
with the smallest effect that matters, the cells it compares, its test), so that the cells the
driver trains (:func:`claim_cells`, :func:`needs`) and the verdicts the figure writes
(:func:`evaluate`) come from the same records.

Tests, by kind (lnexp/stats.py, on scipy and statsmodels):

- ``trains``: the seeds of a cell that trained, k of n, against a share of 1/2 (exact binomial
  test; Wilson interval per cell); not supported when the share is shown below 1/2.
- ``trains_where_fails``: arm A trains where arm B fails: Boschloo's exact test on the 2x2 table of
  trained/failed seeds (A's share greater); not supported when A is shown to fail or B to train.
- ``lower``: a measure (final valid loss, or log2 of a hidden-state RMS or gradient norm, or a
  seed's LR sensitivity over the half-decade lr grid) of A below B's, differences paired by seed
  (same seed, same data order): one-sided paired t-test; not supported when the difference is
  shown smaller than the effect the claim states.
- ``within``: |A - B| below a margin, paired by seed: TOST; not supported when shown beyond it.
- ``less_spread``: A's values vary less over seeds than B's: Levene's test, one-sided.

A claim of several comparisons (both stacks, three rescuers) holds when every one does (its p is
the largest: an intersection-union test) and is refuted by any one (the smallest, times their
number). Holm's correction runs across the claims, for the support and the refutation p-values
each. The looks are sequential (the driver adds seeds until a claim is decided) while the tests
are those of a fixed n, so the stated level is nominal: the seed cap (MAX_SEEDS, or what lnexp atlas's
budget affords: lnexp.atlas.plan.seed_cap) bounds the looks.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lnexp import stats as S
from lnexp.atlas.grid import Grid
from lnexp.atlas.outcomes import MEASURES, SENSITIVITY, Arm, Cell, Scheme, SeedsAt, sensitivity_by_seed
from lnexp.atlas.plan import Need

ALPHA = 0.05  # family-wise, over the claims (Holm)
MAX_SEEDS = 12  # seeds per arm at most, by default (lnexp atlas raises it where its budget and device
# afford more: lnexp.atlas.plan.seed_cap); a claim that needs more is left undecided, with its count
SHARES = (0.95, 0.05)  # stability's stated effect: a cell that trains in 95% of seeds, one in 5%
PRIOR_SD = {"bits/token": 0.15, "log2": 0.5}  # sd of a paired difference before PILOT pairs exist
PILOT = 3  # pairs a paired claim runs before its sd is estimated from them
STABILITY = ("trains", "trains_where_fails")
LOG2_1_5 = math.log2(1.5)
GRID = "grid"  # an At's lr: every lr of the half-decade grid (the LR sensitivity's)


@dataclass(frozen=True)
class At:
    """A cell a claim compares, stated against the grid: the scheme (label), depth (shallow or deep),
    warm-up (off or on), lr (the shared lr, x2 or x4 of it, the grid's top, or ``grid``: every lr of
    the half-decade grid, one cell each, a seed's being one seed of each) and dt."""

    scheme: str
    depth: str = "shallow"
    warmup: str = "off"
    lr: str = "shared"
    dt: float = 1.0

    def arm(self, grid: Grid) -> Arm:
        d = min(grid.depths) if self.depth == "shallow" else max(grid.depths)
        w = min(grid.warmups) if self.warmup == "off" else max(grid.warmups)
        return Arm(Scheme.of(self.scheme), w, d, self.dt)

    def lr_on(self, grid: Grid) -> float:
        """The grid's lr this cell means: its top, or the one nearest the shared lr's multiple."""
        if self.lr == "top":
            return grid.lrs[-1]
        want = grid.shared_lr * (1 if self.lr == "shared" else float(self.lr.lstrip("x")))
        return min(grid.lrs, key=lambda x: abs(math.log(x / want)))

    @property
    def over_grid(self) -> bool:
        return self.lr == GRID

    def lrs_on(self, grid: Grid) -> tuple[float, ...]:
        """The lrs of its cells: the half-decade grid's, or the one lr it means."""
        return grid.sensitivity_lrs if self.over_grid else (self.lr_on(grid),)

    def key(self, grid: Grid) -> tuple[Arm, float]:
        return self.arm(grid), self.lr_on(grid)

    def keys(self, grid: Grid) -> list[tuple[Arm, float]]:
        """(arm, lr) of each of its cells."""
        arm = self.arm(grid)
        return [(arm, lr) for lr in self.lrs_on(grid)]

    def text(self, grid: Grid) -> str:
        if self.over_grid:
            lrs = grid.sensitivity_lrs
            span = f"{lrs[0]:g}..{lrs[-1]:g}" if lrs else "none"
            return f"{self.arm(grid).label}, lrs {span} ({len(lrs)})"
        return f"{self.arm(grid).label}, lr {self.lr_on(grid):g}"

    def seeds(self, grid: Grid, got: SeedsAt) -> set[int]:
        """The seeds finished at every one of its lrs."""
        per = [{s for s, o in got[k].outcomes().items() if o != "missing"} if k in got else set()
               for k in self.keys(grid)]
        return set.intersection(*per) if per else set()

    def values(self, m: str, grid: Grid, got: SeedsAt) -> dict[int, float]:
        """{seed: measure ``m``} of its finished seeds (over the grid: each complete seed's)."""
        if self.over_grid:
            return sensitivity_by_seed(got, self.arm(grid), grid.sensitivity_lrs)
        runs = got.get(self.key(grid))
        return runs.by_seed(m) if runs else {}

    @property
    def short(self) -> str:
        """The scheme, and what else sets this cell apart in a comparison (warm-up on, dt)."""
        dt = "" if self.dt == 1.0 else f", dt {self.dt:g}"
        return self.scheme + (", warm-up" if self.warmup == "on" else "") + dt


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str  # the papers and their words
    claim: str  # ours, as tested, with the smallest effect that matters
    test: str  # trains | trains_where_fails | lower | within | less_spread
    pairs: tuple[tuple[At, At | None], ...]  # (A, B): A trains [where B fails], A lower than / within B
    measures: tuple[str, ...] = ("valid_loss",)
    effect: float = 0.0  # in the measure's unit (less_spread: a variance ratio)
    no_norm: bool = False  # the placements must have no norm anywhere (read from their configs)

    def ats(self) -> list[At]:
        return list(dict.fromkeys(a for pair in self.pairs for a in pair if a is not None))


# --- the LR-sensitivity claims' smallest effects that matter ------------------------------------------
# The pilot (2026-12-04, AMD EPYC, 2 cores; seed 101, which no claim's test uses: their seeds run
# from 1 to the seed cap, at most 50): lnexp train -m experiment=atlas_mini
# lr=1e-4,3e-4,1e-3,3e-3,1e-2,3e-2,1e-1 placement=post_ln,pre_ln warmup=0,40 depth=6 seed=101. Its
# runs' small files are kept in docs/measurements/2026-12-04-lr-sensitivity-pilot/runs; `lnexp results
# DIR --lr-sensitivity` prints these numbers (bits/token) from them:
PILOT_SENSITIVITY = {("post_ln", 0): 0.761, ("post_ln", 40): 0.629,
                     ("pre_ln", 0): 0.815, ("pre_ln", 40): 0.775}
# The rule: a claim's effect is half the difference the pilot saw in the claimed direction (half: one
# seed's difference overstates a mean one as often as not, and the claim is planned to find less),
# at least EFFECT_FLOOR (a grid-mean difference of 0.1 bit: one of the 7 lrs ending 0.7 bit apart,
# the margin the atlas already calls parity for a final loss). A claim whose arms the pilot lacks
# (qk_layernorm, 18+18, peri_ln) takes the smallest effect of the piloted ones: where nothing was
# measured no larger effect is assumed.
EFFECT_FLOOR = 0.1


def _pilot_effect(*pairs: tuple[tuple[str, int], tuple[str, int]]) -> float:
    """Half the pilot's smallest difference (B - A) over the pairs, at least EFFECT_FLOOR."""
    gaps = [PILOT_SENSITIVITY[b] - PILOT_SENSITIVITY[a] for a, b in pairs]
    return max(EFFECT_FLOOR, min(gaps) / 2) if all(math.isfinite(g) for g in gaps) else EFFECT_FLOOR


SENS_WARMUP = _pilot_effect((("post_ln", 40), ("post_ln", 0)), (("pre_ln", 40), ("pre_ln", 0)))
SENS_PRE_POST = _pilot_effect((("pre_ln", 0), ("post_ln", 0)))
SENS_UNPILOTED = min(SENS_WARMUP, SENS_PRE_POST)
BOTH = ("encoder", "decoder")
LAST_RMS = tuple(f"last_rms.{s}" for s in BOTH)
CLAIMS = (
    Claim("atlas_deep_post_ln_rescued",
          "18L-18L Post-LN diverges on WMT'14 En-De where Admin trains (Liu et al. 2020); DeepNorm "
          "trains 1,000 layers (Wang et al. 2022); B2T trains deep Post-LN (Takase et al. 2022)",
          "at the deep setting with warm-up, Post-LN fails where Admin, DeepNorm and B2T each train",
          "trains_where_fails",
          tuple((At(p, "deep", "on"), At("post_ln", "deep", "on")) for p in ("admin", "deepnorm", "b2t"))),
    Claim("atlas_no_norm_no_warmup",
          "ReZero trains without LayerNorm and warm-up (Bachlechner et al. 2020); T-Fixup trains "
          "without LayerNorm and warm-up (Huang et al. 2020)",
          "ReZero and T-Fixup, with no norm anywhere, each train without warm-up", "trains",
          ((At("rezero"), None), (At("t_fixup"), None)), no_norm=True),
    Claim("atlas_dyt_parity",
          "DyT matches LayerNorm as a drop-in replacement (Zhu et al. 2025: parity across ViT, "
          "ConvNeXt, DiT and LLaMA)",
          "DyT ends within 0.1 bit of LayerNorm's final valid loss, same placement (Pre-LN, Post-LN), "
          "warm-up and lr", "within",
          tuple((At(f"{p}+dyt", warmup=w), At(p, warmup=w)) for p in ("pre_ln", "post_ln")
                for w in ("off", "on")),
          effect=0.1),
    Claim("atlas_ln_scaling_growth",
          "LayerNorm Scaling (1/sqrt(l)) curbs the output variance growth of deep Pre-LN layers "
          "(Sun et al. 2025)",
          "deep, no warm-up: LayerNorm Scaling's last-layer hidden-state RMS is below Pre-LN's in both "
          "stacks; smallest effect that matters 1.5x", "lower",
          ((At("ln_scaling", "deep"), At("pre_ln", "deep")),), LAST_RMS, LOG2_1_5),
    Claim("atlas_mix_ln_gradients",
          "Mix-LN gives deeper layers larger, more uniform gradients than Pre-LN (Li et al. 2024)",
          "deep, no warm-up: the FFN gradient norm of the last third of the layers is larger with Mix-LN "
          "than with Pre-LN in both stacks; smallest effect that matters 1.5x", "lower",
          ((At("pre_ln", "deep"), At("mix_ln", "deep")),), tuple(f"deep_grad.{s}" for s in BOTH), LOG2_1_5),
    Claim("atlas_pre_ln_where_post_ln_fails",
          "Pre-LN trains without warm-up, Post-LN needs it; Pre-LN tolerates larger lrs (Xiong et al. 2020)",
          "without warm-up, at 4x the shared lr, Pre-LN trains where Post-LN fails", "trains_where_fails",
          ((At("pre_ln", lr="x4"), At("post_ln", lr="x4")),)),
    Claim("atlas_post_ln_needs_warmup",
          "Post-LN needs the warm-up stage; without it, it fails at lrs where it trains with it "
          "(Xiong et al. 2020, Fig. 2)",
          "at 2x the shared lr, Post-LN with warm-up trains where Post-LN without warm-up fails",
          "trains_where_fails", ((At("post_ln", warmup="on", lr="x2"), At("post_ln", lr="x2")),)),
    Claim("atlas_peri_stable_where_pre",
          "Peri-LN trains wherever Pre-LN does, and beyond (Kim et al. 2025)",
          "Peri-LN trains at the grid's top lr, with and without warm-up (where the first atlas saw "
          "Pre-LN train)", "trains",
          ((At("peri_ln", lr="top"), None), (At("peri_ln", warmup="on", lr="top"), None))),
    Claim("atlas_peri_higher_lr",
          "Peri-LN trains at learning rates where Pre-LN diverges (Kim et al. 2025)",
          "deep, no warm-up, at the grid's top lr: Peri-LN trains where Pre-LN fails", "trains_where_fails",
          ((At("peri_ln", "deep", lr="top"), At("pre_ln", "deep", lr="top")),)),
    Claim("atlas_peri_smaller_spread",
          "smaller spread across seeds (Kim et al. 2025; GPT-2 Pre-LN diverged in some of 5 trials)",
          "no warm-up, shared lr: Peri-LN's final valid loss varies less over seeds than Pre-LN's; "
          "smallest effect that matters: a variance 4x smaller", "less_spread",
          ((At("peri_ln"), At("pre_ln")),), effect=4.0),
    Claim("atlas_hidden_growth",
          "Pre-LN's hidden states can grow without bound, Peri-LN's at most linearly (Kan et al. 2025)",
          "no warm-up, at the grid's top lr: Peri-LN's last-layer hidden-state RMS is below Pre-LN's in "
          "both stacks; smallest effect that matters 1.5x", "lower",
          ((At("peri_ln", lr="top"), At("pre_ln", lr="top")),), LAST_RMS, LOG2_1_5),
    Claim("atlas_dt_tightens_growth",
          "a residual step dt < 1 (e.g. 0.1) tightens the hidden-state growth bounds and stabilises "
          "training (Kan et al. 2025)",
          "Pre-LN, no warm-up, at the grid's top lr: dt = 0.1 keeps the last-layer hidden-state RMS below "
          "dt = 1's in both stacks; smallest effect that matters 1.5x", "lower",
          ((At("pre_ln", lr="top", dt=0.1), At("pre_ln", lr="top")),), LAST_RMS, LOG2_1_5),
    # the LR sensitivity over the half-decade grid (Wortsman et al. 2023, section 2.2), a seed's over
    # its 7 cells; effects from the pilot above, by its rule
    Claim("atlas_lr_sens_warmup",
          "a longer warm-up lowers the LR sensitivity (Wortsman et al. 2023)",
          f"6+6: warm-up 40 lowers the LR sensitivity of Post-LN and of Pre-LN; smallest effect that "
          f"matters {SENS_WARMUP:.2g} bit", "lower",
          tuple((At(p, warmup="on", lr=GRID), At(p, lr=GRID)) for p in ("post_ln", "pre_ln")),
          (SENSITIVITY,), SENS_WARMUP),
    Claim("atlas_lr_sens_qk_layernorm",
          "qk-layernorm lowers the LR sensitivity (Wortsman et al. 2023: it curbs the attention logit "
          "growth that fails high lrs)",
          f"6+6, no warm-up: Pre-LN with qk-layernorm is less sensitive to the lr than Pre-LN; smallest "
          f"effect that matters {SENS_UNPILOTED:.2g} bit", "lower",
          ((At("qk_layernorm", lr=GRID), At("pre_ln", lr=GRID)),), (SENSITIVITY,), SENS_UNPILOTED),
    Claim("atlas_lr_sens_depth",
          "the LR sensitivity grows with depth, faster than with width (Wortsman et al. 2023)",
          f"Pre-LN, no warm-up: 18+18 is more sensitive to the lr than 6+6; smallest effect that matters "
          f"{SENS_UNPILOTED:.2g} bit", "lower",
          ((At("pre_ln", lr=GRID), At("pre_ln", "deep", lr=GRID)),), (SENSITIVITY,), SENS_UNPILOTED),
    Claim("atlas_lr_sens_pre_ln",
          "Pre-LN trains without warm-up and at larger lrs where Post-LN is sensitive to both (Xiong et "
          "al. 2020)",
          f"6+6, no warm-up: Pre-LN is less sensitive to the lr than Post-LN; smallest effect that matters "
          f"{SENS_PRE_POST:.2g} bit", "lower",
          ((At("pre_ln", lr=GRID), At("post_ln", lr=GRID)),), (SENSITIVITY,), SENS_PRE_POST),
    Claim("atlas_lr_sens_peri_ln",
          "Peri-LN is more robust than Pre-LN to the learning rate (Kim et al. 2025)",
          f"6+6, no warm-up: Peri-LN is less sensitive to the lr than Pre-LN; smallest effect that matters "
          f"{SENS_UNPILOTED:.2g} bit", "lower",
          ((At("peri_ln", lr=GRID), At("pre_ln", lr=GRID)),), (SENSITIVITY,), SENS_UNPILOTED),
)
TESTS = {
    "trains": "exact binomial test, share trained > 1/2 (Wilson intervals)",
    "trains_where_fails": "Boschloo's exact test on trained/failed seeds, one-sided (Wilson intervals)",
    "lower": "paired by seed, one-sided t-test (95% t-interval)",
    "within": "paired by seed, TOST",
    "less_spread": "Levene's test, one-sided",
}


def claim_cells(grid: Grid, claims: Iterable[Claim] = CLAIMS) -> list[tuple[Arm, float]]:
    """(arm, lr) of every cell the claims compare: their union, in claim order."""
    return list(dict.fromkeys(k for c in claims for a in c.ats() for k in a.keys(grid)))


def over_grid(claim: Claim) -> bool:
    """The claim compares LR sensitivities (its cells span the half-decade grid)."""
    return any(a.over_grid for a in claim.ats())


def claims_for(grid: Grid, claims: Iterable[Claim] = CLAIMS) -> list[Claim]:
    """The claims this grid can test: the LR-sensitivity ones only where it has a half-decade grid
    (configs/experiment/atlas_lrs_SCALE.yaml)."""
    return [c for c in claims if grid.sensitivity_lrs or not over_grid(c)]


def no_norm(placement: str) -> bool:
    """The placement's config has no norm anywhere (configs/placement/NAME.yaml)."""
    from lnexp.scheme import SWITCHES, Placement, group_file

    try:
        p = Placement.from_config(group_file("placement", placement))
    except ValueError:
        return False
    return not any(getattr(p, k) for k in (*SWITCHES, "qk_norm", "v_norm", "final_norm", "embed_norm"))


# --- one comparison -------------------------------------------------------------------------------


@dataclass
class Part:
    """One comparison of a claim (one pair, one measure): its text, support and refutation p, the
    seeds per arm it has and needs, and whether it leans to refutation."""

    text: str
    p: float
    p_refute: float
    n: int
    n_needed: int
    refuting: bool
    numbers: dict[str, Any] = field(default_factory=dict)


def _share(k: int, n: int, claimed: float) -> float:
    """The share an arm is planned at: the claim's when every seed so far agrees, else Laplace's."""
    agrees = k == n if claimed > 0.5 else k == 0
    return claimed if agrees else (k + 1) / (n + 2)


def _cell_text(label: str, k: int, n: int) -> str:
    if n == 0:
        return f"{label} not run"
    lo, hi = S.wilson(k, n)
    return f"{label} {k}/{n} trained [{lo:.2f}, {hi:.2f}]"


def _stability(claim: Claim, a: At, b: At | None, grid: Grid, got: SeedsAt, alpha: float,
               alpha_refute: float) -> Part:
    ca, cb = got.get(a.key(grid)), got.get(b.key(grid)) if b else None
    ka, na = (ca.trained, ca.finished) if ca else (0, 0)
    numbers = {"a": a.text(grid), "a_trained": ka, "a_n": na, "a_wilson": S.wilson(ka, na)}
    text = _cell_text(a.short, ka, na)
    refuting_n = S.share_n(SHARES[0], None, alpha_refute / 2)  # a contradicting arm shown the other way
    if b is None:
        leans = na > 0 and ka / na < 0.5
        n = refuting_n if leans else S.share_n(_share(ka, na, SHARES[0]), None, alpha)
        return Part(text, S.share_p(ka, na), S.share_p(ka, na, alternative="less"), na, n, leans, numbers)
    kb, nb = (cb.trained, cb.finished) if cb else (0, 0)
    numbers |= {"b": b.text(grid), "b_trained": kb, "b_n": nb, "b_wilson": S.wilson(kb, nb)}
    p = S.two_arm_p(ka, na, kb, nb)
    refute = min(1.0, 2 * min(S.share_p(ka, na, alternative="less"), S.share_p(kb, nb)))
    pa, pb = _share(ka, na, SHARES[0]), _share(kb, nb, SHARES[1])
    leans = (na > 0 and ka / na < 0.5) or (nb > 0 and kb / nb > 0.5)
    return Part(f"{text} vs {_cell_text(b.short, kb, nb)}; Boschloo p = {p:.3g}", p, refute,
                min(na, nb), refuting_n if leans else S.share_n(pa, pb, alpha), leans, numbers)


def _paired(claim: Claim, a: At, b: At, m: str, grid: Grid, got: SeedsAt, alpha: float,
            alpha_refute: float) -> Part:
    va, vb = a.values(m, grid, got), b.values(m, grid, got)
    seeds = sorted(set(va) & set(vb))
    xa, xb = [va[s] for s in seeds], [vb[s] for s in seeds]
    what, unit = MEASURES[m]
    diffs = [y - x for x, y in zip(xa, xb, strict=True)]
    sd = statistics.stdev(diffs) if len(seeds) >= PILOT else PRIOR_SD[unit]
    la, lb = (a.short, b.short) if a.short != b.short else (a.arm(grid).label, b.arm(grid).label)
    numbers = {"a": a.text(grid), "b": b.text(grid), "measure": m, "seeds": seeds,
               "a_values": [round(x, 4) for x in xa], "b_values": [round(x, 4) for x in xb]}
    if claim.test == "less_spread":
        p, refute = S.spread_p(xa, xb)
        va_, vb_ = (statistics.variance(x) if len(x) >= 2 else math.nan for x in (xa, xb))
        return Part(f"{what} variance over seeds: {la} {va_:.3g} vs {lb} {vb_:.3g} (n={len(seeds)}); "
                    f"Levene p = {p:.3g}", p, refute, len(seeds), S.spread_n(claim.effect, alpha),
                    va_ > vb_, numbers | {"a_variance": va_, "b_variance": vb_})
    if claim.test == "within":
        d = S.paired([x - y for x, y in zip(xa, xb, strict=True)])
        p, refute = S.tost(xa, xb, claim.effect)
        gap = claim.effect - abs(d.mean) if d.n else claim.effect
        n = S.paired_n(gap, sd, alpha) if gap > 0 else S.paired_n(-gap, sd, alpha_refute / 2)
        return Part(f"{what} ({unit}), {la} - {lb}: {_interval(d)}; TOST p = {p:.3g}", p, refute, d.n, n,
                    d.n > 0 and gap <= 0, numbers | {"mean": d.mean, "ci": [d.low, d.high]})
    d = S.paired([y - x for x, y in zip(xa, xb, strict=True)], claim.effect)
    side = f"{what} ({unit}), {lb} - {la}"
    leans = d.n > 0 and d.mean <= 0  # the wrong way: planned as the refutation (below the effect)
    n = S.paired_n(claim.effect - d.mean, sd, alpha_refute) if leans else S.paired_n(claim.effect, sd, alpha)
    return Part(f"{side}: {_interval(d)}; p = {d.p_above:.3g}", d.p_above, d.p_below, d.n, n, leans,
                numbers | {"mean": d.mean, "ci": [d.low, d.high]})


def _interval(d: S.Paired) -> str:
    if d.n == 0:
        return "no pair of seeds yet"
    if d.n == 1:
        return f"{d.mean:+.3g} (n=1)"
    return f"{d.mean:+.3g} [{d.low:+.3g}, {d.high:+.3g}] (n={d.n})"


def parts(claim: Claim, grid: Grid, got: SeedsAt, alpha: float) -> list[Part]:
    """Each comparison of the claim, planned at ``alpha`` (its support is the largest p of them) and
    at alpha over their number (its refutation is the smallest p times that number)."""
    if claim.test in STABILITY:
        return [_stability(claim, a, b, grid, got, alpha, alpha / len(claim.pairs)) for a, b in claim.pairs]
    k = len(claim.pairs) * len(claim.measures)
    return [_paired(claim, a, b, m, grid, got, alpha, alpha / k) for a, b in claim.pairs if b
            for m in claim.measures]


# --- every claim ----------------------------------------------------------------------------------


@dataclass
class Verdict:
    claim: Claim
    parts: list[Part]
    p: float
    p_refute: float
    p_holm: float = math.nan
    p_refute_holm: float = math.nan
    verdict: str = "undecided"  # supported | not supported | undecided
    runs_needed: int = 0  # more runs that would decide it at its stated effect (undecided only)
    cells: tuple[Cell, ...] = ()  # the next of them
    note: str = ""

    n: dict[At, int] = field(default_factory=dict)  # finished seeds per cell

    @property
    def holds(self) -> bool | None:
        return {"supported": True, "not supported": False}.get(self.verdict)

    @property
    def text(self) -> str:
        if self.verdict != "undecided":
            return self.verdict
        return self.note or f"undecided: needs {self.runs_needed} more runs"


def _next_cells(ats: list[At], n_target: int, grid: Grid, got: SeedsAt, tried: set[Cell],
                max_seeds: int = MAX_SEEDS) -> list[Cell]:
    """The cells that bring each of these arms and lrs to ``n_target`` seeds, seed by seed across
    them (the lowest seed of every arm first, so that the pairs fill evenly and an arm that lags is
    caught up before the others run ahead), seeds run or tried skipped. A seed over the half-decade
    grid is its cells at every lr (those not run yet, side by side); one whose cell was tried and
    did not finish is skipped whole."""
    groups: list[tuple[int, int, list[Cell]]] = []  # (seed, the arm's place, its cells)
    for i, a in enumerate(ats):
        arm, lrs = a.arm(grid), a.lrs_on(grid)
        done = {lr: {s for s, o in got[(arm, lr)].outcomes().items() if o != "missing"}
                if (arm, lr) in got else set() for lr in lrs}
        have = set.intersection(*done.values())
        failed = {c.seed for c in tried if c.arm == arm and c.lr in done and c.seed not in done[c.lr]}
        free = [s for s in range(1, max_seeds + 1) if s not in have and s not in failed]
        groups += [(s, i, [Cell(arm, lr, s) for lr in lrs if s not in done[lr]])
                   for s in free[: max(0, n_target - len(have))]]
    return [c for _, _, cells in sorted(groups, key=lambda g: g[:2]) for c in cells]


def evaluate(grid: Grid, got: SeedsAt, claims: Iterable[Claim] | None = None,
             tried: set[Cell] = frozenset(), alpha: float = ALPHA,  # type: ignore[assignment]
             max_seeds: int = MAX_SEEDS) -> list[Verdict]:
    """Every claim's verdict (default: each the grid can test) from the cells seen, Holm-adjusted
    across the claims, and for each one undecided the runs that would decide it (the power each test
    has at the effect its claim states, at the level Holm gives the first of the undecided claims),
    up to ``max_seeds`` seeds a cell."""
    claims = claims_for(grid) if claims is None else list(claims)
    done = {Cell(a, lr, s) for (a, lr), runs in got.items() for s, o in runs.outcomes().items()
            if o != "missing" and lr in grid.all_lrs}
    broken = {(c.arm, c.lr) for c in tried if c not in done}
    out = [_verdict(c, grid, got, alpha / len(claims)) for c in claims]
    _holm(out, alpha)
    k = max(1, sum(v.verdict == "undecided" for v in out))
    if k < len(claims):  # planned at the level Holm leaves the undecided (the p-values do not change)
        for v in out:
            v.parts = parts(v.claim, grid, got, alpha / k)
    for v in out:
        if v.verdict == "undecided" and not v.note:
            lean = [p for p in v.parts if p.refuting]
            chosen = [min(lean, key=lambda p: p.n_needed)] if lean else v.parts
            n = max((p.n_needed for p in chosen), default=0)
            ats = _ats_of(v.claim, chosen, v.parts)
            have = min((p.n for p in chosen), default=0)
            v.runs_needed = max(0, n - have) * sum(len(a.lrs_on(grid)) for a in ats)  # cells
            if any(k in broken for a in ats for k in a.keys(grid)):
                v.note = (f"undecided: needs {v.runs_needed} more runs (a run of its cells failed in this "
                          "session: rerun lnexp atlas to retry)")
            elif n > max_seeds and (have >= PILOT or v.claim.test in STABILITY):
                more = "+" if n > S.MAX_N else ""
                v.note = (f"undecided: needs {v.runs_needed}{more} more runs ({n}{more} seeds per cell; the "
                          f"atlas runs at most {max_seeds})")
            else:  # a paired claim gets its pilot seeds before its spread is estimated from them
                pilot = v.claim.test not in STABILITY and have < PILOT
                target = PILOT if pilot else min(n, max_seeds)
                v.cells = tuple(_next_cells(ats, target, grid, got, set(tried), max_seeds))
    return out


def _ats_of(claim: Claim, chosen: list[Part], every: list[Part]) -> list[At]:
    """The cells of the comparisons chosen (a claim refuted by one comparison extends that one only)."""
    if claim.test in STABILITY:
        idx = [every.index(p) for p in chosen]
        pairs = [claim.pairs[i] for i in idx]
    else:
        per = max(1, len(claim.measures))
        pairs = [claim.pairs[every.index(p) // per] for p in chosen]
    return list(dict.fromkeys(a for pair in pairs for a in pair if a is not None))


def _verdict(claim: Claim, grid: Grid, got: SeedsAt, alpha: float) -> Verdict:
    ps = parts(claim, grid, got, alpha)
    v = Verdict(claim, ps, max((p.p for p in ps), default=1.0),
                min(1.0, len(ps) * min((p.p_refute for p in ps), default=1.0)))
    for a in claim.ats():
        v.n[a] = len(a.seeds(grid, got))
    if claim.no_norm:
        normed = [a.scheme for a in claim.ats() if not no_norm(Scheme.of(a.scheme).placement)]
        if normed:
            v.p, v.p_refute = 1.0, 1.0
            v.note = f"undecided: {', '.join(normed)} has a norm in its config (the claim is about no norm)"
    return v


def _holm(verdicts: list[Verdict], alpha: float) -> None:
    sup, p_sup = S.holm([v.p for v in verdicts], alpha)
    ref, p_ref = S.holm([v.p_refute for v in verdicts], alpha)
    for v, s, ps, r, pr in zip(verdicts, sup, p_sup, ref, p_ref, strict=True):
        v.p_holm, v.p_refute_holm = ps, pr
        v.verdict = "supported" if s else "not supported" if r else "undecided"


def planned(grid: Grid, claims: Iterable[Claim] | None = None) -> list[dict[str, Any]]:
    """Per claim, what deciding it costs before any run (``lnexp atlas --claims-cost``): the seeds a
    cell its test needs at its stated effect (a paired claim's at the prior sd, PRIOR_SD; at Holm's
    first level, every claim undecided; no seed cap), and its cells by depth."""
    out = []
    for v in evaluate(grid, {}, claims, max_seeds=S.MAX_N + 1):
        n = max((p.n_needed for p in v.parts), default=0)
        by_depth: dict[int, int] = {}
        for a in _ats_of(v.claim, v.parts, v.parts):
            d = a.arm(grid).depth
            by_depth[d] = by_depth.get(d, 0) + n * len(a.lrs_on(grid))
        out.append({"claim": v.claim.id, "test": v.claim.test, "effect": v.claim.effect, "seeds": n,
                    "cells": sum(by_depth.values()), "by_depth": by_depth,
                    "cell_set": {Cell(a.arm(grid), lr, seed) for a in _ats_of(v.claim, v.parts, v.parts)
                                 for lr in a.lrs_on(grid) for seed in range(1, n + 1)}})
    return out


def distinct_by_depth(rows: list[dict[str, Any]]) -> dict[int, int]:
    """The cells of ``planned``'s rows by depth, each counted once where claims share it (seeds 1..n
    of the same arm and lr)."""
    by_depth: dict[int, int] = {}
    for c in set().union(*(r["cell_set"] for r in rows)):
        by_depth[c.arm.depth] = by_depth.get(c.arm.depth, 0) + 1
    return by_depth


def needs(verdicts: list[Verdict], cost: dict[int, float]) -> list[Need]:
    """Per claim, what the allocation (lnexp.atlas.plan.allocate) weighs: decided or not, its next
    runs, and what deciding it costs: the runs it needs at the cost of its next ones (``cost``:
    seconds per run by depth)."""
    out = []
    for v in verdicts:
        per = [cost.get(c.arm.depth, max(cost.values())) for c in v.cells]
        out.append(Need(v.claim.id, v.verdict != "undecided", v.cells,
                        sum(per) / len(per) * max(v.runs_needed, len(per)) if per else 0.0))
    return out
