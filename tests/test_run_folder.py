"""The run folder under faults: damaged lines, full disks, corrupt checkpoints, two launches of
one run, and the fair share of cores (lnexp.rundir, lnexp.runtime.runlock, lnexp.runtime.sharing)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lnexp import rundir
from tests.conftest import REPO

# On tiny_multi30k (200 pairs, prepared once per session: tiny_prepared_cache), 2+2 layers and a
# 4-sentence BLEU: these runs check a run folder's files. Batches of 400 tokens make an epoch of
# more than 4 updates, so that every run here stops inside its first epoch.
SMALL = ["dataset.vocab_size=600", "scale.max_tokens=400", "eval.subset=4",
         "divergence.plateau_epoch=99", "threads=1", "depth.encoder_layers=2",
         "depth.decoder_layers=2"]


def test_damaged_lines_are_skipped_with_a_warning_and_later_lines_kept(tmp_path, caplog):
    metrics = tmp_path / rundir.METRICS
    good = [{"epoch": e, "updates": 10 * e, "valid_loss": 5.0 - e} for e in (1, 2, 3)]
    metrics.write_text("\n".join(['{"epoch": 1, "upd', json.dumps(good[1]), json.dumps(good[2]),
                                  '{"epoch": 4, "updates": 4']))
    updates = tmp_path / rundir.UPDATES
    updates.write_text(",".join(rundir.UPDATE_FIELDS) + "\n" + "1,1,0.1,5,4,1,100,,0\n"
                       + "2,1,0.1,\x00\x00\n" + "3,1,0.1,5,4,1,100,,0\n" + "4,1,0.")
    with caplog.at_level(logging.WARNING, logger="lnexp"):
        assert rundir.read_metrics(metrics) == good[1:]
        assert [r["update"] for r in rundir.read_updates(updates)] == ["1", "3"]
    warned = [r.getMessage() for r in caplog.records]
    assert any(f"{metrics} line 1 is damaged" in w for w in warned)
    assert any(f"{metrics} line 4 is damaged" in w for w in warned)
    assert any(f"{updates} line 3 is damaged" in w for w in warned)
    assert any(f"{updates} line 5 is damaged" in w for w in warned)


def test_a_full_disk_names_the_path_and_free_space_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / rundir.STATUS
    rundir.write_json(target, {"status": "running", "epoch": 2, "updates": 40})

    def fill_disk(tmp: Path) -> None:
        tmp.write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(rundir.DiskError) as e:
        rundir.write_with(target, fill_disk)
    msg = str(e.value)
    assert "\n" not in msg and str(target) in msg and "No space left" in msg and "MB free" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == [rundir.STATUS]
    assert rundir.read_json(target)["updates"] == 40  # the good file is untouched
    rundir.record_failure(tmp_path, msg)
    assert rundir.read_json(target) == {"status": "failed", "epoch": 2, "updates": 40, "error": msg}


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_a_lock_refuses_a_second_launch_and_a_dead_holders_lock_is_taken_over(tmp_path, caplog):
    import socket

    from lnexp.runtime import runlock

    run = tmp_path / "run"
    with runlock.hold(run):
        with pytest.raises(runlock.RunLocked) as e:
            runlock.acquire(run)
        msg = str(e.value)
        assert "\n" not in msg and f"pid {os.getpid()} on host {socket.gethostname()}" in msg
        assert "wait for it to finish, or stop it" in msg
    assert not rundir.run_paths(run)["lock"].exists()  # released at the end
    dead = _dead_pid()
    rundir.run_paths(run)["lock"].write_text(json.dumps(
        {"pid": dead, "host": socket.gethostname(), "since": time.time()}))
    with caplog.at_level(logging.WARNING, logger="lnexp.train"):
        path = runlock.acquire(run)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert any(f"taking over its lock from pid {dead}" in r.getMessage() for r in caplog.records)
    runlock.release(path)


def test_fair_share_of_cores(tmp_path, monkeypatch):
    import socket

    from lnexp.runtime import sharing

    monkeypatch.setattr(sharing, "cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert sharing.fair_share(0, 1)[0] == 8
    assert sharing.fair_share(0, 4) == (2, "8 cores / 4 joblib jobs")
    assert sharing.fair_share(3, 1)[0] == 2 and sharing.fair_share(20, 1)[0] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert sharing.fair_share(0, 1) == (1, "OMP_NUM_THREADS=1")
    monkeypatch.setenv(sharing.ACTIVE_ENV, str(tmp_path))
    host = socket.gethostname()
    (tmp_path / "live.json").write_text(json.dumps({"pid": os.getppid(), "host": host}))
    (tmp_path / "dead.json").write_text(json.dumps({"pid": _dead_pid(), "host": host}))
    assert sharing.others_on_host() == 1
    assert not (tmp_path / "dead.json").exists()  # a dead training's entry is cleaned up


@pytest.fixture(scope="module")
def cache(tiny_prepared_cache) -> Path:
    """One prepared corpus for the trainings of this module: the session's tiny one."""
    return tiny_prepared_cache


