"""lnexp atlas as a process a user starts and stops: a signal stops it (exit 130, work kept, the same
command resumes), one atlas per runs root, a damaged state refused, budgets that hold a cell, jobs
the machine sustains, the device-aware choice (pure), the process launcher, a cell's disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lnexp.atlas import budget, driver, launchers, plan, resources, rounds
from lnexp.atlas.claims import MAX_SEEDS
from lnexp.atlas.outcomes import Arm, Cell, Scheme
from lnexp.errors import UserError
from lnexp.runtime import host
from lnexp.runtime.host import Gpu
from tests.conftest import REPO, lnexp_main

H200 = Gpu("0", "NVIDIA H200", 140.4)  # GiB, as nvidia-smi's 143,771 MiB


# --- the device-aware choice (pure) ----------------------------------------------------------------


def test_two_cpu_cores_get_two_jobs_155_s_a_cell_and_100_minutes():
    c = resources.choose_resources(2, [], "mini", (6, 18))
    assert (c.jobs, c.budget_s, c.cost_s, c.device) == (2, 6000.0, {6: 155.0, 18: 350.0}, "cpu")
    assert c.why[0] == "2 jobs (2 CPU cores: one 1-thread job a core)"
    assert "budget 100 min (mini's default on a CPU" in c.why[-1]
    assert resources.seed_cap(c.budget_s, c.jobs, c.cost_s[6], MAX_SEEDS) == MAX_SEEDS  # as before


def test_one_h200_with_16_cores_gets_16_jobs_58_s_a_cell_and_10_minutes():
    c = resources.choose_resources(16, [H200], "mini", (6, 18))
    assert (c.jobs, c.budget_s, c.cost_s[6], c.device) == (16, 600.0, 58.0, "NVIDIA H200")
    assert "measured on one H200, 16 jobs" in c.why[1] and "15-minute GPU window" in c.why[-1]
    # ~1,000 cells an hour, as measured (2026-12-04)
    assert 950 <= 3600 / c.cost_s[6] * c.jobs <= 1050
    # post_ln_needs_warmup needs 13 seeds a cell at its stated effect: the GPU's budget affords them
    assert resources.seed_cap(c.budget_s, c.jobs, c.cost_s[6], MAX_SEEDS) >= 13
    # fewer cores than the GPU sustains: one job a core; --jobs and --budget-min still decide
    assert resources.choose_resources(4, [H200], "mini", (6,)).jobs == 4
    mine = resources.choose_resources(16, [H200], "mini", (6,), jobs=3, budget_min=25)
    assert (mine.jobs, mine.budget_s) == (3, 1500.0) and "(--jobs)" in mine.why[0]


def test_several_gpus_share_the_cores_and_a_small_gpu_its_memory():
    four = resources.choose_resources(64, [Gpu("0", "NVIDIA A100-SXM4-80GB", 80.0)] * 4, "mini", (6, 18))
    assert four.jobs == 64 and four.device == "4 x NVIDIA A100-SXM4-80GB"
    assert resources.choose_resources(32, [H200] * 4, "mini", (6,)).jobs == 32  # the cores bind
    small = [Gpu("0", "small", 4.0)] * 2
    assert resources.choose_resources(64, small, "mini", (6,)).jobs == 8  # 4 runs of 0.7 GiB a GPU
    lean = resources.choose_resources(64, [], "mini", (6,), memory_gib=16.0)  # 1.6 GiB a mini cell
    assert lean.jobs == 10 and "16 GiB of memory hold 10" in lean.why[0]
    paper = resources.choose_resources(64, [H200] * 2, "paper", (6, 18))
    assert paper.jobs == 8 and paper.budget_s == resources.NO_LIMIT_S  # 4 paper runs a GPU, no budget


def test_the_first_cost_follows_max_update_and_jobs_are_capped_saying_so():
    c = resources.choose_resources(2, [], "mini", (6, 18), max_update=5)
    assert c.cost_s == {6: 20.8, 18: 29.0} and "max_update=5" in c.why[1]
    # the smoke test of issue 42 (max_update=5 --budget-min 3) fits cells now; 155 s did not
    assert plan.fits([c.cost_s[6]] * 10, c.jobs, 3 * 60 - budget.FIGURE_RESERVE_S) > 0
    assert plan.fits([155.0] * 10, 2, 3 * 60 - budget.FIGURE_RESERVE_S) == 0
    capped = resources.choose_resources(2, [], "mini", (6,), jobs=100000)
    assert capped.jobs == 2 and capped.why[0].startswith("--jobs 100000 capped at 2 (2 CPU cores")
    assert resources.choose_resources(16, [H200], "mini", (6,), jobs=100).jobs == 16
    assert resources.smallest_budget_min({6: 155.0, 18: 350.0}, 60.0) == 3.6


# --- refusals, each one line before anything is written ---------------------------------------------


@pytest.mark.parametrize("args,text", [
    (["--jobs", "100000", "--budget-min", "0.1"], "--budget-min 0.1 cannot hold one cell"),
    (["--budget-min", "0.1", "max_update=5"], "give --budget-min 1.4 or more"),
    (["--launcher", "nope"], "--launcher nope: not a launcher; use one of process"),
])
def test_a_budget_that_holds_no_cell_or_an_unknown_launcher_is_refused(tmp_path, args, text):
    root = tmp_path / "runs"
    out = lnexp_main("atlas", "--runs-root", str(root), *args, cache=tmp_path / "cache", check=False)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and text in out.stderr, out.stderr
    assert not root.exists()  # nothing written


def test_a_damaged_state_file_is_refused_never_reset(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    for text in ("{", "[]", '{"spent_s": "a lot"}'):
        (root / budget.STATE_FILE).write_text(text)
        out = lnexp_main("atlas", "--runs-root", str(root), cache=tmp_path / "cache", check=False)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert "atlas_state.json is damaged" in out.stderr and "delete it to grant" in out.stderr
        assert (root / budget.STATE_FILE).read_text() == text and sorted(os.listdir(root)) == [
            budget.STATE_FILE]
    (root / rounds.PLAN_FILE).write_text("{")  # the figure's reading of the plan is refused too
    with pytest.raises(UserError, match="atlas_plan.json is damaged .* rerun lnexp atlas"):
        rounds.read_plan(root)


def test_a_second_atlas_on_one_runs_root_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    root = tmp_path / "runs"
    with driver.atlas_lock(root):  # this process runs an atlas there
        out = lnexp_main("atlas", "--runs-root", str(root), "max_update=5", cache=tmp_path / "cache",
                         check=False)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"is already used by lnexp atlas pid {os.getpid()}" in out.stderr
        assert "wait for it to finish, or stop it" in out.stderr
    assert not (root / driver.LOCK_FILE).exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    import socket

    (root / driver.LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(),
                                                     "started": 1.0, "since": time.time() - 60}))
    with driver.atlas_lock(root):  # its holder is gone: taken over
        assert json.loads((root / driver.LOCK_FILE).read_text())["pid"] == os.getpid()


# --- the process launcher ---------------------------------------------------------------------------


def test_the_process_launcher_stops_running_cells_and_starts_no_queued_one(tmp_path):
    """Each cell a process that writes its CUDA_VISIBLE_DEVICES to c{seed} and sleeps lr seconds;
    stop() (as the signal handler calls it) ends the sleeping ones as interrupted and starts none of
    the queue."""
    code = ("import os, sys, time; kv = dict(a.split('=', 1) for a in sys.argv[1:]); "
            "open(os.path.join(kv['runs_root'], 'c' + kv['seed']), 'w').write("
            "os.environ.get('CUDA_VISIBLE_DEVICES', '')); time.sleep(float(kv['lr']))")
    setup = launchers.LaunchSetup(tmp_path, gpus=("0", "1"))
    p = launchers.ProcessLauncher(setup, argv=[sys.executable, "-c", code])
    arm = Arm(Scheme("pre_ln"), 0, 6)
    cells = [Cell(arm, s, i) for i, s in enumerate((0.0, 0.0, 60.0, 60.0, 0.0, 0.0))]
    ended: list[launchers.Ended] = []
    timer = threading.Timer(2.0, p.stop)
    timer.start()
    t0 = time.monotonic()
    p.run_round(cells, 2, ended.append)
    assert time.monotonic() - t0 < 10
    assert sorted((e.index, e.status) for e in ended) == [(0, 0), (1, 0), (2, 130), (3, 130)]
    gpu = [(tmp_path / f"c{i}").read_text() for i in range(4)]
    assert gpu[:2] == ["0", "1"] and sorted(gpu[2:]) == ["0", "1"]  # a GPU a job slot
    assert not (tmp_path / "c4").exists()  # queued: never started
    p.run_round(cells[4:], 2, ended.append)  # once stopped, a round starts nothing
    assert len(ended) == 4


# --- a real atlas, stopped and resumed ----------------------------------------------------------------


def _wait(predicate, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not predicate():
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            proc.kill()
            out = proc.communicate()[0]
            pytest.fail(f"{what}: not reached (exit {proc.returncode}):\n{out[-3000:]}")
        time.sleep(0.2)


def _status(run: Path, name: str = "status.json") -> dict:
    try:
        return json.loads((run / name).read_text())
    except (OSError, ValueError):
        return {}


def test_sigint_stops_the_atlas_and_the_same_command_resumes(tmp_path, small_multi30k, prepared_cache):
    """Ctrl-C (SIGINT to lnexp atlas) while a cell trains: within 10 s, exit 130, one line, no
    traceback, no further cell; the cell is `interrupted` with its checkpoint. The same command
    resumes it from that checkpoint; once it ends it keeps no checkpoint and under 5 MB."""
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "lnexp", "atlas", "--runs-root", str(root), "--jobs", "1", "--budget-min",
           "3", "max_update=5", "threads=1", "save_interval_updates=1", f"dataset.dir={small_multi30k}",
           "dataset.vocab_size=600", "scale.max_tokens=1000", "eval.subset=1"]  # the cell: a path
    env = {**os.environ, "LNEXP_CACHE": str(prepared_cache), "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": str(REPO)}

    def start() -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def runs() -> list[Path]:
        return sorted(p.parent.parent for p in root.glob("*/.hydra/config.yaml"))

    proc = start()
    _wait(lambda: any(_status(r).get("updates", 0) >= 2 for r in runs()), proc, "a cell training")
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out = proc.communicate(timeout=30)[0]
    assert time.monotonic() - t0 < 10 and proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    mine = [ln for ln in out.splitlines() if ln.startswith("lnexp atlas: interrupted")]
    assert mine == ["lnexp atlas: interrupted: 0 cells finished in this session, 1 stopped and kept "
                    "(status interrupted); the same command resumes"], out[-3000:]
    (cell,) = runs()  # no further cell launched
    assert _status(cell)["status"] == "interrupted"
    assert (cell / "checkpoints" / "checkpoint_last.pt").is_file()

    proc = start()  # the same command: the cell resumes; stopped once it has ended
    ended = lambda: _status(root, budget.STATE_FILE).get("costs", {}).get("6")  # noqa: E731
    _wait(ended, proc, "the cell resumed and ended")
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
    assert "lnexp atlas: interrupted: 1 cell finished in this session" in out
    assert "resuming from update" in (cell / "lnexp.log").read_text()
    assert _status(cell)["status"] == "stopped"  # at max_update
    assert not (cell / "checkpoints").exists() and _status(cell)["checkpoints_deleted"]
    disk = sum(f.stat().st_size for f in cell.rglob("*") if f.is_file())
    assert disk < 5e6, disk  # what outcomes.py and the figures read: status, run.json, metrics, norms.csv
    from lnexp.errors import UserError
    from lnexp.evaluation.checkpoints import resolve

    with pytest.raises(UserError, match="deleted when it ended .*checkpoint.at_end=keep"):
        resolve(cell, "best")  # a trained cell, not an untrained one
    state = json.loads((root / budget.STATE_FILE).read_text())
    assert state["spent_s"] > 0 and state["costs"]["6"]  # the budget spent is kept across sessions
    from omegaconf import OmegaConf

    from lnexp import config
    from lnexp.train.loop import train_run

    ovr = [o for o in OmegaConf.load(cell / ".hydra" / "overrides.yaml") if not o.startswith("max_update=")]
    with pytest.raises(UserError, match="has no checkpoint to extend .* delete that folder"):
        train_run(config.compose([*ovr, "max_update=8"]), cell)  # a longer run needs the checkpoint


def test_the_gpus_are_read_from_nvidia_smi_and_cuda_visible_devices():
    listing = "0, NVIDIA H200, 143771\n1, NVIDIA H200, 143771\n2, NVIDIA A100-SXM4-80GB, 81920\n"
    h200, a100 = ("NVIDIA H200", 143771 / 1024), ("NVIDIA A100-SXM4-80GB", 80.0)
    assert host.gpus_of(listing, None) == [Gpu("0", *h200), Gpu("1", *h200), Gpu("2", *a100)]
    assert host.gpus_of(listing, "2,0") == [Gpu("0", *a100), Gpu("1", *h200)]  # as the cells number them
    assert host.gpus_of(listing, "") == [] and host.gpus_of(listing, "-1") == []
    assert [g.id for g in host.gpus_of(listing, "GPU-aa,GPU-bb")] == ["0", "1"]
    assert host.gpus_of("No devices were found\n", None) == []
    cores, gpus, why = resources.machine(["device=cpu"])
    assert cores >= 1 and gpus == [] and why == "device=cpu given"


def test_a_signal_ends_the_rounds_and_no_further_cell_starts(tmp_path):
    """In process, with the zoo tests' fake launcher: SIGINT while the third cell runs; the round
    and the atlas end there, the plan says interrupted, the budget spent is kept."""
    from tests.test_atlas_zoo import FEW, GRID, fake_launcher

    root, log = tmp_path / "runs", []
    launcher = fake_launcher(root, {}, log)
    inner = launcher.fn

    def third_is_stopped(ovr: list[str]) -> float:
        took = inner(ovr)
        if len(log) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, in the main thread
        return took

    launcher.fn = third_is_stopped
    before = signal.getsignal(signal.SIGINT)
    out = rounds.run_atlas(root, "mini", 1e9, 2, launcher, GRID, log=lambda s: None, schemes=FEW)
    assert out["stopped"].startswith("interrupted") and len(log) == 3
    assert signal.getsignal(signal.SIGINT) is before  # the driver's handler is put back
    assert json.loads((root / rounds.PLAN_FILE).read_text())["stopped"] == out["stopped"]
    assert json.loads((root / budget.STATE_FILE).read_text())["costs"]["6"] == [100.0] * 3


# --- issue 49: what a held-out fuzz found ---------------------------------------------------------


def test_a_runs_root_that_is_a_file_is_refused_as_such(tmp_path):
    """Not "atlas_state.json cannot be read ... mend it or delete it": the runs root is a file."""
    (tmp_path / "afile").write_text("x")
    for root, says in ((tmp_path / "afile", "is a file, not a folder"),
                       (tmp_path / "afile" / "runs", f"lies under {tmp_path / 'afile'}, a file")):
        out = lnexp_main("atlas", "--runs-root", str(root), cache=tmp_path / "cache", check=False)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert says in out.stderr and "give a folder" in out.stderr and "atlas_state" not in out.stderr
    assert sorted(os.listdir(tmp_path)) == ["afile"] and (tmp_path / "afile").read_text() == "x"


def test_a_gpu_scale_on_a_machine_without_a_gpu_asks_before_it_trains(tmp_path):
    """--scale gpu trains the paper's model: without a GPU, one line asks for --yes or a budget."""
    root = tmp_path / "runs"
    out = lnexp_main("atlas", "--scale", "gpu", "--runs-root", str(root), "device=cpu",
                     cache=tmp_path / "cache", check=False)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--scale gpu trains the paper's model, sized for a GPU, and this machine has none" in out.stderr
    assert "--budget-min M" in out.stderr and "--yes" in out.stderr
    assert not root.exists()
    # its first cost is an estimate, said so; without a budget none is printed as minutes
    c = resources.choose_resources(2, [], "gpu", (6, 18), max_update=5)
    assert "an estimate: not measured at the gpu scale on a CPU" in c.why[1]
    assert "measured on 2 CPU cores" not in c.why[1] and c.why[-1].startswith("no budget limit")


