"""The atlas's LR sensitivity (issue 51): the half-decade grid it reads, the claims on it (their
cells, a seed over every lr; their verdicts on written runs), the zoo column's phase, and
``lnexp figure atlas``'s figure, CSVs and table column. The tiny atlas that trains a claim's cells
for real is in tests/test_atlas_driver.py."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from lnexp.atlas import claims as C
from lnexp.atlas import rounds
from lnexp.atlas.grid import Grid, read_grid
from lnexp.atlas.outcomes import Arm, Cell, Scheme, seeds_at
from tests.test_figures_fig2_fig4 import fake_run

HALF = (1e-4, 1e-3, 1e-2)  # a small half-decade grid (every other point)
GRID = Grid((5e-4, 1e-3, 2e-3), (0, 40), (6, 18), (1, 2), 1e-3, HALF)
INIT = 13.0  # the loss at initialisation (bits/token; log2 of the vocabulary, about)
PRE_VS_POST = next(c for c in C.CLAIMS if c.id == "atlas_lr_sens_pre_ln")


def grid_run(root: Path, placement: str, lr: float, seed: int, loss: float | None, warmup: int = 0,
             depth: int = 6, experiment: str = "atlas_mini") -> Path:
    """An atlas cell as lnexp train writes it, with updates.csv's first update (the loss at init);
    ``loss`` None: it diverged."""
    d = fake_run(root, f"{placement},lr={lr:g},w={warmup},d={depth},s={seed}", experiment,
                 placement=placement, lr=lr, warmup=warmup, seed=seed,
                 valid=(9.0,) if loss is None else (loss,), bleu=(0.0,),
                 status="diverged" if loss is None else "done",
                 diverged={"reason": "non-finite loss or gradient", "update": 9} if loss is None else None,
                 extra={"norm": {"name": "layernorm"}, "residual_scale": 1.0,
                        "depth": {"encoder_layers": depth, "decoder_layers": depth}})
    (d / "updates.csv").write_text(f"update,epoch,lr,loss\n1,1,{lr},{INIT + 0.01 * seed}\n2,1,{lr},12.0\n")
    return d


def _got(root: Path):
    from lnexp.results import collect_runs

    return seeds_at(collect_runs(root))


def test_the_mini_atlas_reads_its_half_decade_grid_and_its_five_claims():
    grid = read_grid("mini")
    assert grid.sensitivity_lrs == (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    assert grid.lrs == (5e-4, 1e-3, 2e-3, 4e-3, 8e-3) and grid.on_grid(0.0030000001) == 3e-3
    assert len(C.claims_for(grid)) == 17  # Holm's correction covers the 12 and the 5
    no_half = Grid(GRID.lrs, GRID.warmups, GRID.depths, GRID.seeds, 1e-3)
    assert len(C.claims_for(no_half)) == 12  # a scale without the half-decade grid: the 12
    grid_claims = [c for c in C.CLAIMS if C.over_grid(c)]
    assert len(grid_claims) == 5
    for c in grid_claims:  # each a paired one-sided test of the sensitivity, its effect stated
        assert c.test == "lower" and c.measures == ("lr_sensitivity",) and c.paper and "et al." in c.paper
        assert c.effect >= C.EFFECT_FLOOR and f"{c.effect:.2g} bit" in c.claim
    # the rule: half the pilot's difference in the claimed direction, at least the floor
    p = C.PILOT_SENSITIVITY
    assert C.SENS_PRE_POST == max(C.EFFECT_FLOOR, (p[("post_ln", 0)] - p[("pre_ln", 0)]) / 2)
    assert C.SENS_WARMUP == max(C.EFFECT_FLOOR, min(p[("post_ln", 0)] - p[("post_ln", 40)],
                                                     p[("pre_ln", 0)] - p[("pre_ln", 40)]) / 2)
    assert C.SENS_UNPILOTED == min(C.SENS_WARMUP, C.SENS_PRE_POST)


def test_the_pilots_sensitivities_are_what_its_kept_runs_give():
    """claims.PILOT_SENSITIVITY is no typed figure: the pilot's kept runs give it (3 decimals)."""
    from lnexp.lr_sensitivity import measure
    from lnexp.results import collect_runs

    root = Path(__file__).parent.parent / "docs/measurements/2026-12-04-lr-sensitivity-pilot/runs"
    runs = collect_runs(root)
    grid, rows = measure(runs, lambda r: (r.get("placement.name"), int(r.get("warmup"))))
    assert len(runs) == 28 and grid == [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    got = {r.arm: round(r.result.value, 3) for r in rows if not r.result.missing}
    assert got == C.PILOT_SENSITIVITY


def test_a_grid_claims_cells_are_a_seed_at_every_lr_seed_by_seed_across_its_arms(tmp_path):
    root = tmp_path / "runs"
    grid_run(root, "pre_ln", 1e-3, 1, 6.0)  # the coverage cell: seed 1 at the shared lr
    (v,) = C.evaluate(GRID, _got(root), [PRE_VS_POST])
    pre, post = Arm(Scheme("pre_ln"), 0, 6), Arm(Scheme("post_ln"), 0, 6)
    assert v.verdict == "undecided" and v.n == {a: 0 for a in PRE_VS_POST.ats()}
    want = [Cell(pre, 1e-4, 1), Cell(pre, 1e-2, 1), *(Cell(post, lr, 1) for lr in HALF)]
    for s in (2, 3):  # the pilot's seeds (PILOT) before the spread is known
        want += [*(Cell(pre, lr, s) for lr in HALF), *(Cell(post, lr, s) for lr in HALF)]
    assert list(v.cells) == want and C.PILOT == 3
    assert v.runs_needed % len(HALF) == 0 and v.runs_needed >= len(want)  # cells, 3 a seed an arm
    # a cell tried in this session that did not finish: the claim waits for a rerun, and a seed of
    # the grid with such a cell is left whole, the next one taken
    (v,) = C.evaluate(GRID, _got(root), [PRE_VS_POST], tried={Cell(post, 1e-2, 2)})
    assert v.cells == () and v.text.endswith("(a run of its cells failed in this session: rerun lnexp "
                                             "atlas to retry)")
    cells = C._next_cells(PRE_VS_POST.ats(), 3, GRID, _got(root), {Cell(post, 1e-2, 2)})
    assert [c.seed for c in cells if c.arm == post] == [1, 1, 1, 3, 3, 3, 4, 4, 4]
    assert C.claim_cells(GRID, [PRE_VS_POST]) == [(pre, lr) for lr in HALF] + [(post, lr) for lr in HALF]


def _pair(root: Path, seeds: range, post_top: float | None, noise: float = 0.02) -> None:
    """Pre-LN and Post-LN over HALF: both best at 1e-3 (6.0), 1e-4 on the plateau (8.0); at 1e-2
    Pre-LN trains (6.5) and Post-LN ends at ``post_top`` (None: diverged, capped at its init)."""
    for s in seeds:
        e = noise * ((s * 7) % 5 - 2)  # a seed's own small wobble
        for lr, pre, post in ((1e-4, 8.0, 8.0), (1e-3, 6.0, 6.0), (1e-2, 6.5, post_top)):
            grid_run(root, "pre_ln", lr, s, pre + e)
            grid_run(root, "post_ln", lr, s, None if post is None else post + e / 2)


def test_a_grid_claim_is_supported_refuted_or_needs_seeds_from_its_runs(tmp_path):
    """Post-LN diverging at the top lr on every seed (capped at its loss at init) is more sensitive
    than Pre-LN by far more than the effect: supported at Holm's level over the 17 claims. The
    same sensitivity in both is shown below the effect: not supported. Two seeds that differ:
    undecided, and the cells of the third are what it runs next."""
    grid17 = C.claims_for(GRID)
    diverged = tmp_path / "diverged"
    _pair(diverged, range(1, 7), None)
    v = next(x for x in C.evaluate(GRID, _got(diverged), grid17) if x.claim is PRE_VS_POST)
    (part,) = v.parts
    gap = ((INIT - 6.0) - (6.5 - 6.0)) / 3  # the top lr: capped at init (+0.01 s) vs 6.5
    assert part.numbers["mean"] == pytest.approx(gap, abs=0.05) and part.n == 6
    assert v.verdict == "supported" and v.p_holm < C.ALPHA and v.cells == ()
    assert "LR sensitivity over the half-decade grid" in part.text and "post_ln - pre_ln" in part.text
    assert v.n == {a: 6 for a in PRE_VS_POST.ats()}

    same = tmp_path / "same"
    _pair(same, range(1, 7), 6.5)
    v = next(x for x in C.evaluate(GRID, _got(same), grid17) if x.claim is PRE_VS_POST)
    assert abs(v.parts[0].numbers["mean"]) < 0.02 and v.verdict == "not supported"

    few = tmp_path / "few"
    _pair(few, range(1, 3), None, noise=1.0)  # two seeds, apart: not enough at Holm's level
    grid_run(few, "post_ln", 1e-4, 3, 8.0)  # seed 3 lacks two lrs of Post-LN: not a seed of the grid
    v = next(x for x in C.evaluate(GRID, _got(few), grid17) if x.claim is PRE_VS_POST)
    assert v.verdict == "undecided" and v.parts[0].n == 2
    post = Arm(Scheme("post_ln"), 0, 6)
    assert {(c.lr, c.seed) for c in v.cells if c.arm == post} == {(1e-3, 3), (1e-2, 3)}  # the rest of 3


def test_the_zoo_column_runs_after_the_claims_and_before_the_bisection(tmp_path, monkeypatch):
    """Every scheme's seed 1 over the half-decade grid, 6+6, both warm-ups: after coverage (whose
    shared-lr cells it reuses) and the claims, before the bisection; scheme by scheme."""
    from types import SimpleNamespace

    from lnexp.atlas import budget
    from tests.test_atlas_zoo import FEW, clocked, fake_launcher

    root, log, lines = tmp_path / "runs", [], []
    grid = Grid((1e-3, 2e-3), (0, 40), (6,), (1,), 1e-3, HALF)
    plan = rounds.run_atlas(root, "mini", 1e9, 2, fake_launcher(root, {}, log), grid, log=lines.append,
                            schemes=FEW, claims=[])
    phases = [ln.split(": ")[1] for ln in lines if ln.count(": ") >= 2 and " cells; " in ln]
    assert phases[:3] == ["coverage", "LR sensitivity, zoo column", "shallow bisection"], lines
    assert "LR sensitivity over 0.0001, 0.001, 0.01" in lines[0]
    launched = [(d["scheme"], d["warmup"], d["lr"], d["seed"]) for d in plan["launched"]]
    zoo = launched[2 * len(FEW): 2 * len(FEW) + 2 * 2 * len(FEW)]  # 2 new lrs, 2 warm-ups a scheme
    assert zoo == [(s.label, w, lr, 1) for s in FEW for w in (0, 40) for lr in (1e-4, 1e-2)]
    assert tuple(plan["sensitivity_lrs"]) == HALF and len(log) == len(set(log))
    # a budget that holds the coverage (6 cells of 100 s, 2 at a time) and 2 of the zoo column's
    clock = [0.0]
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cut = rounds.run_atlas(tmp_path / "cut", "mini", budget.FIGURE_RESERVE_S + 300 + 150, 2,
                           clocked(fake_launcher(tmp_path / "cut", {}, []), clock), grid,
                           log=lambda s: None, schemes=FEW, claims=[], cost_s={6: 100.0})
    assert cut["stopped"].startswith("budget: the zoo column's next cells did not fit")
    assert len(cut["launched"]) == 2 * len(FEW) + 2 and len(cut["not_run"]) == 2 * 2 * len(FEW) - 2


def test_figure_atlas_draws_the_sensitivity_and_the_zoo_column(tmp_path):
    """lnexp figure atlas on written runs over the mini atlas's half-decade grid: the figure, its
    two CSVs, the table's columns with nGPT marked, the report showing both; the half-decade lrs
    stay out of the largest-stable-lr figure."""
    from lnexp.figures import atlas, report

    root, out = tmp_path / "runs", tmp_path / "fig"
    lrs = read_grid("mini").sensitivity_lrs
    shape = {"pre_ln": (8.0, 7.0, 6.0, 5.5, 5.8, 7.5, None), "ngpt": (8.2, 8.0, 7.5, 7.0, 6.5, 6.4, 6.6),
             "post_ln": (8.0, 7.2, 6.3, 6.0, None, None, None)}
    for placement, losses in shape.items():
        for w in (0, 40):
            for seed in ((1, 2) if placement == "pre_ln" and w == 0 else (1,)):
                for lr, loss in zip(lrs, losses, strict=True):
                    grid_run(root, placement, lr, seed, None if loss is None else loss + 0.05 * seed, w,
                             experiment="atlas_lrs_mini" if lr == 3e-2 else "atlas_mini")
    grid_run(root, "post_ln", 4e-3, 1, None)  # a log2-grid cell
    assert atlas.main(["--runs-root", str(root), "--out", str(out)]) == 0
    assert (out / "atlas_lr_sensitivity.png").stat().st_size > 10_000
    assert (out / "atlas_lr_sensitivity.pdf").is_file()
    with open(out / "atlas_lr_sensitivity.csv") as f:
        sens = {(r["scheme"], int(r["warmup"])): r for r in csv.DictReader(f)}
    assert sens[("pre_ln", 0)]["complete_seeds"] == "2" and len(sens) == 6
    capped = [8.05, 7.05, 6.05, 5.55, 5.85, 7.55, INIT + 0.01]  # seed 1; 1e-1 diverged: its init
    assert float(sens[("pre_ln", 40)]["mean"]) == pytest.approx(sum(x - 5.55 for x in capped) / 7, abs=1e-4)
    with open(out / "atlas_lr_curves.csv") as f:
        curves = [r for r in csv.DictReader(f) if r["scheme"] == "post_ln" and r["warmup"] == "0"]
    assert [float(r["lr"]) for r in curves] == list(lrs) and curves[-1]["diverged"] == "1"
    table = (out / "atlas_table.md").read_text()
    assert "| LR sensitivity, 6+6, no warm-up | LR sensitivity, 6+6, warm-up 40 |" in table
    assert "| nGPT † |" in table and "† ngpt change what the lr means" in table
    assert f"{float(sens[('pre_ln', 0)]['mean']):.2f} (n=2)" in table
    with open(out / "atlas_lr.csv") as f:  # the bisection's figure: the log2 grid only
        bounds = {(r["scheme"], r["warmup"]): r for r in csv.DictReader(f)}
    assert bounds[("post_ln", "0")]["first_failing_lr"] == "0.004"
    assert "atlas_lr_sensitivity.csv" in json.dumps(sorted(p.name for p in out.iterdir()))
    report.main(["--figures", str(out), "--out", str(tmp_path / "report"), "--runs-root", str(root)])
    text = (tmp_path / "report" / "README.md").read_text()
    assert "![atlas_lr_sensitivity](../fig/atlas_lr_sensitivity.png)" in text
    assert "| LR sensitivity, 6+6, no warm-up |" in text and "| nGPT † |" in text
    assert math.isfinite(float(sens[("ngpt", 0)]["mean"]))


def test_claims_cost_prints_each_claims_cells_at_the_power_rules_n(tmp_path):
    """lnexp atlas --claims-cost: per claim the seeds a cell its test needs at its stated effect
    before any run, and its cells by depth; a claim over the grid costs 7 cells an arm a seed."""
    from lnexp import stats as S
    from tests.conftest import lnexp_main

    out = lnexp_main("atlas", "--claims-cost", cache=tmp_path / "cache")
    rows = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines()[2:] if ln.startswith("atlas_")}
    assert len(rows) == 17 and out.stdout.splitlines()[-1].startswith("total: ")
    n = S.paired_n(C.SENS_PRE_POST, C.PRIOR_SD["bits/token"], C.ALPHA / 17)
    assert rows["atlas_lr_sens_pre_ln"][3:] == [str(n), f"{2 * 7 * n:,}", "0"]
    depth = rows["atlas_lr_sens_depth"]  # one arm at 6+6, one at 18+18
    assert depth[4] == depth[5] == f"{7 * int(depth[3]):,}"
    assert rows["atlas_lr_sens_warmup"][4] == f"{4 * 7 * int(rows['atlas_lr_sens_warmup'][3]):,}"
    # the five LR-sensitivity claims alone: 7 arms (6 at 6+6, Pre-LN's at 18+18), each cell once
    five = C.planned(read_grid("mini"), [c for c in C.CLAIMS if c.id.startswith("atlas_lr_sens_")])
    n = {r["claim"].removeprefix("atlas_lr_sens_"): r["seeds"] for r in five}
    # Post-LN without and with warm-up, Pre-LN without and with, qk-layernorm, Peri-LN
    per_arm = [max(n["warmup"], n["pre_ln"]), n["warmup"], max(n.values()), n["warmup"],
               n["qk_layernorm"], n["peri_ln"]]
    assert C.distinct_by_depth(five) == {6: 7 * sum(per_arm), 18: 7 * n["depth"]}
    assert "; distinct: " in out.stdout.splitlines()[-1]
    assert not (tmp_path / "runs").exists()  # it prints, and writes nothing
