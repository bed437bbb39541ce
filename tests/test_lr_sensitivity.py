"""Wortsman et al.'s LR sensitivity (lnexp.stats.lr_sensitivity) on hand-made losses, and
``lnexp results --lr-sensitivity`` on run folders: hand-made ones, then a real ``lnexp train -m``
sweep."""

from __future__ import annotations

import math

import pytest

from tests.conftest import lnexp_main
from tests.test_figures_fig2_fig4 import fake_run


def test_the_measure_caps_at_the_initial_loss_and_names_missing_lrs():
    from lnexp.stats import lr_sensitivity

    grid = [1e-4, 1e-3, 1e-2, 1e-1]
    init = dict.fromkeys(grid, 10.0)
    s = lr_sensitivity({1e-4: 7.0, 1e-3: 6.0, 1e-2: 12.0, 1e-1: math.nan}, init, grid)
    # capped: 1e-2 ended above its loss at init, 1e-1 diverged: both count as 10
    assert s.best == 6.0 and s.best_lr == 1e-3 and s.capped == (1e-2, 1e-1)
    assert s.value == pytest.approx(((7 - 6) + 0 + (10 - 6) + (10 - 6)) / 4)
    assert s.complete and s.missing == ()
    partial = lr_sensitivity({1e-4: 7.0, 1e-3: 6.0}, init, grid)
    assert partial.missing == (1e-2, 1e-1) and not partial.complete
    assert partial.value == pytest.approx(0.5)  # over the lrs it has
    flat = lr_sensitivity(dict.fromkeys(grid, 6.0), init, grid)
    assert flat.value == 0.0  # every lr as good as the best: not sensitive at all
    none = lr_sensitivity({}, init, grid)
    assert math.isnan(none.value) and none.missing == tuple(grid)


def sweep_folder(root, losses: dict[str, dict[float, float | None]], init: float = 10.0) -> None:
    """Runs as lnexp train writes them, one per (placement, lr): the final valid loss (None:
    diverged), and updates.csv with the first update's loss."""
    for placement, by_lr in losses.items():
        for lr, loss in by_lr.items():
            d = fake_run(root, f"lr={lr},placement={placement}", "lr_sweep", placement=placement,
                         lr=lr, valid=(9.5, 9.0 if loss is None else loss), bleu=(0.0, 1.0),
                         status="diverged" if loss is None else "done",
                         diverged={"reason": "non-finite loss", "update": 3} if loss is None else None)
            (d / "updates.csv").write_text(f"update,epoch,lr,loss\n1,1,{lr},{init}\n2,1,{lr},9.9\n")


def test_results_prints_each_arm_and_seed_and_what_it_lacks(tmp_path):
    root = tmp_path / "runs"
    sweep_folder(root, {"pre_ln": {1e-4: 7.0, 1e-3: 6.0, 1e-2: 6.5},
                        "post_ln": {1e-4: 6.5, 1e-3: None}})  # post_ln lacks 1e-2; 1e-3 diverged
    proc = lnexp_main("results", str(root), "--lr-sensitivity", cache=tmp_path / "cache")
    lines = proc.stdout.splitlines()
    assert "grid 0.0001, 0.001, 0.010" in lines[0]
    pre = next(line for line in lines if line.startswith("placement=pre_ln"))
    post = next(line for line in lines if line.startswith("placement=post_ln"))
    assert pre.split()[2:6] == ["3/3", "0.001", "6.000", f"{(1.0 + 0 + 0.5) / 3:.3f}"]
    assert post.split()[2:] == ["2/3", "0.0001", "6.500", f"{(0 + 3.5) / 2:.3f}", "0.001", "0.010"]
    assert "1 of 2 arm-seeds lack lrs of the grid" in proc.stdout
    assert "placement=pre_ln: 0.500 (n=1)" in proc.stdout  # complete grids only


