"""lnexp evaluate / translate / plot and the fairseq plugin, on one real tiny run (2 epochs)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, lnexp_cmd
from tests.test_figures_fig2_fig4 import fake_run


def lnexp(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (torch stays imported between calls): (status, stdout, stderr)."""
    from lnexp.cli import main

    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def evaluate(capsys, run: Path, *args: str) -> dict:
    rc, out, err = lnexp(capsys, "evaluate", str(run), "--json", *args)
    assert rc == 0, err
    return json.loads(out.strip().splitlines()[-1])


def sacrebleu_cli(*args: str) -> float:
    exe = str(Path(sys.executable).with_name("sacrebleu"))
    proc = subprocess.run([exe, *args, "-b", "-w", "6"], capture_output=True, text=True, check=True)
    return float(proc.stdout.strip())


def test_epoch_checkpoints_are_kept(tiny_run):
    names = sorted(p.name for p in (tiny_run / "checkpoints").iterdir())
    assert names == ["checkpoint1.pt", "checkpoint2.pt", "checkpoint_best.pt", "checkpoint_last.pt",
                     "checkpoint_previous.pt"]


def test_keep_epoch_deletes_all_but_the_last_n(tmp_path):
    from lnexp.train.epoch_checkpoints import epoch_checkpoints, keep_epoch

    for epoch in range(1, 5):  # the loop replaces checkpoint_last.pt, never rewrites it in place
        (tmp_path / "new.pt").write_text(f"epoch {epoch}")
        (tmp_path / "new.pt").replace(tmp_path / "checkpoint_last.pt")
        keep_epoch(tmp_path, epoch, keep=2)
    assert [(e, p.read_text()) for e, p in epoch_checkpoints(tmp_path)] == [(3, "epoch 3"), (4, "epoch 4")]
    keep_epoch(tmp_path, 5, keep=0)
    assert len(epoch_checkpoints(tmp_path)) == 2


