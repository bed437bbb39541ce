"""Data-parallel training through fairseq's runtime on CPU (two gloo workers): the same updates as
one process accumulating two batches, one run folder, and a resumable run after a killed worker."""

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

from tests.conftest import REPO, lnexp_main

# tiny and deterministic: dropout 0, 2+2 layers, ~25 batches of 400 tokens per epoch; BLEU on 4
# sentences (rank 0 scores it once: that it does, not the score, is under test)
TINY = ["dataset.vocab_size=600", "depth.encoder_layers=2", "depth.decoder_layers=2",
        "scale.max_tokens=400", "scale.dropout=0", "eval.subset=4",
        "divergence.plateau_epoch=99", "threads=1"]


def updates(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "updates.csv") as f:
        return list(csv.DictReader(f))


SHORT = ["max_epoch=1", "max_update=10"]


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory, small_multi30k, prepared_cache) -> Path:
    """The reference: one process, each update summing two batches (scale.update_freq=2)."""
    tmp = tmp_path_factory.mktemp("accum")
    lnexp_main("train", f"dataset.dir={small_multi30k}", *TINY, *SHORT, "scale.update_freq=2",
               f"runs_root={tmp / 'runs'}", cache=prepared_cache)
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


def assert_same_updates(run_dir: Path, reference: Path) -> None:
    ours, ref = updates(run_dir), updates(reference)
    assert len(ours) == len(ref) == 10
    for a, b in zip(ours, ref, strict=True):
        assert a["update"] == b["update"] and a["ntokens"] == b["ntokens"]
        for key in ("loss", "nll_loss", "gnorm", "lr"):
            assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-3), (a["update"], key)


def assert_one_run_folder(dp: Path) -> None:
    run = json.loads((dp / "run.json").read_text())
    assert run["world_size"] == 2 and run["fairseq_flags"]["distributed_world_size"] == "2"
    assert run["fairseq_flags"]["distributed_backend"] == "gloo"
    assert json.loads((dp / "status.json").read_text())["status"] == "stopped"  # max_update=10
    assert len((dp / "metrics.jsonl").read_text().splitlines()) == 1  # BLEU once, not per rank
    assert sorted(p.name for p in (dp / "hyps").iterdir()) == ["valid.ref", "valid_epoch001.txt"]
    assert len(list((dp / "tb").glob("events.*"))) == 1  # rank 0's TensorBoard only
    assert sorted(p.name for p in (dp / "checkpoints").iterdir()) == [
        "checkpoint_best.pt", "checkpoint_last.pt"]


def test_two_gloo_workers_follow_one_process_with_update_freq_2(tmp_path, small_multi30k,
                                                                prepared_cache, accumulated):
    # the launch in this process: the two ranks are the processes it spawns (fresh interpreters,
    # gloo between them), as from a `lnexp train` of its own
    lnexp_main("train", f"dataset.dir={small_multi30k}", *TINY, *SHORT, "distributed.world_size=2",
               f"runs_root={tmp_path / 'dp'}", cache=prepared_cache)
    (dp,) = (tmp_path / "dp").iterdir()  # one run folder, named without the world size
    assert "world_size" not in dp.name
    assert_same_updates(dp, accumulated)
    assert_one_run_folder(dp)


def test_torchrun_ranks_train_the_same_run(tmp_path, small_multi30k, prepared_cache, accumulated):
    """Started by torchrun (its environment, detected as fairseq does): each process one rank."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "LNEXP_CACHE": str(prepared_cache), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([str(torchrun), "--nproc_per_node=2", "-m", "lnexp.cli", "train",
                           f"dataset.dir={small_multi30k}", *TINY, *SHORT,
                           "distributed.world_size=2", f"runs_root={tmp_path / 'tr'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("(losses in bits/token") == 1  # the end summary: rank 0 alone
    (dp,) = (tmp_path / "tr").iterdir()
    assert_same_updates(dp, accumulated)
    assert_one_run_folder(dp)


def spawned_workers(parent: int) -> list[int]:
    """Processes that ``parent`` started with multiprocessing's spawn (fairseq's workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return sorted(found)


def test_killed_worker_fails_the_run_and_a_rerun_resumes_with_another_world_size(
        tmp_path, small_multi30k, prepared_cache):
    run_dir = tmp_path / "runs" / "run"  # a short name: this run's overrides make a long one
    args = [f"dataset.dir={small_multi30k}", *TINY, "max_epoch=3", "max_update=30",
            "save_interval_updates=3", f"runs_root={run_dir.parent}", f"hydra.run.dir={run_dir}"]
    cache = prepared_cache  # the corpus prepared once, before the workers read it
    env = {**os.environ, "LNEXP_CACHE": str(cache), "PYTHONWARNINGS": "ignore"}
    with open(tmp_path / "out.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lnexp.cli", "train", *args,
                                 "distributed.world_size=2"], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while not (run_dir / "checkpoints" / "checkpoint_last.pt").exists() \
                and proc.poll() is None:
            assert time.time() < deadline, "no checkpoint in 10 minutes"
            time.sleep(0.2)
        workers = spawned_workers(proc.pid)
        assert len(workers) == 2, (workers, (tmp_path / "out.log").read_text()[-2000:])
        os.kill(workers[-1], signal.SIGKILL)
        proc.wait(timeout=300)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] in ("failed", "interrupted"), status
    assert proc.returncode != 0
    kept = updates(run_dir)  # the rows of the last checkpoint
    assert kept and len(kept) < 30
    lnexp_main("train", *args, "distributed.world_size=1", cache=cache)  # in-process
    assert json.loads((run_dir / "status.json").read_text())["status"] == "stopped"  # max_update=30
    rows = updates(run_dir)
    assert [int(r["update"]) for r in rows] == list(range(1, 31))
    assert rows[:len(kept)] == kept  # resumed from the checkpoint, not restarted
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 1


@pytest.mark.parametrize("overrides,device,needle", [
    (["distributed.world_size=0"], "cpu", "must be a whole number >= 1"),
    (["distributed.world_size=2", "distributed.backend=nccl"], "cpu", "backend=gloo on CPU"),
    (["distributed.world_size=2", "distributed.ddp_backend=pytorch_ddp"], "cpu",
     "ddp_backend=legacy_ddp on CPU"),
    (["distributed.world_size=64"], "cuda", "GPU(s) are visible"),
])
def test_distributed_settings_that_cannot_run_name_the_fix(overrides, device, needle, monkeypatch):
    from lnexp.errors import ConfigError
    from lnexp.probes import compose_config
    from lnexp.train.settings import distributed_flags

    for key in ("MASTER_ADDR", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        distributed_flags(compose_config(overrides), device)


def test_distributed_flags_are_fairseqs():
    from lnexp.probes import compose_config
    from lnexp.train.settings import distributed_flags

    assert distributed_flags(compose_config([]), "cpu") == {"distributed_world_size": 1}
    flags = distributed_flags(compose_config(["distributed.world_size=2", "distributed.port=12345"]),
                              "cpu")
    assert flags["distributed_backend"] == "gloo" and flags["ddp_backend"] == "legacy_ddp"
    assert flags["distributed_world_size"] == 2 and flags["distributed_port"] == 12345