def test_the_first_line_says_what_the_budget_keeps_and_no_limit_is_no_number(tmp_path):
    from tests.test_atlas_zoo import FEW, GRID, fake_launcher

    for budget_s, says in ((300.0, "budget 5 min (60 s of it kept for the figures; a cell still running "
                                    "when it is spent is stopped and kept), 0.0 spent"),
                           (resources.NO_LIMIT_S, "no budget limit")):
        lines: list[str] = []
        root = tmp_path / str(budget_s)
        rounds.run_atlas(root, "mini", budget_s, 2, fake_launcher(root, {}, []), GRID, log=lines.append,
                         schemes=FEW[:1], cost_s={6: 1.0, 18: 3.0})
        assert says in lines[0], lines[0]
        assert not any("16666667" in ln for ln in lines)


class Sleeper:
    """A launcher whose cells run 30 s unless stopped (as lnexp train stops: interrupted)."""

    name = "sleeper"

    def __init__(self) -> None:
        self.stopped = False

    def run_round(self, cells, jobs, ended) -> None:
        t0 = time.monotonic()
        while not self.stopped and time.monotonic() - t0 < 30:
            time.sleep(0.02)
        for i in range(min(jobs, len(cells))):
            ended(launchers.Ended(i, time.monotonic() - t0, 130 if self.stopped else 0))

    def stop(self) -> None:
        self.stopped = True


