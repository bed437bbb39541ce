"""The stability atlas: cell states, checks and files from written run directories; its sweep configs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from tests.conftest import lnexp_cmd
from tests.test_figures_fig2_fig4 import fake_run

PLATEAU = {"reason": "plateau: valid nll 8.10 bits >= unigram entropy 8.35 - 0.5", "update": 60, "epoch": 1}
NAN = {"reason": "non-finite loss or gradient", "update": 23, "epoch": 1}


def atlas_run(root: Path, placement: str, lr: float, warmup: int, seed: int, state: str, loss: float = 6.5,
              dt: float = 1.0, growth: float | None = None) -> Path:
    """One atlas run as lnexp train writes it: trained, plateau (still on the unigram entropy) or nan."""
    exp = "atlas_mini" if dt == 1.0 else "atlas_dt_mini"
    name = f"{exp},{placement},lr={lr:g},w={warmup},dt={dt:g},s={seed}"
    extra = {"residual_scale": dt, "max_update": 60}
    if state == "nan":  # stopped before its only evaluation: no metrics.jsonl row
        d = fake_run(root, name, exp, placement=placement, lr=lr, warmup=warmup, seed=seed, valid=(),
                     bleu=(), status="diverged", diverged=NAN, extra=extra)
    else:
        d = fake_run(root, name, exp, placement=placement, lr=lr, warmup=warmup, seed=seed,
                     valid=(loss,), bleu=(3.0 if state == "trained" else 0.1,),
                     status="done" if state == "trained" else "diverged",
                     diverged=PLATEAU if state == "plateau" else None, extra=extra)
    if growth is not None:  # norms.csv of track_norms: RMS grows geometrically by `growth` per layer
        fields = ("update", "side", "layer", "w1_grad_norm", "w2_grad_norm", "h_sq_norm_per_d",
                  "h_mean_abs", "h_var", "h_max_abs")
        with open(d / "norms.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for update, scale in ((10, 0.5), (60, 1.0)):  # only the last update counts
                for side in ("encoder", "decoder"):
                    for layer in range(1, 7):
                        rms = scale * growth ** (layer - 1)
                        w.writerow({"update": update, "side": side, "layer": layer, "w1_grad_norm": 0.1,
                                    "w2_grad_norm": 0.1, "h_sq_norm_per_d": rms * rms, "h_mean_abs": rms,
                                    "h_var": rms * rms, "h_max_abs": 3 * rms})
    return d


LRS = (1e-3, 2e-3, 4e-3)
FIRST_ATLAS = ("atlas_grid_range", "atlas_peri_", "atlas_dt_", "atlas_post_ln_no_warmup_first",
               "atlas_hidden_growth")  # the checks of the first atlas (4 placements, one depth)


def write_grid(root: Path, peri_fails_at: float | None = None, pre_nan: bool = True) -> None:
    """A grid where every claim holds, unless Peri-LN is made to fail at ``peri_fails_at``
    (``pre_nan``: one Pre-LN seed goes NaN at 4e-3 without warm-up)."""
    for seed in (1, 2):
        for lr in LRS:
            for w in (0, 20):
                post_ok = lr < (2e-3 if w == 0 else 4e-3)  # Post-LN without warm-up fails first
                atlas_run(root, "post_ln", lr, w, seed, "trained" if post_ok else "plateau",
                          loss=6.8 if post_ok else 8.2)
                atlas_run(root, "deepnorm", lr, w, seed, "trained" if lr < 4e-3 else "plateau",
                          loss=6.7 if lr < 4e-3 else 8.1)
                nan = pre_nan and lr == 4e-3 and w == 0 and seed == 2  # one seed of one cell goes NaN
                atlas_run(root, "pre_ln", lr, w, seed, "nan" if nan else "trained",
                          loss=6.0 + 0.1 * seed, growth=1.5)
                peri_bad = peri_fails_at is not None and lr >= peri_fails_at
                atlas_run(root, "peri_ln", lr, w, seed, "plateau" if peri_bad else "trained",
                          loss=8.0 if peri_bad else 5.9 + 0.02 * seed, growth=1.1)
        for p in ("pre_ln", "peri_ln"):
            for lr in LRS[-2:]:
                for dt in (0.5, 0.1):
                    atlas_run(root, p, lr, 0, seed, "trained", loss=6.1, dt=dt, growth=1.05)


def _checks(out: Path) -> dict[str, dict]:
    doc = json.loads((out / "atlas_checks.json").read_text())
    return {c["id"]: c for c in doc["checks"]}


def test_atlas_cells_checks_and_files(tmp_path):
    from lnexp.figures import atlas

    write_grid(tmp_path / "runs")
    out = tmp_path / "fig"
    assert atlas.main(["--runs-root", str(tmp_path / "runs"), "--out", str(out)]) == 0
    for f in ("atlas.png", "atlas.pdf", "atlas_stability.png", "atlas_stability.pdf"):
        assert (out / f).stat().st_size > 0
    with open(out / "atlas_summary.csv") as f:
        cells = {(r["placement"], float(r["lr"]), int(r["warmup"]), float(r["residual_scale"])): r
                 for r in csv.DictReader(f)}
    assert len(cells) == 4 * 3 * 2 + 2 * 2 * 2  # the grid plus the dt column
    nan_cell = cells[("pre_ln", 4e-3, 0, 1.0)]
    assert (nan_cell["trained"], nan_cell["diverged"], nan_cell["stable"]) == ("1", "1", "False")
    assert float(nan_cell["mean_valid_loss"]) == pytest.approx(6.1)  # the finite seed only
    pre = cells[("pre_ln", 1e-3, 20, 1.0)]
    assert float(pre["mean_valid_loss"]) == pytest.approx(6.15)
    assert float(pre["spread_valid_loss"]) == pytest.approx(0.1)
    assert cells[("post_ln", 2e-3, 0, 1.0)]["plateau"] == "2"
    assert cells[("post_ln", 1e-3, 0, 1.0)]["stable"] == "True"
    with open(out / "atlas.csv") as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 2 * len(cells)
    assert sum(r["outcome"] == "diverged" for r in runs) == 1
    with open(out / "atlas_norms.csv") as f:
        norms = [r for r in csv.DictReader(f) if r["placement"] == "pre_ln"]
    assert {r["update"] for r in norms} == {"60"}  # the end of training
    assert float(next(r for r in norms if r["layer"] == "6")["hidden_rms"]) == pytest.approx(1.5 ** 5)
    c = _checks(out)
    first_atlas = [k for k in c if k.startswith(FIRST_ATLAS)]
    assert len(first_atlas) == 7 and all(c[k]["pass"] is True for k in first_atlas), {
        k: c[k]["ours"] for k in first_atlas}
    # the zoo's claims on this grid of 4 placements at one depth: only Pre-LN >= Post-LN is decided
    assert {k: c[k]["pass"] for k in c if k not in first_atlas and c[k]["pass"] is not None} == {
        "atlas_pre_ge_post_lr": True}
    assert c["atlas_peri_higher_lr"]["measured"]["0"]["pre_ln"]["lr"] == 2e-3
    assert c["atlas_peri_higher_lr"]["measured"]["0"]["peri_ln"] == {"lr": 4e-3, "top": True, "known": True}
    assert c["atlas_post_ln_no_warmup_first"]["measured"]["first_failing_lr"]["post_ln/warm-up 0"] == 2e-3
    spread = c["atlas_peri_smaller_spread"]["measured"]
    assert spread["mean_spread_pre_ln"] == pytest.approx(0.1)
    assert spread["mean_spread_peri_ln"] == pytest.approx(0.02)
    growth = c["atlas_hidden_growth"]["measured"]["growth_last_over_first"]
    assert growth["pre_ln"]["encoder"] == pytest.approx(1.5 ** 5)
    # dt 0.5 and 0.1 train both seeds where dt 1 lost one to NaN
    assert c["atlas_dt_never_less_stable"]["ours"].endswith("more seeds train with dt < 1 in 2")
    doc = json.loads((out / "atlas_checks.json").read_text())
    assert doc["claims_supported"] == "7 of 12" and doc["outcomes"]["diverged"] == 1  # the grid check aside
    grid = c["atlas_grid_range"]
    assert grid["measured"]["failing_at_highest"] == [
        "post_ln/warm-up 0", "post_ln/warm-up 20", "pre_ln/warm-up 0",
        "deepnorm/warm-up 0", "deepnorm/warm-up 20"]
    assert grid["ours"].startswith("lowest lr 0.001: every arm trains (8 arms); highest lr 0.004:")


def test_atlas_claims_not_supported_are_reported(tmp_path):
    from lnexp.figures import atlas

    write_grid(tmp_path / "runs", peri_fails_at=2e-3)
    atlas_run(tmp_path / "runs", "peri_ln", 8e-3, 0, 1, "trained")
    (tmp_path / "runs" / "atlas_mini,peri_ln,lr=0.008,w=0,dt=1,s=1" / "status.json").write_text(
        json.dumps({"status": "running", "epoch": 0, "updates": 12}))  # killed mid-run
    atlas.main(["--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")])
    c = _checks(tmp_path / "fig")
    assert c["atlas_peri_stable_where_pre"]["pass"] is False
    assert "fails in lr 0.002, warm-up 0" in c["atlas_peri_stable_where_pre"]["ours"]
    assert c["atlas_peri_higher_lr"]["pass"] is False
    assert c["atlas_dt_never_less_stable"]["pass"] is True  # dt < 1 trains where dt = 1 plateaus
    assert c["atlas_grid_range"]["pass"] is None  # the top lr (8e-3) has only an unfinished run
    assert "lowest lr 0.001: every arm trains" in c["atlas_grid_range"]["ours"]
    with open(tmp_path / "fig" / "atlas_summary.csv") as f:
        unfinished = next(r for r in csv.DictReader(f) if float(r["lr"]) == 8e-3)
    assert (unfinished["missing"], unfinished["stable"], unfinished["mean_valid_loss"]) == ("1", "", "nan")


def test_atlas_higher_lr_undecided_when_both_train_at_the_top(tmp_path):
    from lnexp.figures import atlas

    write_grid(tmp_path / "runs", pre_nan=False)
    atlas.main(["--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")])
    higher = _checks(tmp_path / "fig")["atlas_peri_higher_lr"]
    assert higher["pass"] is None  # neither limit is on the grid: not a "no"
    assert higher["ours"].endswith("(Pre-LN is stable at every lr of the grid: the grid does not reach "
                                   "its limit)")


@pytest.mark.parametrize("seeds_failing,supported", [((1,), True), ((1, 2), False)])
def test_atlas_post_ln_tie_is_broken_by_the_seeds_that_fail(tmp_path, seeds_failing, supported):
    """Post-LN with warm-up also fails at 2e-3: on one seed Post-LN without warm-up still fails
    first (2 of 2 seeds against 1 of 2), on both it does not."""
    import shutil

    from lnexp.figures import atlas

    write_grid(tmp_path / "runs")
    for seed in seeds_failing:
        shutil.rmtree(tmp_path / "runs" / f"atlas_mini,post_ln,lr=0.002,w=20,dt=1,s={seed}")
        atlas_run(tmp_path / "runs", "post_ln", 2e-3, 20, seed, "plateau", loss=8.2)
    atlas.main(["--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")])
    first = _checks(tmp_path / "fig")["atlas_post_ln_no_warmup_first"]
    assert first["pass"] is supported
    share = len(seeds_failing) / 2
    assert first["measured"]["failing_seed_share_at_that_lr"] == {"post_ln/warm-up 0": 1.0,
                                                                  "post_ln/warm-up 20": share}
    assert f"tied with post_ln/warm-up 20 ({share:.0%} of its seeds)" in first["ours"]


def test_atlas_grid_range_fails_when_the_lowest_lr_does(tmp_path):
    from lnexp.figures import atlas

    write_grid(tmp_path / "runs", peri_fails_at=1e-3)
    atlas.main(["--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")])
    grid = _checks(tmp_path / "fig")["atlas_grid_range"]
    assert grid["pass"] is False
    assert grid["ours"].startswith("lowest lr 0.001: fails in peri_ln/warm-up 0, peri_ln/warm-up 20;")


def test_atlas_without_runs_names_the_command(tmp_path):
    proc = lnexp_cmd("figure", "atlas", "--runs-root", str(tmp_path), "--out", str(tmp_path / "f"),
                     cache=tmp_path / "cache", check=False)
    assert proc.returncode == 2 and "make atlas" in proc.stderr and "Traceback" not in proc.stderr


def test_report_adds_the_atlas(tmp_path):
    from lnexp.figures import atlas, report

    write_grid(tmp_path / "runs")
    figs = tmp_path / "figures"
    atlas.main(["--runs-root", str(tmp_path / "runs"), "--out", str(figs)])
    report.main(["--figures", str(figs), "--out", str(tmp_path / "report"), "--runs-root",
                 str(tmp_path / "runs")])
    text = (tmp_path / "report" / "README.md").read_text()
    assert "![atlas](../figures/atlas.png)" in text
    assert "![atlas_stability](../figures/atlas_stability.png)" in text
    assert "| atlas | 7 of 12 claims supported by our runs |" in text  # 6 of the first atlas's, 1 zoo
    assert "| peri_ln | 0.004 | 0 | 1 | 2 | 2 | 0 | 0 | 0 | 5.93 | 0.02 | True |" in text  # from the CSV


@pytest.mark.parametrize("experiment,runs", [("atlas_mini", 40), ("atlas_dt_mini", 8), ("atlas_paper", 48),
                                             ("atlas_dt_paper", 24), ("fig2_mini", 9),
                                             ("fig2_low_lr_mini", 3)])
def test_sweeps_compose_with_their_documented_grid(experiment, runs):
    """The sweep configs compose, with the grid sizes their comments (and the mini budgets) assume."""
    from lnexp import config
    from tests.test_experiments import sweep_params

    grid = sweep_params(experiment)
    cfg = config.compose([f"experiment={experiment}"], check=False)
    params = {k: ",".join(v) for k, v in grid.items()}
    assert math.prod(len(v) for v in grid.values()) == runs
    assert cfg.schedule.name == "constant" or experiment.startswith("fig2_") and "paper" in experiment
    if experiment.startswith("fig2_"):
        assert float(params["lr"]) == (1e-3 if experiment == "fig2_mini" else 5e-4)
        return
    assert cfg.divergence.stop is True and cfg.track_norms is True
    lrs = [float(x) for x in params["lr"].split(",")]
    if "_dt_" in experiment:
        assert params["residual_scale"] == "0.5,0.1" and params["warmup"] == "0"
        return
    assert len(lrs) >= 4 and all(b == pytest.approx(2 * a) for a, b in zip(lrs, lrs[1:], strict=False))
    # per scheme: lnexp atlas adds every placement (and the DyT pairs) and chooses the cells
    assert "placement" not in params and params["depth"] == "'6','18'"  # group names, quoted for Hydra