def test_bleu_equals_sacrebleu_on_the_written_files(tiny_run, capsys):
    r = evaluate(capsys, tiny_run, "--beam", "2")
    for key in ("bleu", "signature", "hyps", "refs", "n", "fairseq_command", "chrf"):
        assert r[key] is not None, key
    assert r["n"] == 40 and r["set"] == "test" and r["checkpoint"] == "best"
    assert len(Path(r["hyps"]).read_text().splitlines()) == 40
    assert r["bleu"] == pytest.approx(sacrebleu_cli(r["refs"], "-i", r["hyps"]), abs=1e-6)
    assert r["chrf"] == pytest.approx(sacrebleu_cli(r["refs"], "-i", r["hyps"], "-m", "chrf"), abs=1e-6)
    assert r["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    record = Path(r["hyps"]).with_name("record.json")
    assert json.loads(record.read_text()) == r


def test_decoding_shows_its_progress(tiny_run, capsys):
    """A beam search of minutes printed nothing (issue 42): evaluate says how far it is, on stderr,
    and its time left follows the source tokens still to decode (batches come shortest first)."""
    from lnexp.runtime.progress import DecodeProgress

    rc, out, err = lnexp(capsys, "evaluate", str(tiny_run), "--beam", "2")
    assert rc == 0 and f"decoding test of {tiny_run.name}: 40/40 sentences (100%)" in err
    assert err.rstrip().endswith("| done") and "decoding" not in out
    shown = io.StringIO()
    progress = DecodeProgress("test", sentences=10, tokens=100, every_s=0.0, stream=shown)
    progress._t0 -= 10.0  # as if decoding began 10 s ago
    line = progress.step(5, 20)  # half the sentences, a fifth of the tokens: 4 x 10 s to go
    assert line == "decoding test: 5/10 sentences (50%) | 0m10s | ~0m40s left"
    assert progress.step(5, 80).endswith("| done") and shown.getvalue().count("\n") == 2


def test_defaults_are_the_datasets_beam_and_lenpen(tiny_run, capsys):
    rc, out, _ = lnexp(capsys, "evaluate", str(tiny_run), "--split", "valid", "--checkpoint", "last")
    assert rc == 0
    config = json.loads((tiny_run / "run.json").read_text())["config"]
    assert (config["eval"]["beam"], config["dataset"]["beam"]) == (1, 5)  # mini trains greedy
    first = out.splitlines()[0]
    assert "valid (60 sentences), checkpoint last, beam 5, lenpen 1" in first
    bleu_line = next(ln for ln in out.splitlines() if ln.strip().startswith("BLEU "))
    record = json.loads((tiny_run / "eval" / "valid.last.beam5.lenpen1" / "record.json").read_text())
    assert bleu_line.split()[1] == f"{record['bleu']:.2f}"


def test_stock_fairseq_generate_reproduces_averaged_hypotheses(tiny_run, capsys):
    """avg2 = fairseq's average of the two epoch checkpoints; the printed fairseq-generate command
    (lnexp's --user-dir, same beam/lenpen/batches) loads it and prints the same hypotheses, one
    for every sentence."""
    import torch

    from lnexp.fairseq_adapter import load_checkpoint_state

    r = evaluate(capsys, tiny_run, "--checkpoint", "avg2", "--beam", "3", "--lenpen", "1.2",
                 "--batch-size", "16", "--split", "valid")  # 4 batches: the length limit depends on
    # the batch; 60 sentences: fairseq-generate's default batching would drop the last 4
    avg = load_checkpoint_state(Path(r["checkpoint_path"]))["model"]
    one, two = (load_checkpoint_state(tiny_run / "checkpoints" / f"checkpoint{e}.pt")["model"]
                for e in (1, 2))
    key = "encoder.layers.0.fc1.weight"
    assert not torch.equal(one[key], two[key])
    assert torch.allclose(avg[key], (one[key] + two[key]) / 2)
    assert "--beam 3 --lenpen 1.2" in r["fairseq_command"] and "--batch-size 16" in r["fairseq_command"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", r["fairseq_command"]], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ours = Path(r[r["fairseq_output"]]).read_text().splitlines()
    assert len(set(ours)) > 10  # the outputs differ between sentences: the comparison means something
    assert proc.stdout.splitlines() == ours and len(ours) == 60


def test_raw_test_set_is_prepared_as_the_test_split(tiny_run, small_multi30k, capsys):
    split = evaluate(capsys, tiny_run, "--beam", "2")
    raw = evaluate(capsys, tiny_run, "--beam", "2", "--src", str(small_multi30k / "test_2016_flickr.de.gz"),
                   "--ref", str(small_multi30k / "test_2016_flickr.en.gz"))
    assert raw["set"] == "test_2016_flickr" and raw["n"] == 40
    assert Path(raw["hyps"]).read_text() == Path(split["hyps"]).read_text()
    assert Path(raw["refs"]).read_text() == Path(split["refs"]).read_text()
    assert raw["bleu"] == split["bleu"]
    assert "--dataset-impl raw" in raw["fairseq_command"]


def test_translate_stdin_as_evaluate_translates(tiny_run, small_multi30k, capsys, monkeypatch):
    from lnexp.data.text import read_lines

    src = read_lines(small_multi30k / "test_2016_flickr.de.gz")[:6]
    hyps = evaluate(capsys, tiny_run, "--beam", "2")["hyps"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join([*src[:3], "", *src[3:]]) + "\n"))
    rc, out, err = lnexp(capsys, "translate", str(tiny_run), "--beam", "2")
    assert rc == 0, err
    expected = Path(hyps).read_text().splitlines()[:6]
    assert out.splitlines() == [*expected[:3], "", *expected[3:]]


@pytest.mark.parametrize("args,needle", [
    (["evaluate", "{tmp}"], "is not a run folder"),
    (["evaluate", "{tmp}/nowhere"], "no such folder"),
    (["evaluate", "{run}", "--src", "{tmp}/x.de"], "--src and --ref go together"),
    (["evaluate", "{run}", "--src", "{tmp}/x.de", "--ref", "{tmp}/short.en"], "must be line-aligned"),
    (["evaluate", "{run}", "--src", "{tmp}/x.en", "--ref", "{tmp}/x.de"], "pass the de side as --src"),
    (["evaluate", "{run}", "--checkpoint", "avg3"], "checkpoint.keep_last_epochs=3"),
    (["evaluate", "{run}", "--checkpoint", "newest"], "is not best, last or avgN"),
    (["evaluate", "{empty}"], "has no checkpoint_best.pt"),
    (["translate", "{empty}"], "has no checkpoint_best.pt"),
])
def test_bad_input_one_line_exit_2(tiny_run, tmp_path, capsys, args, needle):
    for name, n in (("x.de", 3), ("x.en", 3), ("short.en", 2)):
        (tmp_path / name).write_text("Ein Hund .\n" * n)
    empty = tmp_path / "empty_run"  # a run folder whose checkpoints are gone
    empty.mkdir()
    (empty / "run.json").write_text((tiny_run / "run.json").read_text())
    fill = {"tmp": str(tmp_path), "run": str(tiny_run), "empty": str(empty)}
    rc, out, err = lnexp(capsys, *[a.format(**fill) for a in args])
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err


def test_results_show_test_bleu_without_torch(tiny_run, capsys):
    r = evaluate(capsys, tiny_run, "--beam", "2")
    code = ("import sys; from lnexp.cli import main; rc = main(['results', '--runs-root', sys.argv[1]]); "
            "sys.exit(rc or int(any(m in sys.modules for m in ('torch', 'fairseq'))))")
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_run.parent)], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()[:2]
    for col in ("dataset", "scale", "norm", "dt", "params", "test_bleu(ckpt)"):
        assert col in header.split()
    params = json.loads((tiny_run / "run.json").read_text())["params"]
    assert f"{params / 1e6:.1f}M" in row.split() and f"{r['bleu']:.2f}(best)" in row.split()
    assert {"multi30k", "mini", "layernorm"} <= set(row.split())