def test_cells_still_running_when_the_budget_is_spent_are_stopped_and_kept(tmp_path, monkeypatch):
    """A first cost far below the real one (34 s against 219 s for the gpu scale on CPU) does not
    make the atlas overrun its budget: the cells running at its end stop there, kept to resume."""
    from tests.test_atlas_zoo import FEW, GRID

    monkeypatch.setattr(budget, "FIGURE_RESERVE_S", 0.0)
    before = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    out = rounds.run_atlas(tmp_path / "runs", "mini", 2.0, 2, Sleeper(), GRID, log=lambda s: None,
                           schemes=FEW[:1], cost_s={6: 1.0, 18: 3.0})
    assert time.monotonic() - t0 < 10
    assert out["stopped"].startswith("budget: spent while cells ran") and len(out["interrupted"]) == 2
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


# A cell as lnexp train would leave it, stopped by SIGTERM: status interrupted, then an abort at
# exit (what a C++ thread's "terminate called without an active exception" does to the process)
ABORTING_CELL = """
import json, os, resource, signal, sys, time
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
kv = dict(a.split("=", 1) for a in sys.argv[1:])
d = os.path.join(kv["runs_root"], "_".join(kv[k] for k in ("placement", "norm", "warmup", "seed")))
os.makedirs(os.path.join(d, ".hydra"))
cfg = {"placement": {"name": kv["placement"]}, "norm": {"name": kv["norm"]}, "lr": float(kv["lr"]),
       "depth": {"encoder_layers": int(kv["depth"])}, "warmup": int(kv["warmup"]), "seed": int(kv["seed"])}
open(os.path.join(d, ".hydra", "config.yaml"), "w").write(json.dumps(cfg))
open(os.path.join(d, ".hydra", "overrides.yaml"), "w").write(json.dumps(["experiment=" + kv["experiment"]]))
def stop(*_):
    open(os.path.join(d, "status.json"), "w").write(json.dumps({"status": "interrupted"}))
    os.abort()
signal.signal(signal.SIGTERM, stop)
open(os.path.join(d, "status.json"), "w").write(json.dumps({"status": "running"}))
time.sleep(60)
"""


