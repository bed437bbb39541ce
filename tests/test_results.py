"""`lnexp results`: the table, filters and CSV; plateau and failed runs of a real sweep."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.conftest import lnexp_cmd, lnexp_main
from tests.test_figures_fig2_fig4 import fake_run


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "runs"
    # (as an older lnexp wrote a plateau: status diverged, its reason "plateau: ...")
    fake_run(root, "a", "fig2_mini", warmup=0, valid=(9.0, 8.9), bleu=(0.1, 0.2), status="diverged",
             diverged={"reason": "plateau: valid nll ...", "update": 260, "epoch": 2})
    fake_run(root, "b", "fig2_mini", warmup=100, valid=(8.0, 7.1), bleu=(2.0, 6.7))
    fake_run(root, "c", "fig4_mini", placement="pre_ln", lr=5e-4, valid=(7.0, 6.2), bleu=(9.0, 13.8))
    (root / "d" / ".hydra").mkdir(parents=True)  # failed before run.json: config from Hydra's files
    (root / "d" / ".hydra" / "config.yaml").write_text(
        "placement: {name: post_ln}\noptimizer: {name: sgd}\nlr: 0.005\nwarmup: 0\nseed: 1\n")
    (root / "d" / ".hydra" / "overrides.yaml").write_text("- experiment=fig2_sgd_mini\n")
    (root / "d" / "status.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    return root


def test_collect_runs_and_filters(store):
    from lnexp.results import collect_runs

    assert [r.name for r in collect_runs(store)] == ["a", "b", "c", "d"]
    assert [r.name for r in collect_runs(store, placement="post_ln", warmup="0")] == ["a", "d"]
    assert [r.name for r in collect_runs(store, lr="1e-3")] == ["a", "b"]  # numbers as numbers
    assert [r.name for r in collect_runs(store, status="plateau")] == ["a"]  # read in today's words
    assert collect_runs(store, status="diverged") == []
    assert [r.name for r in collect_runs(store, **{"dataset.name": "multi30k"})] == ["a", "b", "c"]
    row = collect_runs(store, experiment="fig2_mini", warmup=100)[0].row()
    assert row["best_valid_loss"] == 7.1 and row["best_bleu"] == 6.7 and row["epochs"] == 2
    assert row["depth"] == "6+6"


def test_a_damaged_status_file_is_said_not_read_as_pending(store):
    """A status.json that is not JSON (a binary file) is ``damaged`` with a note saying how to
    mend it, never ``pending``; the run's other files are still read."""
    from lnexp.results import collect_runs

    (store / "b" / "status.json").write_bytes(b"\x00\x9f\x92\x96 not json")
    run = next(r for r in collect_runs(store) if r.name == "b")
    row = run.row()
    assert row["status"] == "damaged" and row["best_valid_loss"] == 7.1
    assert "not readable JSON" in row["note"] and "lnexp train" in row["note"]


def test_results_cli_table_and_csv(store, tmp_path):
    from lnexp.results import main

    proc = lnexp_main("results", "--runs-root", str(store), cache=tmp_path / "cache")
    lines = proc.stdout.splitlines()
    header = lines[0].split()
    for col in ("placement", "optimizer", "lr", "warmup", "schedule", "depth", "seed", "epochs",
                "best_valid", "best_bleu", "status", "note"):
        assert col in header
    row_a = next(ln for ln in lines if ln.startswith("a "))
    assert row_a.endswith(" plateau  plateau at 260 updates, 2/2 epochs: valid nll ...")
    assert "failed" in next(ln for ln in lines if ln.startswith("d ")).split()
    assert "1 done" not in lines[-1] and "2 done" in lines[-1] and "1 plateau" in lines[-1]
    out = tmp_path / "res.csv"
    assert main(["--runs-root", str(store), "--csv", str(out), "status=plateau"]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(r["run"], r["status"], r["diverged_update"]) for r in rows] == [("a", "plateau", "")]
    assert rows[0]["note"] == "plateau at 260 updates, 2/2 epochs: valid nll ..."
    # the runs root as a word, before or after the filters
    assert lnexp_main("results", str(store), cache=tmp_path / "cache").stdout == proc.stdout
    assert main(["status=plateau", str(store), "--csv", str(out)]) == 0
    assert out.read_text() == to_csv_of(store, "plateau")
    bad = lnexp_main("results", str(tmp_path / "nowhere"), cache=tmp_path / "cache", check=False)
    assert bad.returncode == 2 and f"no runs root {tmp_path / 'nowhere'}: name a folder" in bad.stderr
    bad = lnexp_main("results", "--runs-root", str(store), "status=bogus", cache=tmp_path / "cache",
                     check=False)
    assert bad.returncode == 2 and "status='bogus'" in bad.stderr
    bad = lnexp_main("results", "--runs-root", str(store), "placement", cache=tmp_path / "cache",
                     check=False)
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr


def to_csv_of(root, status: str) -> str:
    from lnexp.results import collect_runs, to_csv

    return to_csv([r.row() for r in collect_runs(root, status=status)])


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [
    [], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "threads=1"],
    ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5"]], ids=["basic", "joblib", "submitit"])
def test_sweep_lists_diverged_and_failed_runs(tmp_path, small_multi30k, prepared_cache, launcher):
    """One run fails at run time (batches too small for any sentence: fairseq raises), the other
    ends on the plateau (the rule forced); the sweep goes on and `lnexp results` lists both. With
    joblib or submitit the runs are in other processes, and the exit status still reports the
    failed one."""
    runs, cache = tmp_path / "runs", prepared_cache
    # Hydra's basic launcher: the runs in this process; submitit's: each run a process of its own,
    # started from this one; joblib's loky workers outlive a launch (reused later in the process that
    # started them, with its environment of then): that launch in a process of its own
    run = lnexp_cmd if "hydra/launcher=joblib" in launcher else lnexp_main
    proc = run("train", "-m", f"dataset.dir={small_multi30k}", "dataset.vocab_size=600",
               "eval.subset=4", "depth.encoder_layers=2", "depth.decoder_layers=2",
               "scale.max_tokens=5,600",
               "max_update=3", "divergence.plateau_epoch=1", "divergence.plateau_margin=100",
               "divergence.plateau_min_updates=0",
               f"runs_root={runs}", *launcher, cache=cache, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]  # a failed run is reported in the exit status
    assert not list(runs.glob(".lnexp-failures-*"))  # the workers' failure file is cleaned up
    res = lnexp_main("results", "--runs-root", str(runs), "--csv", cache=cache)
    rows = {r["status"]: r for r in csv.DictReader(io.StringIO(res.stdout))}
    assert set(rows) == {"failed", "plateau"}
    assert rows["plateau"]["updates"] == "3" and rows["plateau"]["epochs"] == "1"
    assert rows["plateau"]["note"].startswith("plateau at 3 updates, 1/2 epochs: valid nll ")
    assert not rows["plateau"]["diverged_update"]  # a plateau is not a divergence
    table = lnexp_main("results", "--runs-root", str(runs), "status=plateau", cache=cache).stdout
    line = table.splitlines()[1].split()
    assert "plateau" in line and "3" in line