def test_results_says_when_a_folder_is_no_lr_sweep(tmp_path):
    root = tmp_path / "runs"
    sweep_folder(root, {"pre_ln": {1e-3: 6.0}})
    proc = lnexp_main("results", str(root), "--lr-sensitivity", cache=tmp_path / "cache")
    assert proc.returncode == 0 and "needs a sweep over lrs" in proc.stdout


@pytest.mark.slow
def test_lr_sensitivity_of_a_real_lr_sweep(tmp_path, tiny_multi30k, tiny_prepared_cache):
    """A user's own ``lnexp train -m lr=...`` sweep: its loss at init is read from updates.csv."""
    root = tmp_path / "runs"
    lnexp_main("train", "-m", "lr=0.001,0.1", f"dataset.dir={tiny_multi30k}",
               "dataset.vocab_size=600", "scale.arch=ln_transformer_mini", "depth=2",
               "scale.max_tokens=512", "max_update=2", "eval.subset=4", "placement=pre_ln",
               f"runs_root={root}", cache=tiny_prepared_cache)  # the session's prepared tiny corpus
    from lnexp.lr_sensitivity import loss_at_init, measure
    from lnexp.results import collect_runs

    runs = collect_runs(root)
    assert len(runs) == 2 and all(math.isfinite(loss_at_init(r)) for r in runs)
    grid, rows = measure(runs)
    (row,) = rows
    assert grid == [0.001, 0.1] and row.label == "all runs" and row.result.complete
    assert row.result.value >= 0 and math.isfinite(row.result.best)
    proc = lnexp_main("results", str(root), "--lr-sensitivity", cache=tiny_prepared_cache)
    assert "all runs" in proc.stdout and "2/2" in proc.stdout


def test_the_figure_draws_curves_with_the_cap_and_each_arms_interval(tmp_path):
    """lnexp.figures.lr_sensitivity from hand-made arms: the curves' CSV rows cap a diverged seed
    at its loss at init, the sensitivity rows take complete grids only, and the figure is drawn."""
    from lnexp.atlas.outcomes import Arm, Scheme
    from lnexp.figures import lr_sensitivity as F
    from lnexp.figures import style
    from lnexp.lr_sensitivity import ArmSeed
    from lnexp.stats import lr_sensitivity

    grid = [1e-4, 1e-3, 1e-2]
    rows = []
    for placement, losses in {"pre_ln": [(7.0, 6.0, 6.5), (7.2, 6.1, 6.4)],
                              "post_ln": [(6.5, math.nan, 10.5), (6.6, 6.2, None)]}.items():
        for warmup in (0, 40):
            arm = Arm(Scheme(placement), warmup, 6)
            for seed, per_lr in enumerate(losses, 1):
                final = {lr: x for lr, x in zip(grid, per_lr, strict=True) if x is not None}
                init = dict.fromkeys(final, 10.0)
                rows.append(ArmSeed(arm, seed, lr_sensitivity(final, init, grid), final, init))
    curves = F.curve_rows(rows, grid)
    post = {c["lr"]: c for c in curves if c["scheme"] == "post_ln" and c["warmup"] == 0}
    assert post[1e-3]["diverged"] == 1 and post[1e-3]["capped_mean"] == pytest.approx((10 + 6.2) / 2)
    assert post[1e-3]["mean_final_loss"] == 6.2 and post[1e-2]["seeds"] == 1  # seed 2 lacks 1e-2
    assert post[1e-2]["capped_mean"] == 10.0  # 10.5 ended above its loss at init
    sens = {(s["scheme"], s["warmup"]): s for s in F.sensitivity_rows(rows)}
    assert sens[("post_ln", 0)]["complete_seeds"] == 1 and sens[("pre_ln", 40)]["complete_seeds"] == 2
    assert sens[("pre_ln", 0)]["mean"] == pytest.approx(((1 + 0 + 0.5) / 3 + (1.1 + 0 + 0.3) / 3) / 2)
    paths = style.save(F.draw(curves, list(sens.values())), tmp_path, "atlas_lr_sensitivity")
    assert any(p.suffix == ".png" and p.stat().st_size > 10_000 for p in paths)