def _train(argv: list[str]) -> int:
    """``lnexp train`` in this process (no interpreter start-up); Hydra's log handlers are removed
    afterwards (they hold the stream of this test's output capture)."""
    from lnexp.train.run import main

    handlers, level = logging.root.handlers[:], logging.root.level
    policy = os.environ.get("OMP_WAIT_POLICY")
    try:
        return main(argv)
    finally:
        logging.root.handlers[:], logging.root.level = handlers, level
        if policy is None:  # main() may set it for this process's later children
            os.environ.pop("OMP_WAIT_POLICY", None)


def test_full_disk_stops_keeps_the_last_checkpoint_then_a_corrupt_one_falls_back(
        tmp_path, tiny_multi30k, cache, monkeypatch, capsys):
    """ENOSPC at the third checkpoint (update 3): one line, status failed with its counts, no
    temporary file, checkpoint_last.pt the complete one of update 2. Then checkpoint_last.pt is cut
    in half: the re-run resumes from checkpoint_previous.pt (update 1) and finishes."""
    from lnexp import fairseq_adapter as fa

    monkeypatch.setenv("LNEXP_CACHE", str(cache))
    monkeypatch.setenv("LNEXP_ACTIVE_DIR", str(tmp_path / "active"))
    runs = tmp_path / "runs"
    argv = [f"dataset.dir={tiny_multi30k}", *SMALL, "max_update=4", "save_interval_updates=1",
            f"runs_root={runs}"]
    real, saves = fa.save_checkpoint_file, []

    def disk_fills_at_the_third(state: dict, path: Path) -> None:
        saves.append(path)
        real(state, path)
        if len(saves) == 3:
            with open(path, "r+b") as f:
                f.truncate(path.stat().st_size // 2)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fa, "save_checkpoint_file", disk_fills_at_the_third)
    assert _train(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    (run,) = runs.iterdir()
    paths = rundir.run_paths(run)
    assert len(err) == 1 and f"cannot write {paths['last']}: No space left" in err[0], err
    assert "MB free" in err[0] and "run the same command again" in err[0]
    status = rundir.read_json(paths["status"])
    assert status["status"] == "failed" and "No space left" in status["error"]
    assert status["updates"] == status["resumes_from"] == 2 and status["epoch"] == 0
    assert sorted(p.name for p in paths["checkpoints"].iterdir()) == [
        rundir.CHECKPOINT_LAST, rundir.CHECKPOINT_PREVIOUS]  # no temporary file left
    assert rundir.checkpoint_damage(paths["last"]) is None
    assert fa.load_checkpoint_state(paths["last"])["extra_state"]["lnexp"]["saved_update"] == 2
    assert not paths["lock"].exists()
    from lnexp.results import main as results

    assert results(["--runs-root", str(runs)]) == 0
    listed = capsys.readouterr().out
    assert "1 failed" in listed and "failed: cannot write" in listed and "MB free" in listed

    monkeypatch.setattr(fa, "save_checkpoint_file", real)
    data = paths["last"].read_bytes()
    paths["last"].unlink()  # (a new inode: checkpoint_previous.pt is not its hard link)
    paths["last"].write_bytes(data[: len(data) // 2])
    assert _train(argv) == 0
    out = capsys.readouterr()
    assert f"{paths['last']} is damaged" in out.out + out.err + _log_text(run)
    assert "resuming from update 1" in out.out + out.err + _log_text(run)
    status = rundir.read_json(paths["status"])
    assert status["status"] == "stopped" and status["updates"] == 4
    assert [int(r["update"]) for r in rundir.read_updates(paths["updates"])] == [1, 2, 3, 4]


def _log_text(run: Path) -> str:
    return "".join(p.read_text() for p in run.glob("*.log"))


def test_a_second_launch_of_a_running_run_refuses_and_the_first_finishes(
        tmp_path, tiny_multi30k, cache, monkeypatch, capsys):
    """The first launch is stopped (SIGSTOP) while it holds the run, so that the second finds it
    alive whatever the machine's speed; once continued it finishes as if alone."""
    import signal

    runs = tmp_path / "runs"
    monkeypatch.setenv("LNEXP_CACHE", str(cache))
    monkeypatch.setenv("LNEXP_ACTIVE_DIR", str(tmp_path / "active"))
    argv = [f"dataset.dir={tiny_multi30k}", *SMALL, "max_update=4", f"runs_root={runs}"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    first = subprocess.Popen([sys.executable, "-m", "lnexp.cli", "train", *argv], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list(runs.glob(f"*/{rundir.LOCK}")):
            assert first.poll() is None, first.communicate()[0]
            time.sleep(0.1)
        first.send_signal(signal.SIGSTOP)
        try:
            assert _train(argv) == 2
        finally:
            first.send_signal(signal.SIGCONT)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"by pid {first.pid} on host" in err[0], err
        assert "wait for it to finish, or stop it" in err[0]
        out, _ = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, out[-3000:]
    (run,) = runs.iterdir()
    status = rundir.read_json(rundir.run_paths(run)["status"])
    assert status["status"] == "stopped" and status["updates"] == 4
    assert "threads: 1 (threads=1 given)" in out


def test_a_resume_never_trains_past_max_update_whatever_its_status_says(
        tmp_path, tiny_multi30k, cache, monkeypatch, capsys):
    """A run stopped at max_update=2, run again with the same command after its status.json was
    damaged, or left saying running at its last checkpoint (a kill after that checkpoint, before
    the final status), trains no update: the status is written again from the checkpoint."""
    monkeypatch.setenv("LNEXP_CACHE", str(cache))
    monkeypatch.setenv("LNEXP_ACTIVE_DIR", str(tmp_path / "active"))
    runs = tmp_path / "runs"
    argv = [f"dataset.dir={tiny_multi30k}", *SMALL, "max_update=2", f"runs_root={runs}"]
    assert _train(argv) == 0
    (run,) = runs.iterdir()
    paths = rundir.run_paths(run)
    first = rundir.read_json(paths["status"])
    assert first["status"] == "stopped" and first["updates"] == 2
    killed = {"status": "running", "epoch": 1, "updates": 2, "resumes_from": 2, "pid": _dead_pid(),
              "host": os.uname().nodename, "heartbeat": time.time(), "stale_after_s": 600}
    for left in ('{"status": "stop', json.dumps(killed)):
        paths["status"].write_text(left)
        capsys.readouterr()
        assert _train(argv) == 0
        said = "".join(capsys.readouterr()) + _log_text(run)
        assert "nothing to train" in said and "resuming" not in said
        status = rundir.read_json(paths["status"])
        assert {k: status[k] for k in ("status", "epoch", "updates", "max_update")} == {
            "status": "stopped", "epoch": 1, "updates": 2, "max_update": 2}
        # rewritten from the checkpoint, the status still says the epoch was cut at update 2
        assert status["last_epoch_complete"] is first["last_epoch_complete"] is False
        assert [int(r["update"]) for r in rundir.read_updates(paths["updates"])] == [1, 2]
        assert [r["updates"] for r in rundir.read_metrics(paths["metrics"])] == [2]
