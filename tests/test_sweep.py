"""Sweeps: SIGKILL and restart resumes exactly; launchers; progress lines."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, lnexp_main
from tests.test_figures_fig2_fig4 import TINY

TIMING = ("wall_s", "valid_s")


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _updates(run_dir: Path) -> list[dict]:
    with open(run_dir / "updates.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_killed_sweep_resumes_without_redoing_and_matches_uninterrupted(tmp_path, small_multi30k,
                                                                        prepared_cache):
    cache = prepared_cache
    common = [f"dataset.dir={small_multi30k}", *TINY, "max_update=8", "max_epoch=50",
              "save_interval_updates=4"]
    runs = tmp_path / "runs"
    argv = ["train", "-m", *common, "seed=1,2", f"runs_root={runs}"]
    env = {**os.environ, "LNEXP_CACHE": str(cache), "PYTHONWARNINGS": "ignore"}
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "lnexp.cli", *argv], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    second = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            dirs = [d for d in runs.glob("*seed=2*") if (d / "checkpoints" / "checkpoint_last.pt").is_file()]
            if dirs:
                second = dirs[0]
                break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    assert second is not None, (tmp_path / "first.log").read_text()[-3000:]
    status = json.loads((second / "status.json").read_text())
    assert status["status"] == "running"  # killed mid-run
    (first,) = [d for d in runs.iterdir() if d.is_dir() and "seed=" not in d.name]  # seed=1: default
    assert json.loads((first / "status.json").read_text())["status"] == "stopped"
    before = {f: (first / f).stat().st_mtime_ns for f in ("status.json", "metrics.jsonl", "updates.csv")}

    again = lnexp_main(*argv, cache=cache)  # a new launch of the same sweep: the restart
    logs = "".join(f.read_text() for f in first.glob("*.log")) + again.stdout + again.stderr
    assert "already stopped at 8 updates, 1/50 epochs: max_update=8, skipping" in logs
    assert {f: (first / f).stat().st_mtime_ns for f in before} == before  # not redone
    assert json.loads((second / "status.json").read_text())["status"] == "stopped"

    ref_root = tmp_path / "ref"
    lnexp_main("train", *common, "seed=2", f"runs_root={ref_root}", cache=cache)
    ref = ref_root / second.name
    assert ref.is_dir(), list(ref_root.iterdir())  # same config, same directory name
    assert _updates(second) == _updates(ref)
    assert _metrics(second) == _metrics(ref)


def test_progress_line_and_sweep_size(tmp_path):
    from lnexp.runtime import progress

    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    params:\n      lr: 5.0e-4,1.0e-3\n      warmup: 0,13,100\n"
        "      seed: 1,2\n  overrides:\n    task: [experiment=fig2_mini, 'seed=1', max_update=5]\n")
    assert progress.sweep_size(tmp_path / "multirun.yaml") == 6  # seed=1 replaces the swept seeds
    line = progress.message("lr=0.001,seed=1", epoch=1, max_epoch=2, wall_s=150.0, job=2, total=6)
    assert line == "run 3/6 lr=0.001,seed=1 | epoch 1/2 | run left ~2m30s | sweep left ~17m30s"
    assert progress.message("x", 2, 2, 300.0, None, None) == "x | epoch 2/2 | run left ~0m00s"
    assert progress.sweep_eta(tmp_path, 0, 6, 4) == "time left: unknown until a run finishes"
    for name, wall, epochs in (("a", 300.0, 2), ("b", 600.0, 4), ("c", 90.0, 1)):  # c: still running
        (tmp_path / name).mkdir()
        status = "running" if name == "c" else "done"
        (tmp_path / name / "status.json").write_text(
            f'{{"status": "{status}", "epoch": {epochs}, "updates": {50 * epochs}, "wall_s": {wall}}}')
    # 150 s per epoch (a, b) x 4 epochs x the 4 jobs left (this one included)
    assert progress.sweep_eta(tmp_path, 2, 6, 4) == \
        "~40m00s left (4 epochs per run, mean epoch time of 2 finished runs of this sweep)"
    # a sweep of 5-update trials (issue 49: "~16m24s" for a sweep that took 25 s): 3 s per update
    # (a, b) x 5 updates x the 4 jobs left, not their epochs' length
    assert progress.sweep_eta(tmp_path, 2, 6, 4, max_update=5) == (
        "~1m00s left (4 epochs or max_update=5 per run, mean update and epoch times of 2 finished "
        "runs of this sweep)")
    assert progress.sweep_eta(tmp_path, 2, 6, 1, max_update=500).startswith("~10m00s left")  # epochs
    assert progress.sweep_eta(tmp_path, 2, 6, 4, parallel=2).startswith("~20m00s left")  # joblib n_jobs=2
    assert progress.message("x", 1, 2, 150.0, 2, 6, parallel=2) == \
        "run 3/6 x | epoch 1/2 | run left ~2m30s | sweep left ~10m00s"  # 2m30 + 3 runs x 5m / 2
    # a run that finished before this sweep began (an older multirun.yaml) no longer counts
    old = tmp_path / "a" / "status.json"
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    os.utime(tmp_path / "multirun.yaml", (time.time() - 60, time.time() - 60))
    assert progress.sweep_eta(tmp_path, 2, 6, 4).startswith("~40m00s left (4 epochs per run, mean epoch "
                                                            "time of 1 finished run of this sweep)")
    hc = OmegaConf.create({"launcher": {"n_jobs": -1}})
    assert progress.parallel_jobs(hc) == os.cpu_count()
    assert progress.parallel_jobs(OmegaConf.create({"launcher": {"_target_": "basic"}})) == 1


@pytest.mark.slow
def test_submitit_local_launcher(tmp_path, small_multi30k, prepared_cache):
    runs = tmp_path / "runs"  # (the launch in this process: submitit starts the job's own process)
    lnexp_main("train", "-m", f"dataset.dir={small_multi30k}", *TINY, "max_update=3", "seed=1",
               f"runs_root={runs}", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5",
               cache=prepared_cache)
    from lnexp.results import collect_runs

    (run,) = collect_runs(runs)
    assert run.state == "stopped" and run.status["updates"] == 3
