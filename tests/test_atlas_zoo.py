"""The zoo atlas: the adaptive choice of cells (pure), the driver's rounds, resume and budget
cut-off (with a launcher that writes run folders instead of training), and the figure + checks."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from lnexp.atlas import budget, resources, rounds, schemes
from lnexp.atlas.claims import MAX_SEEDS, claim_cells
from lnexp.atlas.grid import Grid
from lnexp.atlas.launchers import Ended
from lnexp.atlas.outcomes import Arm, Cell, Scheme
from lnexp.atlas.plan import bracket, coverage, fits, next_cells
from tests.test_figures_fig2_fig4 import fake_run

LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
GRID = Grid(LRS, (0, 40), (6, 18), (1, 2), 1e-3)
FEW = [Scheme("post_ln"), Scheme("pre_ln"), Scheme("pre_ln", "dyt")]
CLAIMED = [
    Scheme(p) for p in ("post_ln", "pre_ln", "admin", "deepnorm", "b2t", "ln_scaling", "mix_ln", "rezero",
                        "t_fixup")
]
CLAIMED += [Scheme("pre_ln", "dyt"), Scheme("post_ln", "dyt")]
PLATEAU = {"reason": "plateau: valid nll 8.10 bits >= unigram entropy 8.35 - 0.5", "update": 120, "epoch": 1}


def bisect(limit: int) -> tuple[list[int], tuple[int, int]]:
    """Run the bisection of one arm against a monotone oracle (stable up to GRID's lr index
    ``limit``); the probes as lr indices."""
    arm, seen, probes = Arm(Scheme("pre_ln"), 0, 6), {}, []
    while cells := next_cells([arm], GRID, seen, (1,)):
        (c,) = cells
        probes.append(LRS.index(c.lr))
        seen[(arm, c.lr)] = {1: "trained" if LRS.index(c.lr) <= limit else "plateau"}
    return probes, bracket(arm, LRS, seen)


def test_bisection_starts_at_the_shared_lr_and_brackets_the_limit():
    for limit in range(-1, 5):
        probes, (lo, hi) = bisect(limit)
        assert probes[0] == 1 and len(probes) == len(set(probes)) <= 3
        assert (lo, hi) == (limit, limit + 1)


def test_boundary_gets_the_other_seeds_and_a_failing_seed_moves_it():
    arm = Arm(Scheme("post_ln", "dyt"), 40, 18)
    seen = {(arm, LRS[1]): {1: "trained"}, (arm, LRS[2]): {1: "plateau"}}
    assert next_cells([arm], GRID, seen, (1, 2)) == [Cell(arm, LRS[1], 2), Cell(arm, LRS[2], 2)]
    assert next_cells([arm], GRID, seen, (1, 2), pending={Cell(arm, LRS[1], 2)}) == [Cell(arm, LRS[2], 2)]
    seen[(arm, LRS[1])][2] = "diverged"  # seed 2 fails at the lower lr: the bisection goes on below it
    assert next_cells([arm], GRID, seen, (1, 2)) == [Cell(arm, LRS[0], 1)]


def test_fits_schedules_the_prefix_on_the_jobs():
    assert fits([100.0] * 10, 2, 500.0) == 10
    assert fits([100.0] * 10, 2, 450.0) == 8
    assert fits([300.0, 100.0, 100.0], 2, 250.0) == 0
    assert fits([], 2, 0.0) == 0


class Calls:
    """A Launcher that trains each cell of a round by calling ``fn(its overrides) -> seconds``, one
    after another, in this process."""

    name = "calls"

    def __init__(self, fn) -> None:
        self.fn, self.stopped = fn, False

    def __call__(self, ovr: list[str]) -> float:
        return self.fn(ovr)

    def run_round(self, cells, jobs, ended) -> None:
        for i, cell in enumerate(cells):
            if self.stopped:
                return
            ended(Ended(i, self.fn(cell.overrides("atlas_mini")), 0))

    def stop(self) -> None:
        self.stopped = True


def fake_launcher(root: Path, limit: dict[tuple[str, int], float], log: list, after=None) -> Calls:
    """Writes the run folder lnexp train would (trained below the scheme's limit lr, else plateau);
    ``after(run_dir, overrides)`` may add to it (norms.csv, another loss)."""

    def launch(ovr: list[str]) -> float:
        kv = dict(o.split("=", 1) for o in ovr)
        p, norm, depth, lr = kv["placement"], kv["norm"], int(kv["depth"]), float(kv["lr"])
        ok = lr <= limit.get((p if norm == "layernorm" else f"{p}+{norm}", depth), 2e-3) * 1.0001
        log.append(tuple(ovr))
        name = "_".join(o.replace("=", "-") for o in ovr)
        d = fake_run(
            root,
            name,
            kv["experiment"],
            placement=p,
            lr=lr,
            warmup=int(kv["warmup"]),
            seed=int(kv["seed"]),
            valid=(6.5 if ok else 8.2,),
            bleu=(2.0,),
            status="done" if ok else "diverged",
            diverged=None if ok else PLATEAU,
            extra={
                "norm": {"name": norm},
                "depth": {"encoder_layers": depth, "decoder_layers": depth},
                "residual_scale": float(kv.get("residual_scale", 1.0)),
            },
        )
        if after is not None:
            after(d, kv)
        return 100.0 * (3 if depth == 18 else 1)

    return Calls(launch)


def test_driver_rounds_resume_and_budget(tmp_path):
    root, log = tmp_path / "runs", []
    launch = fake_launcher(root, {("post_ln", 18): 0.0}, log)
    plan = rounds.run_atlas(root, "mini", 1e9, 2, launch, GRID, log=lambda s: None, schemes=FEW)
    assert plan["stopped"].startswith("done") and not plan["not_run"]
    assert len(schemes.schemes()) >= 17 and Scheme("post_ln", "dyt") in schemes.schemes()
    n_schemes = len(FEW)
    assert "pre_ln+dyt" in {d["scheme"] for d in plan["launched"]}
    # 2 warm-ups x 2 depths per scheme, each bisected (<= 3 probes) plus boundary seeds, and the
    # claims' cells, up to MAX_SEEDS seeds each; no run twice
    claimed = len(claim_cells(GRID, rounds.claims_of(FEW, GRID))) * MAX_SEEDS
    assert len(log) == len(set(log)) < n_schemes * 4 * (3 + 4) + claimed
    assert ("post_ln", 18, 40, 1e-3) in {
        (d["placement"], d["depth"], d["warmup"], d["lr"]) for d in plan["launched"]
    }
    # resumed: every cell is finished, nothing is launched again
    again: list = []
    plan2 = rounds.run_atlas(
        root, "mini", 1e9, 2, fake_launcher(root, {}, again), GRID, log=lambda s: None, schemes=FEW
    )
    assert again == [] and plan2["stopped"].startswith("done")


def clocked(inner, clock: list[float]):
    """The fake launcher on a fake clock: two jobs at a time, each run advances it half its time."""

    def launch(ovr: list[str]) -> float:
        took = inner(ovr)
        clock[0] += took / 2
        return took

    return Calls(launch)


def test_a_copy_of_another_schemes_network_is_run_once():
    """Sandwich-LN's config is Peri-LN's but for its name and its recipe's note."""
    from lnexp.atlas.grid import read_grid

    assert schemes.same_networks() == {"sandwich_ln": "peri_ln"}
    assert Scheme("peri_ln") in schemes.schemes() and Scheme("sandwich_ln") not in schemes.schemes()
    assert not any("sandwich_ln" in c for c in schemes.full_grid_commands("paper", read_grid("paper")))


def test_the_full_grid_is_the_fewest_commands_and_the_docs_say_how_many():
    """Every scheme the atlas trains, in as few lnexp train -m commands as a product of placements
    and norms allows (6 before: one per norm); docs/atlas.md says the same number."""
    import re

    from lnexp.atlas.grid import read_grid
    from tests.conftest import REPO

    commands = schemes.full_grid_commands("paper", read_grid("paper"))
    pairs = set()
    for c in commands:
        kv = dict(w.split("=", 1) for w in c.split()[3:])
        pairs |= {(p, n) for p in kv["placement"].split(",") for n in kv["norm"].split(",")}
    assert pairs == {(s.placement, s.norm) for s in schemes.schemes()}
    assert len(commands) == 3
    said = re.search(r"prints the (\w+) lnexp train -m commands", (REPO / "docs/atlas.md").read_text())
    assert said and said[1] == {2: "two", 3: "three", 4: "four"}[len(commands)]


def test_driver_stops_launching_when_the_budget_cannot_hold_a_cell(tmp_path, monkeypatch):
    clock, root, log = [0.0], tmp_path / "runs", []
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    launch = clocked(fake_launcher(root, {}, log), clock)
    plan = rounds.run_atlas(root, "mini", 1500.0, 2, launch, GRID, log=lambda s: None)
    # 1500 s - 60 s reserve on 2 jobs, first-guess costs 155 s (6 layers): the coverage round
    # (every scheme, both warm-ups) cannot all fit
    assert plan["stopped"].startswith("budget: the coverage") and plan["not_run"]
    assert 0 < len(log) < len(coverage(GRID, schemes.schemes()))
    state = json.loads((root / "atlas_state.json").read_text())
    assert state["costs"]  # the launcher's times replace the first guesses
    assert json.loads((root / "atlas_plan.json").read_text())["not_run"] == plan["not_run"]


def test_a_round_cut_by_the_budget_is_offered_again_when_its_runs_end_early(tmp_path, monkeypatch):
    """The estimate is 1.1 x the slowest run so far: runs that end sooner leave budget, which the cut
    cells get (the measured atlas stopped with 12 of its 105 minutes left and T-Fixup never run)."""
    clock, root, log, cut = [0.0], tmp_path / "runs", [], []
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setitem(resources.CPU_COST_S, "mini", {6: 100.0, 18: 330.0})  # the fake's own costs
    inner = fake_launcher(root, {}, log)

    def launch(ovr: list[str]) -> float:
        plan_file = root / "atlas_plan.json"
        if plan_file.exists():  # written as each round ends: the cells the last round left out
            cut.extend(json.loads(plan_file.read_text())["not_run"])
        slow = "depth=6" in ovr and not any("depth=6" in o for o in log)
        took = inner(ovr) * (2.0 if slow else 1.0)  # one slow 6-layer run sets their estimate
        clock[0] += took / 2  # two jobs at a time
        return took

    chosen = [Scheme(p) for p in ("post_ln", "pre_ln", "peri_ln", "deepnorm", "rezero", "t_fixup", "b2t")]
    plan = rounds.run_atlas(root, "mini", 2000.0, 2, Calls(launch), GRID, log=lambda s: None, schemes=chosen)
    launched = [tuple(sorted(d.items())) for d in plan["launched"]]
    assert plan["stopped"].startswith("budget") and cut
    assert any(tuple(sorted(c.items())) in launched for c in cut)  # a cut cell ran in a later round
    assert {("rezero", 6, 0), ("t_fixup", 6, 0)} <= {
        (d["placement"], d["depth"], d["warmup"]) for d in plan["launched"]}  # their claim's cells


def test_the_coverage_round_cut_by_the_budget_is_offered_again(tmp_path, monkeypatch):
    """First guesses 3x the runs' real cost cut the coverage round; the measured costs that replace
    them fit the rest, which run before any claim round."""
    clock, root, log = [0.0], tmp_path / "runs", []
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setitem(resources.CPU_COST_S, "mini", {6: 300.0, 18: 900.0})  # the fake: 100 / 300 s
    chosen = [Scheme(p) for p in ("post_ln", "pre_ln", "deepnorm", "rezero", "t_fixup", "b2t")]
    plan = rounds.run_atlas(root, "mini", 1500.0, 2, clocked(fake_launcher(root, {}, log), clock),
                            GRID, log=lambda s: None, schemes=chosen)
    cover = coverage(GRID, chosen)
    launched = [tuple(sorted(d.items())) for d in plan["launched"]]
    assert 0 < fits([300.0] * len(cover), 2, 1500.0 - budget.FIGURE_RESERVE_S) < len(cover)  # a cut round
    assert {tuple(sorted(c.doc().items())) for c in cover} == set(launched[:len(cover)])
    assert len(launched) > len(cover)  # then the claims' rounds ran


def _norms(d: Path, depth: int, last_rms: float, grad: float) -> None:
    fields = (
        "update",
        "side",
        "layer",
        "w1_grad_norm",
        "w2_grad_norm",
        "h_sq_norm_per_d",
        "h_mean_abs",
        "h_var",
        "h_max_abs",
    )
    with open(d / "norms.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for side in ("encoder", "decoder"):
            for layer in range(1, depth + 1):
                rms = 1.0 + (last_rms - 1.0) * (layer - 1) / (depth - 1)
                w.writerow(
                    {
                        "update": 120,
                        "side": side,
                        "layer": layer,
                        "w1_grad_norm": grad,
                        "w2_grad_norm": grad,
                        "h_sq_norm_per_d": rms * rms,
                        "h_mean_abs": rms,
                        "h_var": rms * rms,
                        "h_max_abs": 3 * rms,
                    }
                )


def shape(d: Path, kv: dict[str, str]) -> None:
    """What the claims compare, as lnexp train would measure it: hidden-state RMS and gradients
    (norms.csv) and DyT a little above LayerNorm; the papers' claims hold in these runs."""
    p = kv["placement"] + ("" if kv["norm"] == "layernorm" else "+" + kv["norm"])
    depth, s, dt = int(kv["depth"]), int(kv["seed"]), float(kv.get("residual_scale", 1.0))
    last = {"pre_ln": 40.0 if dt == 1.0 else 5.0, "ln_scaling": 10.0, "peri_ln": 8.0}.get(p, 5.0) + s
    _norms(d, depth, last, {"mix_ln": 0.5, "pre_ln": 0.1}.get(p, 0.2) + 0.01 * s)
    if kv["norm"] == "dyt":
        m = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        m[-1]["valid_loss"] += 0.03 + 0.001 * s
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in m))


