"""The atlas's launchers: the cell worker (cells one after another in one process) trains each cell
to the same numbers, bit for bit, as ``lnexp train`` in its own process; a failed cell, a dead
worker and a stop are each reported once; submitit's local executor trains a round as one array
whose runs the atlas's reader finds (real fairseq, real submitit, tiny cells); with GPUs, each
worker is pinned to one, round robin."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lnexp import overrides as override
from lnexp.atlas.launchers import Ended, LaunchSetup, make
from lnexp.atlas.outcomes import Arm, Cell, Scheme
from lnexp.rundir import read_metrics, read_updates, run_paths
from tests.conftest import TINY, lnexp_cmd

# every cell's overrides: TINY's but those a cell sets (depth, lr, warm-up), one epoch of 6 updates
# (a test may stop it sooner), BLEU on 20 sentences: seconds a cell; the cells are TINY's 2+2 layers
# without warm-up
FAST = [o for o in TINY if override.key(o) not in ("max_epoch", "lr", "warmup", "depth.encoder_layers",
                                                    "depth.decoder_layers")] + ["eval.subset=20", "threads=1"]
CELL_A = Cell(Arm(Scheme("pre_ln"), 0, 2), 1e-4, 1)
CELL_B = Cell(Arm(Scheme("post_ln"), 0, 2), 3e-4, 2)
BAD = Cell(Arm(Scheme("no_such_placement"), 0, 2), 1e-4, 1)  # fails at once, exit status 2
TIMING = {"wall_s", "seconds", "updates_per_s", "tokens_per_s", "time"}  # what may differ


@pytest.fixture(scope="module")
def corpus(small_multi30k, prepared_cache) -> tuple[Path, Path]:
    """(the small corpus, a cache where it is prepared at FAST's vocabulary): prepared before any
    launcher runs, so that two cells started at once do not both prepare it. The cells only read it."""
    return small_multi30k, prepared_cache


def _setup(corpus: tuple[Path, Path], root: Path, *more: str) -> LaunchSetup:
    """Cells under ``root`` on the small corpus, one epoch each unless ``more`` says."""
    length = [] if any(o.startswith("max_epoch=") for o in more) else ["max_epoch=1"]
    return LaunchSetup(root, overrides=(f"dataset.dir={corpus[0]}", *FAST, *length, *more))


def _run_of(root: Path, cell: Cell) -> Path:
    """The run folder of ``cell`` under ``root``, as the atlas reads a run's cell."""
    from lnexp.atlas.outcomes import arm_of
    from lnexp.results import load_run

    runs = [load_run(p.parent) for p in root.glob("**/status.json")]
    (d,) = [r.dir for r in runs if Cell(arm_of(r), float(r.get("lr")), int(r.get("seed"))) == cell]
    return d


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
    each run's losses, BLEU and status equal those of `lnexp train` of it in its own process.
    (Each cell stops at update 2 of its epoch: bit for bit after 2 updates as after 6.)"""
    env = {**os.environ, "LNEXP_CACHE": str(corpus[1])}
    alone = {}
    for name, cell in (("a", CELL_A), ("b", CELL_B)):
        lnexp_cmd("train", *_setup(corpus, tmp_path / "alone" / name, "max_update=2").command(cell),
                  cache=corpus[1])
        alone[name] = _numbers(_only_run(tmp_path / "alone" / name))
    ends: list[Ended] = []
    with make("worker", _setup(corpus, tmp_path / "worker", "max_update=2"), env=env) as launcher:
        launcher.run_round([BAD, CELL_A, CELL_B], 1, ends.append)
        pids = {w.proc.pid for w in launcher.workers}
    assert len(pids) == 1  # one process trained all three
    assert [(e.index, e.status) for e in ends] == [(0, 2), (1, 0), (2, 0)]  # the bad override: 2
    for name, cell in (("a", CELL_A), ("b", CELL_B)):
        metrics, updates, status = _numbers(_run_of(tmp_path / "worker", cell))
        assert status == alone[name][2] == "stopped"  # at max_update, as alone
        assert metrics == alone[name][0] and len(metrics) == 1
        assert updates == alone[name][1] and len(updates) == 2
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
    setup = _setup(corpus, tmp_path / "long", "max_epoch=50")
    lines: list[str] = []
    ends: list[Ended] = []
    with make("worker", setup, env=env, log=lines.append) as launcher:
        def kill() -> None:
            _when(lambda: _running(tmp_path / "long", launcher))
            os.kill(launcher.workers[0].proc.pid, signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()
        launcher.run_round([CELL_A], 1, ends.append)
        assert [(e.index, e.status) for e in ends] == [(0, 137)]  # 128 + 9, as a killed process's
        assert len(lines) == 1 and "was killed by signal 9 (SIGKILL)" in lines[0], lines
        assert "counts as failed" in lines[0] and CELL_A.label in lines[0]  # named as a cell,
        assert " ".join(setup.command(CELL_A)) in lines[0]  # by its overrides
        assert f", {_only_run(tmp_path / 'long')})" in lines[0]  # and its folder

        ends.clear()
        def stop() -> None:
            _when(lambda: _running(tmp_path / "long", launcher))
            launcher.stop()

        threading.Thread(target=stop, daemon=True).start()
        launcher.run_round([CELL_A, CELL_B], 1, ends.append)  # a new worker resumes the long cell
    assert [(e.index, e.status) for e in ends] == [(0, 130)]  # the queued cell never started:
    assert json.loads(run_paths(_only_run(tmp_path / "long"))["status"].read_text())["status"] == \
        "interrupted"  # (the only folder there)
    assert len(lines) == 1


def test_a_submitit_local_round_trains_and_the_atlas_reads_its_runs(tmp_path, corpus):
    """A round of 2 atlas cells as one submitit array (local executor, real submitit): both train,
    and the atlas's reader finds them as finished cells; a task that cannot start is reported once."""
    from lnexp.atlas.grid import read_grid
    from lnexp.atlas.plan import coverage
    from lnexp.atlas.rounds import SeenRuns
    from lnexp.atlas.schemes import schemes

    grid = read_grid("mini")
    root = tmp_path / "runs"
    every = (f"dataset.dir={corpus[0]}", "dataset.vocab_size=600", "depth.encoder_layers=2",
             "depth.decoder_layers=2", "max_update=2", "scale.max_tokens=1000", "eval.subset=1",
             "track_norms=false")  # the cells: a path here (the reader reads their outcomes)
    setup = LaunchSetup(root, "mini", overrides=every, settings=("hydra.launcher.timeout_min=10",))
    cells = [c for c in coverage(grid, schemes()) if c.arm.scheme == Scheme("pre_ln")]
    assert len(cells) == 2  # with and without warm-up
    lines: list[str] = []
    ends: list[Ended] = []
    launcher = make("submitit_local", setup, log=lines.append)
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
    failing = replace(setup, settings=(*setup.settings, "hydra.launcher.setup=[exit 3]"))
    make("submitit_local", failing, log=lines.append).run_round(cells[:1], 1, ends.append)
    assert [(e.index, e.status) for e in ends] == [(0, 1)]
    assert len(lines) == 2 and "(cell 0) failed" in lines[1] and ".err" in lines[1]


def test_the_arrays_settings_are_checked_before_any_round():
    from lnexp.atlas.cluster import launcher_settings
    from lnexp.errors import UserError

    with pytest.raises(UserError, match="partion.*submitit_slurm's keys: .*partition"):
        make("submitit_slurm", LaunchSetup(Path("r"), settings=("hydra.launcher.partion=gpu",)))
    folder, params = launcher_settings("slurm", Path("r"), ["hydra/launcher=submitit_slurm",
                                                            "hydra.launcher.partition=gpu",
                                                            "hydra.launcher.gpus_per_node=1"])
    assert folder == "r/.submitit/%j"
    assert params["slurm_partition"] == "gpu" and params["gpus_per_node"] == 1
    with pytest.raises(UserError,
                       match="--launcher nowhere: not a launcher; use one of .*worker.*submitit_slurm"):
        make("nowhere", LaunchSetup(Path("r")))
    from lnexp.atlas.launchers import named_in

    assert named_in(["max_update=20", "hydra/launcher=submitit_slurm"]) == "submitit_slurm"
    assert named_in(["hydra/launcher=submitit_local"]) == "submitit_local"
    assert named_in(["hydra/launcher=joblib"]) is None and named_in([]) is None
    if shutil.which("srun") is None:  # no SLURM here: one line, no traceback, nothing submitted
        with pytest.raises(UserError, match="--launcher submitit_slurm: .*srun.*login node"):
            make("submitit_slurm", LaunchSetup(Path("r"))).run_round([CELL_A], 1, print)


# A worker as the launcher starts it (python -m lnexp.atlas.worker --result-fd N), training nothing:
# each cell writes the GPU its process sees to RUNS_ROOT/gpu-seedN and ends with status 0
FAKE_WORKER = """
import json, os, sys
results = os.fdopen(int(sys.argv[sys.argv.index("--result-fd") + 1]), "w")
for line in sys.stdin:
    job = json.loads(line)
    kv = dict(o.split("=", 1) for o in job["cell"])
    with open(os.path.join(kv["runs_root"], "gpu-seed" + kv["seed"]), "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "none"))
    results.write(json.dumps({"index": job["index"], "status": 0, "seconds": 0.0}) + "\\n")
    results.flush()
"""


def test_each_worker_is_pinned_to_a_gpu_round_robin(tmp_path):
    """2 GPUs (nvidia-smi's listing, faked) and 4 jobs: the 4 workers see CUDA_VISIBLE_DEVICES 0, 1,
    0, 1 (job slots round robin, as the process launcher's), not all GPU 0."""
    from lnexp.runtime.host import gpus_of

    listing = "0, NVIDIA H200, 143771\n1, NVIDIA H200, 143771\n"
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\n{FAKE_WORKER}")
    fake.chmod(0o755)
    setup = LaunchSetup(tmp_path, gpus=tuple(g.id for g in gpus_of(listing, None)))
    cells = [Cell(Arm(Scheme("pre_ln"), 0, 6), 1e-3, seed) for seed in (1, 2, 3, 4)]
    ends: list[Ended] = []
    with make("worker", setup, python=str(fake)) as launcher:
        launcher.run_round(cells, 4, ends.append)
        assert sorted(w.slot for w in launcher.workers) == [0, 1, 2, 3]
    assert sorted((e.index, e.status) for e in ends) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    seen = {seed: (tmp_path / f"gpu-seed{seed}").read_text() for seed in (1, 2, 3, 4)}
    assert seen == {1: "0", 2: "1", 3: "0", 4: "1"}
