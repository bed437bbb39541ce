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


def write_grid(root: Path, pre_nan: bool = True) -> None:
    """Post-LN failing from 2e-3 without warm-up (4e-3 with), DeepNorm from 4e-3, Pre-LN and Peri-LN
    training everywhere (``pre_nan``: one Pre-LN seed goes NaN at 4e-3 without warm-up), and the dt
    column of Pre-LN and Peri-LN."""
    for seed in (1, 2):
        for lr in LRS:
            for w in (0, 40):
                post_ok = lr < (2e-3 if w == 0 else 4e-3)
                atlas_run(root, "post_ln", lr, w, seed, "trained" if post_ok else "plateau",
                          loss=6.8 if post_ok else 8.2)
                atlas_run(root, "deepnorm", lr, w, seed, "trained" if lr < 4e-3 else "plateau",
                          loss=6.7 if lr < 4e-3 else 8.1)
                nan = pre_nan and lr == 4e-3 and w == 0 and seed == 2
                atlas_run(root, "pre_ln", lr, w, seed, "nan" if nan else "trained", loss=6.0 + 0.1 * seed,
                          growth=1.5)
                atlas_run(root, "peri_ln", lr, w, seed, "trained", loss=5.9 + 0.02 * seed, growth=1.1)
        for p in ("pre_ln", "peri_ln"):
            for lr in LRS[-2:]:
                for dt in (0.5, 0.1):
                    atlas_run(root, p, lr, 0, seed, "trained", loss=6.1, dt=dt, growth=1.05)


def _checks(out: Path) -> dict[str, dict]:
    doc = json.loads((out / "atlas_checks.json").read_text())
    return {c["id"]: c for c in doc["checks"]}


@pytest.fixture(scope="module")
def grid_atlas(tmp_path_factory) -> tuple[Path, Path, int]:
    """(runs root, figures folder, exit status): write_grid's runs and `lnexp figure atlas` of them,
    made once for the tests that read them (each atlas of the grid costs ~3 CPU s)."""
    from lnexp.figures import atlas

    tmp = tmp_path_factory.mktemp("atlas")
    write_grid(tmp / "runs")
    rc = atlas.main(["--runs-root", str(tmp / "runs"), "--out", str(tmp / "figures")])
    return tmp / "runs", tmp / "figures", rc


def test_atlas_cells_claims_and_files(grid_atlas):
    from lnexp.atlas.claims import CLAIMS
    from lnexp.stats import wilson

    _, out, rc = grid_atlas
    assert rc == 0
    for f in ("atlas_maps.png", "atlas_maps.pdf", "atlas_lr.png", "atlas_growth.pdf"):
        assert (out / f).stat().st_size > 0
    with open(out / "atlas_summary.csv") as f:
        cells = {(r["scheme"], float(r["lr"]), int(r["warmup"]), float(r["dt"])): r
                 for r in csv.DictReader(f)}
    assert len(cells) == 4 * 3 * 2 + 2 * 2 * 2  # the grid plus the dt column, one axis of it
    nan_cell = cells[("pre_ln", 4e-3, 0, 1.0)]
    assert (nan_cell["trained"], nan_cell["diverged"], nan_cell["stable"]) == ("1", "1", "False")
    assert float(nan_cell["mean_valid_loss"]) == pytest.approx(6.1)  # the finite seed only
    assert (float(nan_cell["trained_low"]), float(nan_cell["trained_high"])) == pytest.approx(
        wilson(1, 2), abs=1e-3)
    assert cells[("post_ln", 2e-3, 0, 1.0)]["plateau"] == "2"
    assert cells[("post_ln", 1e-3, 0, 1.0)]["stable"] == "True"
    assert cells[("peri_ln", 4e-3, 0, 0.1)]["stable"] == "True"
    with open(out / "atlas.csv") as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 2 * len(cells) and sum(r["outcome"] == "diverged" for r in runs) == 1
    with open(out / "atlas_growth.csv") as f:
        growth = [r for r in csv.DictReader(f) if r["scheme"] == "pre_ln" and float(r["dt"]) == 1.0]
    assert float(growth[0]["last_layer_rms"]) == pytest.approx(1.5 ** 5, abs=1e-4)  # the end of training
    doc = json.loads((out / "atlas_checks.json").read_text())
    c = _checks(out)
    assert list(c) == [claim.id for claim in CLAIMS]  # every claim, decided or not
    for check in c.values():
        m = check["measured"]
        assert {"test", "arms", "statistic", "p", "p_holm", "verdict"} <= set(m)
        assert m["p_holm"] >= m["p"] and all(": n=" in a for a in m["arms"])
    post = c["atlas_post_ln_needs_warmup"]["measured"]  # 2e-3: with warm-up 2/2 train, without 0/2
    assert post["comparisons"][0]["a_trained"] == 2 and post["comparisons"][0]["b_trained"] == 0
    assert post["verdict"].startswith("undecided: needs ") and post["runs_needed"] > 0
    assert doc["outcomes"]["diverged"] == 1 and doc["claims_decided"].endswith("of 17")
    assert doc["correction"].startswith("Holm") and doc["machine"]