def test_the_interrupted_summary_counts_what_each_cells_status_says(tmp_path, monkeypatch, capsys):
    """SIGINT to the atlas while two cells run; each records `interrupted`, then aborts at exit
    (exit status 134): neither is counted as finished, and queued cells (no folder) are not kept."""
    root = tmp_path / "runs"
    monkeypatch.setattr(launchers.ProcessLauncher, "TRAIN", (sys.executable, "-S", "-c", ABORTING_CELL))
    monkeypatch.setattr(launchers.ProcessLauncher, "POLL_S", 0.01)

    def interrupt_once_both_run() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end and sum(_status(d).get("status") == "running"
                                             for d in root.glob("*")) < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_both_run, daemon=True).start()
    assert driver.main(["--runs-root", str(root), "--budget-min", "1000", "--jobs", "2"]) == 130
    assert sorted(_status(d)["status"] for d in root.glob("*") if d.is_dir()) == ["interrupted"] * 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("lnexp atlas: interrupted")]
    assert err == ["lnexp atlas: interrupted: 0 cells finished in this session, 2 stopped and kept "
                   "(status interrupted); the same command resumes"]
    plan_doc = json.loads((root / rounds.PLAN_FILE).read_text())
    assert plan_doc["launched"] == [] and len(plan_doc["interrupted"]) == 2  # no cost from a cut cell
    assert json.loads((root / budget.STATE_FILE).read_text())["costs"] == {}