def test_unknown_filter_key_is_one_line_exit_2(tmp_path):
    fake_run(tmp_path / "runs", "a", "fig2_mini")
    proc = lnexp_cmd("results", "--runs-root", str(tmp_path / "runs"), "placment=pre_ln",
                     cache=tmp_path / "c", check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "unknown filter key 'placment'" in line and "did you mean placement" in line


def test_plot_marks_diverged_runs_and_names_what_differs(tmp_path, capsys):
    from lnexp.figures.plot import label, legend_keys
    from lnexp.results import collect_runs

    root = tmp_path / "runs"
    fake_run(root, "post_w0", "x", warmup=0, valid=(9.0, 8.9), status="diverged",
             diverged={"reason": "non-finite loss or gradient", "update": 260, "epoch": 2})
    fake_run(root, "pre_w0", "x", placement="pre_ln", warmup=0, valid=(8.0, 7.0))
    fake_run(root, "post_w100", "x", warmup=100, valid=(8.5, 7.5))
    (root / "post_w0").rename(root / "warmup=0")  # run folders are named by their overrides
    runs = collect_runs(root)
    assert legend_keys(runs) == ["placement.name", "warmup"]
    assert [label(r, legend_keys(runs)) for r in runs] == [
        "placement=post_ln, warmup=100", "placement=pre_ln, warmup=0",
        "placement=post_ln, warmup=0 [diverged]"]
    rc, out, err = lnexp(capsys, "plot", str(root / "warmup=0"), str(root / "pre_w0"), "--x", "updates",
                         "--out", str(tmp_path / "fig" / "cmp.png"))
    assert rc == 0, err
    for ext in ("png", "pdf", "csv"):
        assert (tmp_path / "fig" / f"cmp.{ext}").stat().st_size > 0
    rows = (tmp_path / "fig" / "cmp.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 2  # 2 runs x 2 metrics x 2 epochs
    assert sum("placement=post_ln [diverged]" in r for r in rows) == 4
    rc, _, err = lnexp(capsys, "plot", "--runs-root", str(root), "warmup=100", "--metric", "valid_blue",
                       "--out", str(tmp_path / "f"))
    assert rc == 2 and "no run logged 'valid_blue'" in err
    # per-update curves come from updates.csv, on the updates axis only
    (root / "pre_w0" / "updates.csv").write_text("update,epoch,lr,loss\n1,1,0.001,9.5\n2,1,0.001,9.1\n")
    rc, _, err = lnexp(capsys, "plot", str(root / "pre_w0"), "--x", "updates", "--metric", "loss,valid_loss",
                       "--out", str(tmp_path / "fig" / "upd"))
    assert rc == 0, err
    rows = (tmp_path / "fig" / "upd.csv").read_text().splitlines()
    assert sum(r.endswith((",loss,1,9.5,1,,", ",loss,2,9.1,1,,")) for r in rows) == 2
    rc, _, err = lnexp(capsys, "plot", str(root / "pre_w0"), "--metric", "loss", "--out", str(tmp_path / "f"))
    assert rc == 2 and "no run logged 'loss'" in err


def test_plot_draws_one_line_with_a_band_per_group_of_seeds(tmp_path, capsys):
    import csv

    from scipy import stats

    root = tmp_path / "runs"
    for seed, last in ((1, 7.0), (2, 7.2), (3, 7.7)):
        fake_run(root, f"post_s{seed}", "x", seed=seed, valid=(9.0, last))
    fake_run(root, "pre_s1", "x", placement="pre_ln", valid=(8.0, 6.5))
    rc, _, err = lnexp(capsys, "plot", "--runs-root", str(root), "--out", str(tmp_path / "bands"))
    assert rc == 0, err
    rows = list(csv.DictReader(open(tmp_path / "bands.csv", newline="")))
    post = [r for r in rows if r["metric"] == "valid_loss" and r["run"].count(",") == 2]
    assert [r["label"] for r in post] == ["placement=post_ln (mean of 3 seeds, 95% CI)"] * 2
    last = post[-1]
    half = stats.t.ppf(0.975, 2) * stats.tstd([7.0, 7.2, 7.7]) / 3 ** 0.5
    assert float(last["y"]) == pytest.approx(7.3, abs=1e-5) and last["n"] == "3"
    assert float(last["high"]) - float(last["low"]) == pytest.approx(2 * half, abs=1e-4)
    assert [r["label"] for r in rows if r["run"] == "pre_s1"][0] == "placement=pre_ln"
    rc, _, err = lnexp(capsys, "plot", "--runs-root", str(root), "--seeds", "each", "--out",
                       str(tmp_path / "each"))
    labels = {r["label"] for r in csv.DictReader(open(tmp_path / "each.csv", newline=""))}
    assert rc == 0 and "placement=post_ln, seed=2" in labels and len(labels) == 4


def test_several_runs_a_broken_one_is_reported_and_the_others_evaluated(tiny_run, tmp_path, capsys):
    empty = tmp_path / "failed_run"
    empty.mkdir()
    (empty / "run.json").write_text((tiny_run / "run.json").read_text())
    rc, out, err = lnexp(capsys, "evaluate", str(empty), str(tiny_run), "--beam", "1")
    assert rc == 2
    (line,) = [ln for ln in err.strip().splitlines() if not ln.startswith("decoding ")]  # progress
    assert "failed_run has no checkpoint_best.pt" in line
    assert f"{tiny_run}: test (40 sentences), checkpoint best, beam 1" in out


def sacrebleu_paired(refs: str, hyps_a: str, hyps_b: str, test: str,
                     n: list[str]) -> dict[str, list[float]]:
    """sacreBLEU's command line, paired test of B against baseline A (with the extra flags `n`):
    per metric the numbers of its table in order (A: score, mean, CI; B: score, mean, CI, p; AR has
    no mean and CI). Its JSON output fails on --paired-bs (numpy floats), so the text table is
    read, 6 decimals."""
    import re

    exe = str(Path(sys.executable).with_name("sacrebleu"))
    proc = subprocess.run([exe, refs, "-i", hyps_a, hyps_b, "-m", "bleu", "chrf", f"--paired-{test}",
                           *n, "-w", "6", "--format", "text"], capture_output=True, text=True,
                          check=True)
    rows = [ln.split("\u2502")[2:4] for ln in proc.stdout.splitlines() if ln.count("\u2502") == 4][1:]
    number = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
    return {m: [float(x) for cells in rows for x in number.findall(cells[i])]
            for i, m in enumerate(("BLEU", "chrF2"))}


def test_compare_equals_sacrebleus_paired_tests(tiny_run, capsys):
    """`lnexp compare` = `sacrebleu REF -i A B --paired-bs` (and --paired-ar) on the written files:
    the bootstrap at both's default 1,000 resamples, the approximate randomisation at 1,000 trials
    given to both (not their default 10,000: the same computation, a tenth of the draws)."""
    rc, out, err = lnexp(capsys, "compare", f"{tiny_run}@avg2", f"{tiny_run}@last", "--beam", "2",
                         "--split", "valid", "--ar-n", "1000", "--json")
    assert rc == 0, err
    r = json.loads(out.strip().splitlines()[-1])
    assert r["n"] == 60 and (r["a"]["checkpoint"], r["b"]["checkpoint"]) == ("avg2", "last")
    assert r["n_samples"] == {"bs": 1000, "ar": 1000}  # the bootstrap's default: sacreBLEU's
    assert r["a"]["hyps"] != r["b"]["hyps"]
    assert "p (bootstrap)" in out and "same numbers: sacrebleu" in out
    for test in ("bs", "ar"):
        n = [] if test == "bs" else ["--paired-ar-n", "1000"]
        cli = sacrebleu_paired(r["refs"], r["a"]["hyps"], r["b"]["hyps"], test, n)
        for key, numbers in cli.items():
            m = r["metrics"][key]
            keys = ["a", "a_mean", "a_ci", "b", "b_mean", "b_ci", f"p_{test}"] if test == "bs" else \
                ["a", "b", f"p_{test}"]
            assert numbers[:-1] == pytest.approx([m[k] for k in keys[:-1]], abs=5e-7), key
            assert numbers[-1] == pytest.approx(m[keys[-1]], abs=5e-5), key  # p: 4 decimals
    assert r["a"]["bleu"] == pytest.approx(r["metrics"]["BLEU"]["a"], abs=1e-9)


def test_compare_reuses_what_evaluate_scored_and_prints_no_sacrebleu_chatter(tiny_run, tmp_path,
                                                                            capsys):
    """`lnexp compare` right after `lnexp evaluate` of both sides with the same settings decodes
    nothing again (issue 49: it decoded a run evaluate had just scored) and prints no sacreBLEU
    INFO lines (it printed 12); a checkpoint written since is decoded anew."""
    import shutil

    run = tmp_path / tiny_run.name
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("eval"))
    records = [evaluate(capsys, run, "--checkpoint", c, "--split", "valid", "--beam", "1")
               for c in ("best", "last")]
    written = [Path(r["hyps"]).stat().st_mtime_ns for r in records]
    compare = ["compare", f"{run}@best", f"{run}@last", "--split", "valid", "--beam", "1",
               "--bs-n", "20", "--ar-n", "20"]
    proc = lnexp_cmd(*compare, cache=tiny_run.parents[1] / "cache")  # a process: what a user reads
    assert proc.stderr.count("its hypotheses are used, not decoded again") == 2, proc.stderr
    assert "decoding valid" not in proc.stderr and "INFO" not in proc.stdout + proc.stderr
    assert [Path(r["hyps"]).stat().st_mtime_ns for r in records] == written
    last = run / "checkpoints" / "checkpoint_last.pt"
    os.utime(last, ns=(last.stat().st_atime_ns, last.stat().st_mtime_ns + 10**9))  # saved again
    rc, _, err = lnexp(capsys, *compare)
    assert rc == 0 and err.count("not decoded again") == 1 and "decoding valid" in err, err


@pytest.mark.parametrize("args, needle", [
    (["{run}", "{tmp}/nowhere"], "is not a run folder"),
    (["{run}@avg9", "{run}"], "needs 9 epoch checkpoints"),
    (["{run}", "{run}", "--bs-n", "0"], "argument --bs-n: must be at least 1, not 0"),
])
def test_compare_bad_input_one_line(tiny_run, tmp_path, capsys, args, needle):
    argv = [a.format(run=tiny_run, tmp=tmp_path) for a in args]
    rc, out, err = lnexp(capsys, "compare", *argv)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_evaluate_on_valid_equals_the_logged_epoch_bleu(tiny_run, capsys):
    """Same checkpoint (epoch 2 = last), beam, lenpen and batch size: the BLEU and every line that
    `lnexp evaluate --split valid` writes equal what training logged for that epoch; 60 sentences,
    4 of which fairseq's default batching (a multiple of 8) would leave untranslated."""
    r = evaluate(capsys, tiny_run, "--split", "valid", "--checkpoint", "last", "--beam", "1")
    logged = [json.loads(ln) for ln in (tiny_run / "metrics.jsonl").read_text().splitlines()][-1]
    assert r["n"] == 60 and logged["epoch"] == 2
    assert r["bleu"] == logged["valid_bleu"]
    epoch_hyps = (tiny_run / "hyps" / "valid_epoch002.txt").read_text().splitlines()
    assert Path(r["hyps"]).read_text().splitlines() == epoch_hyps and len(epoch_hyps) == 60
    assert "--required-batch-size-multiple 1" in r["fairseq_command"]


@pytest.fixture(scope="module")
def tiny_model(tiny_run):
    from lnexp.evaluation import checkpoints
    from lnexp.evaluation.runinfo import open_run

    run = open_run(tiny_run)
    model, task = checkpoints.load(checkpoints.resolve(run.dir, "last"), run.data.bin_dir, "cpu")
    return run, model, task


def test_every_source_sentence_gets_its_hypothesis(tiny_model):
    """Sets of 1 to 17 sentences and Multi30k's 1,014 validation sentences: each one batched once
    and translated once (greedy); fairseq's stock batching (multiple of 8) is refused, not scored."""
    from lnexp import fairseq_adapter as fa
    from lnexp.data.text import read_lines
    from lnexp.decoding import MissingHypotheses, generate
    from lnexp.evaluation.inputs import encoder, text_level

    run, model, task = tiny_model
    encode = encoder(run.data)
    src = text_level(run, read_lines(REPO / "data" / "multi30k" / "val.de.gz"), run.data.src)
    assert len(src) == 1014
    # the first 2 pieces of each sentence: short hypotheses keep 1,014 greedy decodes cheap
    short = [" ".join(encode(x).split()[:2]) for x in src]
    fa.add_inference_split(task, "val", short)
    decode = run.data.decoder()
    for n in [*range(1, 18), 1014]:
        batched = [i for b in fa.generate_batches(task, "val", model, 256, range(n))
                   for i in b["id"].tolist()]
        assert sorted(batched) == list(range(n)), n
    for n in [*range(1, 18), 1014]:
        hyps = generate(task, model, "val", "cpu", 1, 1.0, 256, decode, range(n))
        assert len(hyps) == n and all(hyps), n  # the lost ones came back as empty lines
    fa.add_inference_split(task, "val13", short[:13])
    stock = task.get_batch_iterator(dataset=task.dataset("val13"), max_sentences=256,
                                    required_batch_size_multiple=8).next_epoch_itr(shuffle=False)
    with pytest.raises(MissingHypotheses, match="5 of the 13 val13 sentences got no hypothesis"):
        generate(task, model, "val13", "cpu", 1, 1.0, 256, decode, range(13), batches=stock)


def test_two_run_legend_holds_only_the_keys_that_differ(tmp_path, capsys):
    """The demo against `placement=pre_ln warmup=0`, with the configs lnexp train saves (resolved
    in run.json, composed and unresolved in .hydra/config.yaml): the legend names the placement
    and the warm-up only (no recipe text, no schedule that follows the recipe), and the picture
    keeps the panels' width."""
    from matplotlib.image import imread
    from omegaconf import OmegaConf

    from lnexp import run_names

    # (the second trained briefly, as a new user tries a run first: keys that do not name a run
    # are not in the legend, issue 49)
    runs = {"default": ["max_epoch=2"],
            "placement=pre_ln": ["placement=pre_ln", "warmup=0", "max_update=50", "eval.subset=20"]}
    with run_names.composing() as compose_raw:
        for name, overrides in runs.items():
            raw = run_names.task_config(compose_raw(overrides))
            d = fake_run(tmp_path / "runs", name, "")
            (d / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(raw))
            (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
            meta = json.loads((d / "run.json").read_text())
            meta["config"] = OmegaConf.to_container(raw, resolve=True)
            (d / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "fig" / "cmp"
    rc, _, err = lnexp(capsys, "plot", *(str(tmp_path / "runs" / n) for n in runs), "--out", str(out))
    assert rc == 0, err
    with open(out.with_suffix(".csv"), newline="") as f:
        labels = {row["label"] for row in csv.DictReader(f)}
    assert labels == {"placement=post_ln, warmup=100", "placement=pre_ln, warmup=0"}
    width = imread(out.with_suffix(".png")).shape[1]
    assert width <= 2 * 4.2 * 150  # two panels of 4.2 in at 150 dpi: the legend adds no width


def test_a_zero_difference_is_never_significant():
    """Two different systems that both score BLEU 0.00: every resample scores them alike, none
    beats the observed difference strictly, and sacreBLEU's p-value is its smallest, 1/(n+1);
    lnexp compare reports p = 1 for that metric (chrF, which does differ, keeps its p-values)."""
    from lnexp.evaluation.compare import no_difference, paired_tests

    refs = ["a dog runs on the grass", "two men play football", "a woman reads a book"] * 4
    hyps_a = ["cat", "three", "bird"] * 4  # no 4-gram match: BLEU 0
    hyps_b = ["dog", "men", "woman"] * 4  # other words, still BLEU 0
    result = paired_tests(hyps_a, hyps_b, refs, ("a", "b"), {"bs": 50, "ar": 50})
    bleu, chrf = result["metrics"]["BLEU"], result["metrics"]["chrF2"]
    assert bleu["a"] == bleu["b"] == 0.0 and bleu["p_ar"] < 0.05  # sacreBLEU's own verdict
    no_difference(result, identical=False)
    assert bleu["p_bs"] == bleu["p_ar"] == 1.0
    assert chrf["diff"] != 0 and chrf["p_ar"] < 1.0