def test_an_unfinished_run_leaves_its_cell_unknown(tmp_path):
    from lnexp.figures import atlas

    write_grid(tmp_path / "runs")
    atlas_run(tmp_path / "runs", "peri_ln", 8e-3, 0, 1, "trained")
    (tmp_path / "runs" / "atlas_mini,peri_ln,lr=0.008,w=0,dt=1,s=1" / "status.json").write_text(
        json.dumps({"status": "running", "epoch": 0, "updates": 12}))  # killed mid-run
    atlas.main(["--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")])
    with open(tmp_path / "fig" / "atlas_summary.csv") as f:
        unfinished = next(r for r in csv.DictReader(f) if float(r["lr"]) == 8e-3)
    assert (unfinished["missing"], unfinished["stable"], unfinished["mean_valid_loss"]) == ("1", "", "nan")
    peri = _checks(tmp_path / "fig")["atlas_peri_stable_where_pre"]["measured"]["comparisons"][0]
    assert (peri["a_trained"], peri["a_n"]) == (0, 0)  # the top lr's only run has not finished


def test_atlas_without_runs_names_the_command(tmp_path):
    proc = lnexp_cmd("figure", "atlas", "--runs-root", str(tmp_path), "--out", str(tmp_path / "f"),
                     cache=tmp_path / "cache", check=False)
    assert proc.returncode == 2 and "make atlas" in proc.stderr and "Traceback" not in proc.stderr


def test_report_adds_the_atlas(grid_atlas):
    from lnexp.figures import report

    runs, figs, _ = grid_atlas
    report_dir = figs.parent / "report"  # beside the figures, as the links below expect
    report.main(["--figures", str(figs), "--out", str(report_dir), "--runs-root", str(runs)])
    text = (report_dir / "README.md").read_text()
    assert "![atlas_maps](../figures/atlas_maps.png)" in text
    assert "![atlas_growth](../figures/atlas_growth.png)" in text
    assert "| atlas | 0 of 17 claims supported by our runs |" in text  # two seeds decide none here
    # the per-cell table, from atlas_summary.csv
    assert "| peri_ln | 6 | 0 | 1 | 0.004 | 2 | 2 | 0 | 0 | 0 | True | 0.342 | 1 | 5.93 |" in text
    assert "Boschloo" in text and "undecided: needs" in text  # each claim with its test and verdict


@pytest.mark.parametrize("experiment,runs", [("atlas_mini", 40), ("atlas_dt_mini", 8), ("atlas_lrs_mini", 14),
                                             ("atlas_paper", 48),
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
    if "_lrs_" in experiment:  # the LR sensitivity's half-decades over three decades, 6+6, one seed
        assert all(b / a == pytest.approx(10 ** 0.5, rel=0.06) for a, b in zip(lrs, lrs[1:], strict=False))
        assert lrs[-1] / lrs[0] == pytest.approx(1e3) and params["depth"] == "'6'" and params["seed"] == "1"
        return
    assert len(lrs) >= 4 and all(b == pytest.approx(2 * a) for a, b in zip(lrs, lrs[1:], strict=False))
    # per scheme: lnexp atlas adds every placement (and the DyT pairs) and chooses the cells
    assert "placement" not in params and params["depth"] == "'6','18'"  # group names, quoted for Hydra
