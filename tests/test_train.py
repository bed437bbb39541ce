"""lnexp train end to end on real (small) Multi30k: metrics, BLEU, checkpoints, errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lnexp_main

# 2 epochs of 600 pairs (small_multi30k), or of 200 (tiny_multi30k: the runs that check what a run
# writes or says, not what it learns), cannot leave the unigram plateau: keep the plateau rule out
SMALL = ["dataset.vocab_size=600", "scale.max_tokens=800", "eval.subset=30", "divergence.plateau_epoch=99"]
# ... with BLEU on 4 validation sentences, where a run's BLEU is only a path (nothing reads its score)
SMALL_BLEU4 = [*(o for o in SMALL if not o.startswith("eval.subset=")), "eval.subset=4"]
# ... and 2+2 layers where a test checks what a run writes, not what depth 6 learns (a third of the
# CPU time of the mini model's 6+6)
PERI = ["placement=peri_ln", "optimizer=radam", "schedule=inverse_sqrt", "warmup=0", *SMALL,
        "depth.encoder_layers=2", "depth.decoder_layers=2"]


@pytest.mark.parametrize("override,needle", [
    ("placement=prelayernorm", "placement=prelayernorm is not an option of the placement group: use "
                               "one of admin, b2t, b2t_noinit, deepnorm, "),
    ("optimizer=adamw", "optimizer=adamw is not an option of the optimizer group: use one of adam"),
    ("lr=0", "lr=0 must be a positive number"),
    ("lr=-1e-3", "must be a positive number"),
    ("warmup=-10", "warmup=-10 must be a whole number"),
    ("norm=batchnorm", "norm=batchnorm is not an option of the norm group: use one of derf, dyt, "
                       "layernorm, rmsnorm, scalenorm, seednorm"),
    ("placement.input_norm=true", "input_norm and sum_norm share one norm"),
    ("learning_rate=1e-3", "Could not override 'learning_rate'"),
    ("dataset.dir=/nonexistent/multi30k", "lacks train.de.gz"),
    ("dataset=wmt14_en_de", "lnexp prepare wmt14"),
    ("checkpoint.keep_last_epochs=-1", "must be a whole number >= 0"),
])
def test_bad_overrides_one_line_exit_2(tmp_path, override, needle):
    # in-process: the command's exit status and its one line, not its process, are under test
    proc = lnexp_main("train", override, f"runs_root={tmp_path / 'runs'}", cache=tmp_path / "c",
                      check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "runs").exists()  # no run directory for a rejected config


def test_help_does_not_import_torch():
    code = ("import sys; from lnexp.cli import main; main(['--help']); "
            "sys.exit(int(any(m in sys.modules for m in ('torch', 'fairseq', 'hydra'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "lnexp train placement=pre_ln warmup=0" in proc.stdout


@pytest.fixture(scope="module")
def peri_radam_run(tmp_path_factory, tiny_multi30k, tiny_prepared_cache) -> Path:
    tmp = tmp_path_factory.mktemp("peri")
    lnexp_main("train", *PERI, "max_epoch=2", f"dataset.dir={tiny_multi30k}",
               f"runs_root={tmp / 'runs'}", cache=tiny_prepared_cache)  # in-process: its files are read
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


def test_run_writes_two_epochs_of_metrics(peri_radam_run):
    rows = [json.loads(x) for x in (peri_radam_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("updates", "lr", "train_loss", "valid_loss", "valid_bleu", "wall_s"):
            assert isinstance(r[key], float | int), key
    assert rows[1]["updates"] > rows[0]["updates"] > 0
    assert rows[1]["valid_loss"] < rows[0]["valid_loss"]
    run = json.loads((peri_radam_run / "run.json").read_text())
    assert run["config"]["placement"]["name"] == "peri_ln"
    assert run["config"]["optimizer"]["name"] == "radam"
    assert "bits" in run["units"]["loss"]
    assert run["bleu_signature"].startswith("nrefs:1")
    assert json.loads((peri_radam_run / "status.json").read_text())["status"] == "done"
    assert (peri_radam_run / ".hydra" / "config.yaml").is_file()
    # the directory is named by the overrides, sorted: one configuration, one place
    assert "optimizer=radam,placement=peri_ln" in peri_radam_run.name


def test_warmup_zero_first_update_uses_lr_max(peri_radam_run):
    with open(peri_radam_run / "updates.csv") as f:
        rows = list(csv.DictReader(f))
    lr_max = json.loads((peri_radam_run / "run.json").read_text())["config"]["lr"]
    assert float(rows[0]["lr"]) == pytest.approx(lr_max)
    assert float(rows[3]["lr"]) == pytest.approx(lr_max / 3**0.5)  # inverse sqrt, T_warmup = 1


def test_bleu_equals_sacrebleu_command_line(peri_radam_run):
    rows = [json.loads(x) for x in (peri_radam_run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        hyps = peri_radam_run / "hyps" / f"valid_epoch{r['epoch']:03d}.txt"
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("sacrebleu")), str(peri_radam_run / "hyps" / "valid.ref"),
             "-i", str(hyps), "-b", "-w", "6"], capture_output=True, text=True, check=True)
        assert float(proc.stdout.strip()) == pytest.approx(r["valid_bleu"], abs=1e-6)


def test_tensorboard_has_lr_per_update(peri_radam_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(peri_radam_run / "tb"))
    acc.Reload()
    lr = acc.Scalars("train/lr")
    last = json.loads((peri_radam_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert [e.step for e in lr] == list(range(1, last["updates"] + 1))
    assert "valid/bleu" in acc.Tags()["scalars"]


def test_checkpoint_loads_with_weights_only(peri_radam_run):
    import torch

    from lnexp.fairseq_adapter import load_checkpoint_state

    ckpt = peri_radam_run / "checkpoints" / "checkpoint_last.pt"
    state = load_checkpoint_state(ckpt)
    assert "encoder.layers.0.final_out_norm.weight" in state["model"]
    assert state["extra_state"]["lnexp"]["history"][-1]["epoch"] == 2
    # the allow-list is registered, not the check switched off: arbitrary classes still fail
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.save({"x": Path("/")}, peri_radam_run / "evil.pt")
        torch.load(peri_radam_run / "evil.pt", weights_only=True)


def test_finished_run_is_skipped(peri_radam_run, tiny_multi30k, tiny_prepared_cache):
    before = (peri_radam_run / "metrics.jsonl").stat().st_mtime
    cache = tiny_prepared_cache  # in-process: the command's decision and what it says are under test
    proc = lnexp_main("train", *PERI, "max_epoch=2", f"dataset.dir={tiny_multi30k}",
                      f"runs_root={peri_radam_run.parent}", cache=cache)
    assert "skipping" in proc.stderr + proc.stdout
    assert (peri_radam_run / "metrics.jsonl").stat().st_mtime == before


def test_sgd_with_warmup_runs(tmp_path, tiny_multi30k, tiny_prepared_cache):
    lnexp_main("train", "optimizer=sgd", "lr=5e-3", "warmup=5", "max_epoch=2",
               f"dataset.dir={tiny_multi30k}", *SMALL_BLEU4, "depth.encoder_layers=2",
               "depth.decoder_layers=2", f"runs_root={tmp_path / 'runs'}", cache=tiny_prepared_cache)
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2


def test_raising_max_epoch_extends_the_finished_run(peri_radam_run, tiny_multi30k, tmp_path,
                                                    tiny_prepared_cache):
    """max_epoch does not name the run: a longer run continues the finished one in its folder."""
    import shutil

    from lnexp import fairseq_adapter as fa

    runs = tmp_path / "runs"
    shutil.copytree(peri_radam_run, runs / peri_radam_run.name)
    before = (peri_radam_run / "metrics.jsonl").read_text().splitlines()
    # the checkpoint as the first versions wrote it: lnexp's state a plain dict, without the keys
    # added later (overflows, saved_update, signature); it resumes all the same
    ckpt = runs / peri_radam_run.name / "checkpoints" / "checkpoint_last.pt"
    state = fa.load_checkpoint_state(ckpt)
    old = state["extra_state"]["lnexp"]
    state["extra_state"]["lnexp"] = {k: old[k] for k in ("history", "wall_s", "acc", "diverged")}
    fa.save_checkpoint_file(state, ckpt)
    proc = lnexp_main("train", *PERI, "max_epoch=3", f"dataset.dir={tiny_multi30k}", f"runs_root={runs}",
                      cache=tiny_prepared_cache)  # in-process: the run's files and first line are read
    n = json.loads(before[-1])["updates"]
    first = proc.stdout.strip().splitlines()[0]  # the run's first line says what it continues
    assert first.endswith(f"{runs / peri_radam_run.name}: extends the earlier run from update {n} (it was "
                          f"done at {n} updates, 2 epochs) to max_epoch=3; metrics.jsonl is appended to")
    assert [d.name for d in runs.iterdir()] == [peri_radam_run.name]
    after = (runs / peri_radam_run.name / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == before and json.loads(after[2])["epoch"] == 3
    with open(runs / peri_radam_run.name / "updates.csv") as f:
        updates = [int(r["update"]) for r in csv.DictReader(f)]
    assert updates == list(range(1, len(updates) + 1)) and updates[-1] == json.loads(after[2])["updates"]
    saved = fa.load_checkpoint_state(ckpt)["extra_state"]["lnexp"]
    assert saved["saved_update"] == updates[-1] and saved["overflows"] == 0 and saved["signature"]


def test_run_state_reads_the_checkpoint_dict_of_every_version():
    """RunState <-> extra_state["lnexp"]: the dict before the type existed (some keys missing)
    gives the defaults; what it writes is that dict with every key."""
    from lnexp.train.state import RunState, zero_sums

    old = {"history": [{"epoch": 1, "updates": 6}], "wall_s": 3.5, "acc": zero_sums(),
           "diverged": None}
    state = RunState.from_checkpoint({"lnexp": old})
    assert state.history == old["history"] and state.overflows == 0
    assert state.checkpoint_update() == 6  # no saved_update: the last epoch's
    assert state.to_checkpoint() == {**old, "overflows": 0, "saved_update": None, "signature": None,
                                     "profiled_init": None, "plateau": None, "left_plateau": None}
    # an older checkpoint's plateau was "diverged": it resumes as the plateau verdict, no divergence
    seen = RunState.from_checkpoint({"lnexp": {**old, "diverged": {
        "reason": "plateau: valid nll 9.07 bits >= unigram entropy 7.49 - 0.5", "update": 16, "epoch": 2}}})
    assert seen.diverged is None and seen.plateau == {
        "reason": "valid nll 9.07 bits >= unigram entropy 7.49 - 0.5", "update": 16, "epoch": 2}
    assert RunState.from_checkpoint(None) == RunState()
    assert RunState.from_checkpoint({"lnexp": state.to_checkpoint()}) == state


def test_headline_recipe_and_progress_lines(tmp_path, tiny_multi30k, tiny_prepared_cache):
    """`placement=pre_ln warmup=0` trains with Pre-LN's recipe (lr held), says so, and shows
    progress inside the epoch; a depth sweep runs as typed."""
    # in-process (Hydra's basic launcher runs the sweep's jobs in it): what the command says
    proc = lnexp_main("train", "-m", "placement=pre_ln", "warmup=0", "depth=1,2", "max_update=4",
                      "log_interval=2", f"dataset.dir={tiny_multi30k}", *SMALL_BLEU4,
                      f"runs_root={tmp_path / 'runs'}", cache=tiny_prepared_cache)
    out = proc.stdout + proc.stderr
    assert "schedule: step: lr_max 0.001, no warm-up, lr_max held, x0.1 from epoch 8" in out
    assert "epoch 1 | 2/" in out and "| update 4 | loss " in out and "tok/s" in out
    assert "stopped at max_update=4" in out
    for depth in (1, 2):
        (run_dir,) = (tmp_path / "runs").glob(f"*depth={depth},*")
        run = json.loads((run_dir / "run.json").read_text())
        assert run["config"]["depth"] == {"encoder_layers": depth, "decoder_layers": depth}
        assert "Pre-LN's recipe" in run["schedule"]
        with open(run_dir / "updates.csv") as f:
            assert {float(r["lr"]) for r in csv.DictReader(f)} == {1e-3}


def test_sigterm_marks_the_run_interrupted(tmp_path, small_multi30k, prepared_cache):
    import os
    import signal
    import time

    from lnexp.results import collect_runs
    from tests.conftest import REPO

    runs = tmp_path / "runs"
    env = {**os.environ, "LNEXP_CACHE": str(prepared_cache), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "lnexp.cli", "train", "max_update=1000",
                             "save_interval_updates=2", "log_interval=1", f"dataset.dir={small_multi30k}",
                             *SMALL, "depth.encoder_layers=2", "depth.decoder_layers=2",
                             f"runs_root={runs}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list(runs.glob("*/checkpoints/checkpoint_last.pt")):
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted; finished work is kept" in err
    (run,) = collect_runs(runs)
    assert run.state == "interrupted" and run.status["resumes_from"] >= 2


def test_a_short_run_ends_done_not_diverged_and_a_plateau_without_stop_trains_on(tmp_path, tiny_multi30k,
                                                                                 tiny_prepared_cache):
    """A run too short for the plateau rule (9 updates < divergence.plateau_min_updates) ends done,
    however far from trained (a 100-bit margin puts every loss on the plateau), and says so; once the
    rule applies (plateau_min_updates=0) it ends plateau, never diverged, judged by its last epoch,
    and with divergence.stop=false (the default) it trained and validated every epoch."""
    from lnexp.results import collect_runs
    from tests.conftest import TINY, lnexp_main

    # TINY's model on tiny_multi30k (3 updates an epoch); few other keys, so that the run folder's
    # name stays a legal file name
    over = [o for o in TINY if o.startswith(("dataset.", "depth."))]
    runs = tmp_path / "runs"
    for extra in ([], ["divergence.plateau_min_updates=0"]):
        lnexp_main("train", f"dataset.dir={tiny_multi30k}", *over, "max_epoch=3",
                   "divergence.plateau_epoch=1", "divergence.plateau_margin=100", *extra,
                   "eval.subset=4", f"runs_root={runs}", cache=tiny_prepared_cache)  # BLEU: a path
    short, judged = sorted(collect_runs(runs), key=lambda r: "plateau_min_updates" in r.name)
    assert [r["epoch"] for r in judged.metrics] == [1, 2, 3]
    n = judged.metrics[-1]["updates"]
    assert short.state == "done" and short.status["plateau"] is None and short.diverged is None
    assert short.row()["note"] == (f"plateau rule not applied: {n} updates < "
                                   "divergence.plateau_min_updates=100")
    assert judged.state == "plateau" and judged.diverged is None and not judged.status["ended_early"]
    assert judged.plateau["epoch"] == 3 and judged.plateau["update"] == n  # the last verdict
    assert judged.row()["note"].startswith(f"plateau at {n} updates, 3/3 epochs: valid nll ")


def test_a_run_that_leaves_the_plateau_does_not_end_on_it(tmp_path, small_multi30k, tiny_run,
                                                          monkeypatch):
    """The plateau verdict of each epoch replaces the one before: with the plateau put between the
    first and the last epoch's loss of the same training (tiny_run's), the run is on it after epoch 1
    and ends done, off it, saying where it left it."""
    from lnexp.results import load_run
    from lnexp.train import divergence
    from tests.conftest import TINY, lnexp_main

    before = load_run(tiny_run).metrics
    first, last = before[0]["valid_nll_loss"], before[-1]["valid_nll_loss"]
    assert first - last > 0.05  # the plateau fits between them
    monkeypatch.setattr(divergence, "unigram_entropy_bits", lambda *a, **k: (first + last) / 2)
    over = [o for o in TINY if not o.startswith("divergence.")]
    lnexp_main("train", f"dataset.dir={small_multi30k}", *over, "divergence.plateau_epoch=1",
               "divergence.plateau_margin=0", "divergence.plateau_min_updates=0", "eval.subset=4",
               f"runs_root={tmp_path / 'runs'}", cache=tiny_run.parents[1] / "cache")
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = load_run(run_dir)
    assert [r["valid_nll_loss"] for r in run.metrics] == pytest.approx([first, last], abs=0.01)
    assert run.state == "done" and run.plateau is None and run.diverged is None
    assert run.status["left_plateau"] == {"update": run.metrics[-1]["updates"], "epoch": 2}
    assert run.row()["note"] == f"left the unigram plateau at update {run.metrics[-1]['updates']}, epoch 2"


def test_a_nan_run_ends_diverged(tmp_path, small_multi30k, prepared_cache):
    """lr=1e30 makes the weights, then the loss, non-finite within the first updates: the run stops
    there, diverged (the atlas counts it as a failure)."""
    from lnexp.figures.atlas import outcome
    from lnexp.results import collect_runs
    from tests.conftest import lnexp_main

    lnexp_main("train", f"dataset.dir={small_multi30k}", *SMALL, "depth.encoder_layers=1",
               "depth.decoder_layers=1", "lr=1e30", "warmup=0", "schedule=constant", "max_update=6",
               f"runs_root={tmp_path / 'runs'}", cache=prepared_cache)
    (run,) = collect_runs(tmp_path / "runs")
    assert run.state == "diverged" and run.status["ended_early"] and run.plateau is None
    assert run.diverged["reason"] == "non-finite loss or gradient" and run.diverged["update"] <= 6
    assert outcome(run) == "diverged"
    assert run.row()["note"].startswith(f"diverged at update {run.diverged['update']}, epoch 1: ")


def test_a_trial_run_says_stopped_and_the_full_run_extends_it(tmp_path, small_multi30k, tiny_run):
    """max_update does not name the run: a trial run of 3 updates takes the folder of the real run,
    so `lnexp results` says it stopped short, and the real run's first line says that it extends
    that one from update 3."""
    from lnexp.results import main as results
    from tests.conftest import TINY, lnexp_main

    runs, cache = tmp_path / "runs", tiny_run.parents[1] / "cache"
    bleu4 = "eval.subset=4"  # (BLEU only a path here; eval.subset does not name the run)
    trial = lnexp_main("train", f"dataset.dir={small_multi30k}", *TINY, "max_update=3", bleu4,
                       f"runs_root={runs}", cache=cache).stdout
    (run_dir,) = runs.iterdir()
    assert f"{run_dir}: stopped after 1 epoch\n" in trial  # (counts are said as a reader says them)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "stopped" and status["updates"] == 3 and not status["last_epoch_complete"]
    listed = lnexp_main("results", str(runs), cache=cache).stdout  # the runs root given as a word
    (row,) = [line for line in listed.splitlines() if line.startswith(run_dir.name)]
    assert row.endswith(" stopped  stopped at 3 updates, 1/2 epochs: max_update=3")
    assert listed.splitlines()[-1].startswith("1 run: 1 stopped")
    assert results([str(runs), "status=stopped", "--csv", str(tmp_path / "r.csv")]) == 0
    assert [r["note"] for r in csv.DictReader(open(tmp_path / "r.csv"))] == [
        "stopped at 3 updates, 1/2 epochs: max_update=3"]
    # (in-process too: what they say is what a user reads; Hydra logs to stdout)
    again = lnexp_main("train", f"dataset.dir={small_multi30k}", *TINY, "max_update=3", bleu4,
                       f"runs_root={runs}", cache=cache).stdout
    assert "already stopped at 3 updates, 1/2 epochs: max_update=3, skipping" in again
    full = lnexp_main("train", f"dataset.dir={small_multi30k}", *TINY, bleu4, f"runs_root={runs}",
                      cache=cache)
    first = full.stdout.strip().splitlines()[0]
    assert first.endswith(f"{run_dir}: extends the earlier run from update 3 (it was stopped at 3 "
                          "updates, 1/2 epochs: max_update=3) to max_epoch=2; metrics.jsonl is appended to")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "done" and status["epoch"] == 2 and status["last_epoch_complete"]
    assert status["updates"] == json.loads((tiny_run / "status.json").read_text())["updates"]
