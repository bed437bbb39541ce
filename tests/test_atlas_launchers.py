"""The atlas's launchers: the cell worker (cells one after another in one process) trains each cell
to the same numbers, bit for bit, as ``lnexp train`` in its own process; a failed cell, a dead
worker and a stop are each reported once; submitit's local executor trains a round as one array
whose runs the atlas's reader finds (real fairseq, real submitit, tiny cells)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from lnexp.atlas.launchers import Ended, make
from lnexp.rundir import read_metrics, read_updates, run_paths
from tests.conftest import TINY, lnexp_cmd, lnexp_main

# TINY's 2+2-layer model, one epoch of 6 updates, BLEU on 20 sentences: seconds a cell
FAST = [o for o in TINY if not o.startswith(("max_epoch=", "lr="))] + [
    "eval.subset=20", "threads=1"]
CELL_A = ["placement=pre_ln", "seed=1", "lr=1e-4"]
CELL_B = ["placement=post_ln", "seed=2", "lr=3e-4"]
TIMING = {"wall_s", "seconds", "updates_per_s", "tokens_per_s", "time"}  # what may differ


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, small_multi30k) -> tuple[Path, Path]:
    """(the small corpus, a cache where it is prepared): prepared before any launcher runs, so that
    two cells started at once do not both prepare it."""
    cache = tmp_path_factory.mktemp("launchers-cache")
    lnexp_main("train", f"dataset.dir={small_multi30k}", *FAST, "max_epoch=1", "max_update=1",
               f"runs_root={cache / 'warm'}", cache=cache)
    return small_multi30k, cache


def _cell(corpus: tuple[Path, Path], root: Path, *over: str) -> list[str]:
    length = [] if any(o.startswith("max_epoch=") for o in over) else ["max_epoch=1"]
    return [f"dataset.dir={corpus[0]}", *FAST, *length, *over, f"runs_root={root}"]


def _numbers(run_dir: Path) -> tuple[list[dict], list[dict], str]:
    """Every number of a run that is not a time: metrics.jsonl's rows, updates.csv's rows, status."""
    p = run_paths(run_dir)
    drop = lambda row: {k: v for k, v in row.items() if k not in TIMING and not k.endswith("_s")}  # noqa: E731
    status = json.loads(p["status"].read_text())["status"]
    metrics, updates = read_metrics(p["metrics"]), read_updates(p["updates"])
    return [drop(r) for r in metrics], [drop(r) for r in updates], status


def _only_run(root: Path) -> Path:
    (d,) = [p.parent for p in root.glob("**/status.json")]
    return d


def test_worker_cells_equal_their_own_processes_bit_for_bit(tmp_path, corpus):
    """Two different cells, one after the other in one worker, after a cell that fails at once:
    each run's losses, BLEU and status equal those of `lnexp train` of it in its own process."""
    env = {**os.environ, "LNEXP_CACHE": str(corpus[1])}
    alone = {}
    for name, over in (("a", CELL_A), ("b", CELL_B)):
        lnexp_cmd("train", *_cell(corpus, tmp_path / "alone" / name, *over), cache=corpus[1])
        alone[name] = _numbers(_only_run(tmp_path / "alone" / name))
    cells = [_cell(corpus, tmp_path / "worker" / "bad", "placment=pre_ln"),
             _cell(corpus, tmp_path / "worker" / "a", *CELL_A),
             _cell(corpus, tmp_path / "worker" / "b", *CELL_B)]
    ends: list[Ended] = []
    with make("worker", env=env) as launcher:
        launcher.run_round(cells, 1, ends.append)
        pids = {w.proc.pid for w in launcher.workers}
    assert len(pids) == 1  # one process trained all three
    assert [(e.index, e.status) for e in ends] == [(0, 2), (1, 0), (2, 0)]  # the bad override: 2
    for name in ("a", "b"):
        metrics, updates, status = _numbers(_only_run(tmp_path / "worker" / name))
        assert status == "done"
        assert metrics == alone[name][0] and len(metrics) == 1
        assert updates == alone[name][1] and len(updates) == 6
    assert alone["a"][0] != alone["b"][0]  # different cells: the comparison can tell them apart


def _when(pred, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.2)


def _running(root: Path, launcher) -> bool:
    """A run under ``root`` trains in the launcher's worker (not a stale status of a killed one)."""
    pids = {w.proc.pid for w in launcher.workers}
    for p in root.glob("**/status.json"):
        try:
            status = json.loads(p.read_text())
            if status.get("status") == "running" and status.get("pid") in pids:
                return True
        except (OSError, ValueError):  # being replaced this instant
            pass
    return False