def test_group_by_gives_seed_statistics_per_group(tmp_path, capsys):
    """--group-by: mean, std, n and the 95% t-interval per group, in the table and the CSV."""
    from scipy import stats

    from lnexp.results import main

    root = tmp_path / "runs"
    finals = {("post_ln", 1): 7.0, ("post_ln", 2): 7.2, ("post_ln", 3): 7.4, ("pre_ln", 1): 6.2,
              ("pre_ln", 2): 6.4}
    for (placement, seed), v in finals.items():
        fake_run(root, f"{placement}_s{seed}", "fig4_mini", placement=placement, seed=seed,
                 valid=(v + 1, v), bleu=(1.0, 10 - v))
    fake_run(root, "pre_ln_lr", "fig4_mini", placement="pre_ln", lr=5e-4, seed=3, valid=(7.6, 6.6),
             bleu=(1.0, 3.4))
    assert main(["--runs-root", str(root), "--group-by", "placement"]) == 0
    out = capsys.readouterr().out.splitlines()
    post = next(ln for ln in out if ln.startswith("post_ln"))
    half = stats.t.ppf(0.975, 2) * 0.2 / 3 ** 0.5  # std of 7.0, 7.2, 7.4 is 0.2
    assert f"7.200 ± {half:.3f} (n=3)" in post and "1,2,3" in post
    pre = next(ln for ln in out if ln.startswith("pre_ln"))
    assert "(n=3)" in pre and pre.rstrip().endswith("lr")  # the lr runs are pooled, and it says so
    assert "2 groups of 6 runs" in out[-1]
    assert main(["--runs-root", str(root), "--group-by", "placement,lr", "--csv", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["placement"], r["lr"], r["n"]) for r in rows] == [
        ("post_ln", "0.001", "3"), ("pre_ln", "0.0005", "1"), ("pre_ln", "0.001", "2")]
    lo, hi = float(rows[2]["best_valid_loss_ci_low"]), float(rows[2]["best_valid_loss_ci_high"])
    assert (lo + hi) / 2 == pytest.approx(6.3) and hi - lo == pytest.approx(
        2 * stats.t.ppf(0.975, 1) * stats.tstd([6.2, 6.4]) / 2 ** 0.5)
    assert rows[1]["best_valid_loss_std"] == "nan" and rows[2]["varies"] == ""
    from lnexp.errors import UserError

    with pytest.raises(UserError, match="did you mean placement"):
        main(["--runs-root", str(root), "--group-by", "placment"])


def test_a_groups_varies_names_config_values_not_text_or_reporting(tmp_path, capsys):
    """--group-by's "varies" names the config values that differ inside a group (issue 49 found
    `placement.about.color` there): not a placement's description, not how a run reports."""
    from lnexp.results import main

    root = tmp_path / "runs"
    about = {"post_ln": {"label": "Post-LN", "color": "#1f77b4"},
             "pre_ln": {"label": "Pre-LN", "color": "#ff7f0e"}}
    for name, placement, seed, subset in (("a", "post_ln", 1, 0), ("b", "pre_ln", 1, 100),
                                          ("c", "post_ln", 2, 0)):
        fake_run(root, name, "fig4_mini", seed=seed, extra={
            "placement": {"name": placement, "about": about[placement]}, "eval": {"subset": subset}})
    assert main(["--runs-root", str(root), "--group-by", "seed", "--csv", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["seed"]: r["varies"] for r in rows} == {"1": "placement.name", "2": ""}


def test_group_by_never_pools_runs_of_another_length_or_status(tmp_path, capsys):
    """A 5-update trial run, or a diverged seed, is never averaged with the finished 256-update
    runs of its group (issue 42: `post_ln 10.104 ± 40.462` pooled both): each length and status
    has its own row, and the table says so."""
    from lnexp.results import main

    root = tmp_path / "runs"
    for seed, v in ((1, 7.0), (2, 7.2)):
        fake_run(root, f"post_s{seed}", "fig4_mini", seed=seed, valid=(v + 1, v),
                 extra={"max_update": 256})
    fake_run(root, "post_trial", "fig4_mini", seed=3, valid=(13.0,), bleu=(0.0,),
             extra={"max_update": 5})
    fake_run(root, "post_div", "fig4_mini", seed=4, valid=(9.0, 8.9), status="diverged",
             extra={"max_update": 256})
    assert main(["--runs-root", str(root), "--group-by", "placement", "--csv", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    got = {(r["length"], r["status"]): (r["n"], r["seeds"], float(r["best_valid_loss_mean"]))
           for r in rows}
    assert got == {("256 updates", "done"): ("2", "1,2", pytest.approx(7.1)),
                   ("5 updates", "done"): ("1", "3", 13.0),
                   ("256 updates", "diverged"): ("1", "4", 8.9)}
    assert all(r["varies"] == "" for r in rows)  # max_update is a row of its own, not a note
    assert main(["--runs-root", str(root), "--group-by", "placement"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["placement", "length", "status"]
    assert sum(ln.startswith("post_ln") for ln in out) == 3
    assert "never pooled" in out[-1]