def test_figure_draws_the_zoo_and_checks_the_claims(tmp_path):
    """The driver's claim rounds on runs where each claim's answer is built in: every claim ends
    decided as built but the spread one, which needs more seeds than the atlas runs."""
    from lnexp.figures import atlas

    root = tmp_path / "runs"
    limits = {("post_ln", 18): 0.0, ("pre_ln", 18): 2e-3, ("pre_ln", 6): 2e-3, ("post_ln", 6): 1e-3}
    small = Grid(LRS[:3], (0, 40), (6, 18), (1, 2), 1e-3)
    plan = rounds.run_atlas(root, "mini", 1e9, 6, fake_launcher(root, limits, [], shape), small,
                            log=lambda s: None, schemes=[*CLAIMED, Scheme("peri_ln")])
    out = tmp_path / "fig"
    assert atlas.main(["--runs-root", str(root), "--out", str(out)]) == 0
    for name in ("atlas_maps", "atlas_lr", "atlas_loss", "atlas_growth"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").is_file()
    for name in ("atlas_summary", "atlas_lr", "atlas_loss", "atlas_growth"):
        assert (out / f"{name}.csv").read_text().count("\n") > 1
    doc = json.loads((out / "atlas_checks.json").read_text())
    c = {x["id"]: x for x in doc["checks"]}
    verdicts = {k: v["measured"]["verdict"] for k, v in c.items()}
    assert plan["claims"] == verdicts  # the driver's last word on each claim is the figure's
    not_supported = {"atlas_post_ln_needs_warmup", "atlas_peri_higher_lr"}  # Post-LN fails with warm-up too
    assert {k for k, v in verdicts.items() if v == "not supported"} == not_supported
    assert verdicts["atlas_peri_smaller_spread"].startswith("undecided: needs")
    assert all(v == "supported" for k, v in verdicts.items() if k not in {*not_supported,
                                                                          "atlas_peri_smaller_spread"})
    rescued = c["atlas_deep_post_ln_rescued"]["measured"]
    assert rescued["test"].startswith("Boschloo") and rescued["p_holm"] >= rescued["p"]
    assert rescued["arms"][0].startswith("admin, 18+18, warm-up 40, lr 0.001: n=")
    assert doc["claims_decided"] == "11 of 12" and doc["machine"] and doc["measured"]
    assert "no atlas_plan.json" not in doc["plan"]
    assert "Sandwich-LN = Peri-LN's network, not run twice" in doc["plan"]
    with open(out / "atlas_lr.csv") as f:
        rows = {(r["scheme"], r["depth"], r["warmup"]): r for r in csv.DictReader(f)}
    assert float(rows[("pre_ln", "6", "0")]["largest_stable_lr"]) == 2e-3
    assert rows[("pre_ln", "6", "0")]["top"] == "True"  # 2e-3 is the top of the atlas's grid
    assert rows[("post_ln", "6", "0")]["largest_stable_lr"] == "0.001"
    assert not math.isnan(float(rows[("b2t", "6", "0")]["largest_stable_lr"]))


def test_a_bound_is_known_only_against_the_atlas_grid_not_the_lrs_run(tmp_path):
    """Pre-LN stable at 4e-3 with 8e-3 not run is >= 4e-3, not "stable at the top"; a scheme that
    fails at 1e-3 with 5e-4 not run does not fail "at the lowest lr" (the measured atlas drew both)."""
    from lnexp.figures import atlas

    root = tmp_path / "runs"
    launch = fake_launcher(root, {("pre_ln", 6): 8e-3, ("hybridnorm", 6): 0.0}, [])
    for ovr in (["placement=pre_ln", "lr=0.001"], ["placement=pre_ln", "lr=0.004"],
                ["placement=hybridnorm", "lr=0.001"]):
        launch(["experiment=atlas_mini", "norm=layernorm", "depth=6", "warmup=0", "seed=1", *ovr])
    (root / "atlas_plan.json").write_text(json.dumps({"lrs": list(LRS), "not_run": [], "stopped": "budget"}))
    out = tmp_path / "fig"
    assert atlas.main(["--runs-root", str(root), "--out", str(out)]) == 0
    with open(out / "atlas_lr.csv") as f:
        rows = {r["scheme"]: r for r in csv.DictReader(f)}
    assert (rows["pre_ln"]["largest_stable_lr"], rows["pre_ln"]["top"], rows["pre_ln"]["known"]) == (
        "0.004", "False", "False")
    assert (rows["hybridnorm"]["largest_stable_lr"], rows["hybridnorm"]["known"]) == ("", "False")
    table = (out / "atlas_table.md").read_text()  # the per-scheme table docs/atlas.md quotes
    assert "| 6+6, no warm-up |" in table
    assert "| Pre-LN | ≥ 0.004; " in table and "grid top" not in table
    assert "| HybridNorm | fails at 0.001; " in table and "lowest lr" not in table


@pytest.mark.parametrize("row,text", [
    (None, "not run"),
    ({"largest_stable_lr": None, "first_failing_lr": None, "known": False, "top": False}, "not known"),
    ({"largest_stable_lr": None, "first_failing_lr": 5e-4, "known": True, "top": False},
     "fails at 0.0005 (the lowest lr)"),
    ({"largest_stable_lr": 8e-3, "first_failing_lr": None, "known": True, "top": True}, "≥ 0.008 (grid top)"),
    ({"largest_stable_lr": 1e-3, "first_failing_lr": 2e-3, "known": True, "top": False}, "**0.001**"),
    ({"largest_stable_lr": 1e-3, "first_failing_lr": 4e-3, "known": False, "top": False},
     "0.001 ok, 0.004 fails"),
    ({"largest_stable_lr": 1e-3, "first_failing_lr": None, "known": False, "top": False}, "≥ 0.001"),
])
def test_the_per_scheme_table_says_how_well_a_bound_is_known(row, text):
    from lnexp.figures.atlas_zoo import bound_text

    assert bound_text(row) == text


def test_driver_does_not_retry_a_failing_run_in_a_loop(tmp_path):
    root, log = tmp_path / "runs", []

    def crashing(ovr: list[str]) -> float:  # the run fails: no finished run folder appears
        log.append(tuple(ovr))
        return 1.0

    plan = rounds.run_atlas(root, "mini", 1e9, 2, Calls(crashing), GRID, log=lambda s: None, schemes=FEW[:1])
    assert plan["stopped"].startswith("done") and len(log) == len(set(log)) <= 4 + 2 * 2


def test_order_sorts_schemes_with_unequal_rows():
    """A budget-cut atlas leaves some schemes with fewer warm-up rows than others (it crashed)."""
    from lnexp.figures.atlas_zoo import order

    rows = [{"scheme": "a", "depth": 6, "largest_stable_lr": 1e-3},
            {"scheme": "a", "depth": 6, "largest_stable_lr": 2e-3},
            {"scheme": "b", "depth": 6, "largest_stable_lr": 4e-3},
            {"scheme": "c", "depth": 6, "largest_stable_lr": None}]
    assert order(["c", "a", "b"], rows, 6) == ["b", "a", "c"]


# --- the claims and the sequential allocation (pure) -----------------------------------------------


def test_allocation_gives_the_next_slots_to_the_cheapest_undecided_claim():
    from lnexp.atlas.plan import Need, allocate

    arm = lambda p, d=6: Arm(Scheme(p), 0, d)  # noqa: E731
    cheap = Need("cheap", False, (Cell(arm("a"), 1e-3, 2), Cell(arm("b"), 1e-3, 2)), 300.0)
    dear = Need("dear", False, (Cell(arm("c", 18), 1e-3, 1), Cell(arm("a"), 1e-3, 2)), 900.0)
    done = Need("done", True, (Cell(arm("d"), 1e-3, 1),), 10.0)
    beyond = Need("beyond", False, (Cell(arm("e", 18), 1e-3, 1),) * 1, 5000.0)
    assert allocate([dear, done, cheap, beyond], 2, 4000.0) == list(cheap.cells)
    # more slots: the next claim's runs follow, a run two claims share is launched once
    assert allocate([dear, done, cheap, beyond], 4, 1200.0) == [*cheap.cells, dear.cells[0]]
    assert allocate([done], 2, 4000.0) == []  # a decided claim gets no run
    # nor one the budget cannot decide: 5000 s of one job are 2500 s on 2 jobs at once
    assert allocate([beyond], 2, 2400.0) == []
    assert allocate([beyond], 2, 2600.0) == list(beyond.cells)
    assert allocate([beyond], 1, 4000.0) == []


def mem_run(placement: str, lr: float, seed: int, loss: float | None, norm: str = "layernorm",
            warmup: int = 0, depth: int = 6, dt: float = 1.0):
    """A finished run as lnexp.results reads it (no folder: the claims on losses need none);
    ``loss`` None: it stalled on the plateau."""
    from lnexp.results import Run

    cfg = {"placement": {"name": placement}, "norm": {"name": norm}, "lr": lr, "warmup": warmup, "seed": seed,
           "depth": {"encoder_layers": depth}, "residual_scale": dt}
    status = {"status": "done"} if loss is not None else {"status": "diverged", "diverged": PLATEAU}
    return Run(Path("/nonexistent"), f"{placement}{norm}{lr}{seed}", cfg, status,
               [{"valid_loss": 8.4 if loss is None else loss}])


def test_claims_decide_from_the_runs_and_say_what_the_undecided_need():
    from lnexp.atlas import claims as C
    from lnexp.atlas.outcomes import seeds_at

    runs = []
    for s in (1, 2, 3):  # DyT 0.6 bit above LayerNorm in both placements, both warm-ups: outside 0.1 bit
        for p in ("pre_ln", "post_ln"):
            for w in (0, 40):
                runs.append(mem_run(p, 1e-3, s, 7.0 + 0.01 * s, warmup=w))
                runs.append(mem_run(p, 1e-3, s, 7.6 + 0.012 * s, norm="dyt", warmup=w))
    for s in range(1, 5):  # Pre-LN trains at 4x the shared lr on every seed, Post-LN on none
        runs += [mem_run("pre_ln", 4e-3, s, 6.5), mem_run("post_ln", 4e-3, s, None)]
    verdicts = {v.claim.id: v for v in C.evaluate(GRID, seeds_at(runs))}
    dyt, pre = verdicts["atlas_dyt_parity"], verdicts["atlas_pre_ln_where_post_ln_fails"]
    assert dyt.verdict == "not supported" and dyt.p_refute_holm < C.ALPHA <= dyt.p_holm
    assert pre.verdict == "supported" and pre.p == pytest.approx(2 ** -8) and pre.p_holm >= pre.p
    assert pre.cells == () and dyt.cells == ()  # decided: no more runs
    rescued = verdicts["atlas_deep_post_ln_rescued"]  # nothing run: undecided, with the runs it needs
    assert rescued.verdict == "undecided" and rescued.runs_needed == len(rescued.cells) > 0
    assert rescued.text == f"undecided: needs {rescued.runs_needed} more runs"
    assert {c.arm.depth for c in rescued.cells} == {18} and {c.arm.warmup for c in rescued.cells} == {40}
    spread = verdicts["atlas_peri_smaller_spread"]
    assert spread.cells and {c.seed for c in spread.cells} == {1, 2, 3}  # the pilot seeds first
    needed = {a for a, _ in C.claim_cells(GRID)}
    assert needed >= {Arm(Scheme("pre_ln"), 0, 6, 0.1), Arm(Scheme("admin"), 40, 18)}