def test_a_dead_worker_is_reported_once_and_stop_interrupts_the_running_cell(tmp_path, corpus):
    env = {**os.environ, "LNEXP_CACHE": str(corpus[1])}
    long = _cell(corpus, tmp_path / "long", *CELL_A, "max_epoch=50")
    lines: list[str] = []
    ends: list[Ended] = []
    with make("worker", env=env, log=lines.append) as launcher:
        def kill() -> None:
            _when(lambda: _running(tmp_path / "long", launcher))
            os.kill(launcher.workers[0].proc.pid, signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()
        launcher.run_round([long], 1, ends.append)
        assert [(e.index, e.status) for e in ends] == [(0, 137)]  # 128 + 9, as a killed process's
        assert len(lines) == 1 and "was killed by signal 9 (SIGKILL)" in lines[0], lines
        assert "counts as failed" in lines[0] and " ".join(long) in lines[0]  # named by its overrides
        assert f"({_only_run(tmp_path / 'long')})" in lines[0]  # and its folder

        ends.clear()
        def stop() -> None:
            _when(lambda: _running(tmp_path / "long", launcher))
            launcher.stop()

        threading.Thread(target=stop, daemon=True).start()
        queued = _cell(corpus, tmp_path / "queued", *CELL_B)
        launcher.run_round([long, queued], 1, ends.append)  # a new worker resumes the long cell
    assert [(e.index, e.status) for e in ends] == [(0, 130)]  # the queued cell never started
    assert json.loads(run_paths(_only_run(tmp_path / "long"))["status"].read_text())["status"] == \
        "interrupted"
    assert not (tmp_path / "queued").exists()
    assert len(lines) == 1


def test_a_submitit_local_round_trains_and_the_atlas_reads_its_runs(tmp_path, corpus):
    """A round of 2 atlas cells as one submitit array (local executor, real submitit): both train,
    and the atlas's reader finds them as finished cells; a task that cannot start is reported once."""
    from lnexp.atlas.driver import SeenRuns, coverage, overrides, schemes
    from lnexp.atlas.grid import read_grid

    grid = read_grid("mini")
    root = tmp_path / "runs"
    extra = [f"dataset.dir={corpus[0]}", "dataset.vocab_size=600", "depth.encoder_layers=2",
             "depth.decoder_layers=2", "max_update=2", "eval.subset=5", f"runs_root={root}",
             "hydra.launcher.timeout_min=10"]
    jobs = [j for j in coverage(grid, schemes()) if j.arm.scheme.placement == "pre_ln"
            and j.arm.scheme.norm == "layernorm"]
    assert len(jobs) == 2  # with and without warm-up
    cells = [[*overrides(j, grid, "mini"), *extra] for j in jobs]
    lines: list[str] = []
    ends: list[Ended] = []
    launcher = make("submitit_local", log=lines.append)
    os.environ["LNEXP_CACHE"] = str(corpus[1])  # the tasks inherit this process's environment
    try:
        launcher.run_round(cells, 2, ends.append)
    finally:
        os.environ.pop("LNEXP_CACHE")
    assert sorted((e.index, e.status) for e in ends) == [(0, 0), (1, 0)]
    assert len(lines) == 1 and "submitted as submitit_local job" in lines[0]
    seen = SeenRuns(root, grid, "mini")()
    assert len(seen) == 2
    assert all(set(c.outcomes().values()) <= {"trained", "plateau"} and c.outcomes()
               for c in seen.values())
    assert {a.warmup for a, _ in seen} == set(grid.warmups)

    lines.clear()
    ends.clear()  # a task whose process never runs the cell (its setup fails): one line, failed
    launcher.run_round([[*cells[0], "hydra.launcher.setup=[exit 3]"]], 1, ends.append)
    assert [(e.index, e.status) for e in ends] == [(0, 1)]
    assert len(lines) == 2 and "(cell 0) failed" in lines[1] and ".err" in lines[1]


def test_the_arrays_settings_are_checked_before_any_round():
    from lnexp.atlas.cluster import launcher_settings
    from lnexp.errors import UserError

    with pytest.raises(UserError, match="partion.*submitit_slurm's keys: .*partition"):
        make("submitit_slurm", overrides=["runs_root=r", "hydra.launcher.partion=gpu"])
    folder, params = launcher_settings("slurm", ["runs_root=r", "hydra/launcher=submitit_slurm",
                                                 "hydra.launcher.partition=gpu",
                                                 "hydra.launcher.gpus_per_node=1"])
    assert folder == "r/.submitit/%j"
    assert params["slurm_partition"] == "gpu" and params["gpus_per_node"] == 1
    with pytest.raises(UserError,
                       match="--launcher nowhere: not a launcher; use one of .*worker.*submitit_slurm"):
        make("nowhere")
    from lnexp.atlas.launchers import named_in

    assert named_in(["max_update=20", "hydra/launcher=submitit_slurm"]) == "submitit_slurm"
    assert named_in(["hydra/launcher=submitit_local"]) == "submitit_local"
    assert named_in(["hydra/launcher=joblib"]) is None and named_in([]) is None
    if shutil.which("srun") is None:  # no SLURM here: one line, no traceback, nothing submitted
        with pytest.raises(UserError, match="--launcher submitit_slurm: .*srun.*login node"):
            make("submitit_slurm").run_round([["runs_root=r"]], 1, print)