def test_a_failed_cell_is_counted_by_its_status_and_a_killed_one_named_as_killed(tmp_path):
    from lnexp.exit_status import describe
    from tests.test_atlas_zoo import FEW, GRID, fake_launcher

    root = tmp_path / "runs"
    launch = fake_launcher(root, {}, [])
    trained, never = Cell(Arm(Scheme("pre_ln"), 0, 6), 1e-3, 1), Cell(Arm(Scheme("pre_ln"), 40, 6), 1e-3, 1)
    launch(trained.overrides("atlas_mini"))
    run = rounds.AtlasRun(root, "mini", budget.Budget(root, 1e9, {6: 1.0}), 1, launch, GRID, FEW[:1], 12)
    run.session = [trained, never]  # the second never made its folder
    assert run.counts() == (1, 0)
    assert describe([2, 1, 137, 2]) == "exit status 1, 2; killed by signal 9 (SIGKILL)"


# --- issue 51: a grid claim's cells trained for real ---------------------------------------------------


def test_a_tiny_atlas_trains_a_grid_claims_cells_and_evaluates_it(tmp_path, small_multi30k, prepared_cache,
                                                                   monkeypatch):
    """The atlas's rounds on CPU through the cell worker (2+2 layers, 2 updates a cell, the small
    corpus): coverage, then the LR-sensitivity claim Pre-LN vs Post-LN over a half-decade grid of 2
    lrs, its 3 pilot seeds of every lr, each arm's sensitivity from the real runs' losses (the
    first update's loss at init, the final valid loss) and its verdict in the plan."""
    from lnexp.atlas import claims as C
    from lnexp.atlas.grid import Grid
    from lnexp.atlas.outcomes import sensitivity_by_seed

    monkeypatch.setenv("LNEXP_CACHE", str(prepared_cache))  # the cells only read it
    root, lines = tmp_path / "runs", []
    grid = Grid((1e-3,), (0,), (2,), (1,), 1e-3, (1e-3, 1e-2))
    claim = next(c for c in C.CLAIMS if c.id == "atlas_lr_sens_pre_ln")
    setup = launchers.LaunchSetup(root, "mini", overrides=(
        f"dataset.dir={small_multi30k}", "dataset.vocab_size=600", "scale.max_tokens=1000", "max_update=2",
        "eval.subset=1", "threads=1", "track_norms=false"))  # BLEU: a path here, the claim reads losses
    with launchers.make("worker", setup, log=lines.append) as launcher:  # one worker: one fairseq import
        plan = rounds.run_atlas(root, "mini", 1e9, 1, launcher, grid, log=lines.append,
                                schemes=[Scheme("post_ln"), Scheme("pre_ln")], cost_s={2: 5.0}, max_seeds=3,
                                claims=[claim])
    arms = {s: Arm(Scheme(s), 0, 2) for s in ("pre_ln", "post_ln")}
    launched = {Cell(Arm(Scheme(d["placement"]), d["warmup"], d["depth"]), d["lr"], d["seed"])
                for d in plan["launched"]}
    got = rounds.SeenRuns(root, grid, "mini")()
    (v,) = C.evaluate(grid, got, [claim], max_seeds=3)
    k = v.parts[0].n  # pairs of seeds run: the claim's rounds stop once it is decided, else at 3
    want = {Cell(a, lr, s) for a in arms.values() for lr in grid.sensitivity_lrs for s in range(1, k + 1)}
    assert launched == want and not plan["failed"], [ln for ln in lines if "lnexp atlas" in ln]
    assert k == 3 or (k >= 2 and v.verdict != "undecided")  # coverage's 2 cells are the grid's too
    sens = {s: sensitivity_by_seed(got, a, grid.sensitivity_lrs) for s, a in arms.items()}
    assert all(sorted(x) == list(range(1, k + 1)) and min(x.values()) >= 0 for x in sens.values()), sens
    assert plan["claims"] == {claim.id: v.text}  # the driver's last word is the claim's verdict
    assert v.verdict != "undecided" or "more runs" in v.text
