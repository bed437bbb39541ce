"""scripts/gpu_session.py, the prepared GPU session, end to end on CPU (``--tiny``): every part
runs and leaves its CSV/JSON files; the precision table of scripts/gpu_check.py (with its
data-parallel row of 2 gloo workers), the sharing table of scripts/gpu_share.py, the gpu scale's
Fig. 2 contrast and the GPU tests (skipped here) included. No timing assertions."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def rows(path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def positive(x: str) -> bool:
    v = float(x)
    return math.isfinite(v) and v > 0


def test_gpu_session_tiny_runs_every_part_and_writes_its_files(tmp_path, small_multi30k):
    out = tmp_path / "out"
    env = {**os.environ, "LNEXP_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "scripts/gpu_session.py", "--tiny", "--out", str(out),
                           "--work", str(tmp_path / "work"), f"--dataset-dir={small_multi30k}",
                           "--vocab-size=600"], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600)
    logs = "".join((p.name + ":\n" + p.read_text()[-1500:]) for p in out.glob("*.log"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:] + logs
    session = json.loads((out / "session.json").read_text())
    parts = ("gpu_tests", "precision", "sharing", "fig2", "fig2_figure")
    assert all(session[p]["rc"] == 0 and session[p]["seconds"] <= session[p]["budget_s"] for p in parts)

    check = {r["precision"]: r for r in rows(out / "gpu_check.csv")}
    fp32 = check["fp32"]
    assert positive(fp32["lnexp tok/s"]) and positive(fp32["stock tok/s"]) and positive(fp32["of peak"])
    ratio = float(fp32["lnexp tok/s"]) / float(fp32["stock tok/s"])
    assert float(fp32["lnexp/stock"]) == pytest.approx(ratio)
    assert fp32["overflows l/s"] == "0/0" and float(fp32["gnorm vs fp32"]) == 0.0
    assert fp32["stock setting"] == "fp32" and fp32["stock settings tok/s"].startswith("fp32 ")
    assert "needs a GPU" in check["bf16"]["model"] and "needs a GPU" in check["fp16"]["model"]
    assert check["fp32 x 2"]["world"] == "2" and positive(check["fp32 x 2"]["lnexp tok/s"])
    assert json.loads((out / "gpu_check.json").read_text())["device"] == "cpu"

    share = {int(r["runs"]): r for r in rows(out / "gpu_share.csv")}
    assert set(share) == {1, 2} and not any(r["error"] for r in share.values())
    assert float(share[1]["x_one_run"]) == 1.0 and positive(share[2]["aggregate_tok_s"])

    contrast = json.loads((out / "fig2" / "fig2_checks.json").read_text())
    (nw,) = [c for c in contrast["checks"] if c["id"] == "fig2_no_warmup_fails"]
    assert nw["measured"]["long_warmup"] == 465 and len(nw["measured"]["per_seed"]) == 1
    assert sorted(p.name for p in (out / "runs").iterdir()) and not list(out.rglob("*.pt"))

    suite = ET.parse(out / "pytest_gpu.xml").getroot().find("testsuite")
    assert int(suite.get("skipped")) == int(suite.get("tests")) > 0  # no GPU here: every test skips


def session_module():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_session
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return gpu_session


def test_the_session_fits_ten_minutes_of_a_fifteen_minute_window():
    """The parts' budgets, sized from the H200 sessions (2026-12-04): each at least what its part
    took there (install 15 s, the precision table 74 s, sharing 112 s, the GPU tests 97 s cold for
    18 of their 19), and Fig. 2's epochs (~25 s each with four runs side by side, ~15 s to start)
    inside its budget. Every session fits one device call (600 s) with 40 s to spare, the atlas's
    with its default budget; --tiny only stretches them."""
    gpu_session = session_module()
    b = gpu_session.budgets("measure")
    assert b["install"] > 15 and b["precision"] > 74 and b["sharing"] > 112 and b["gpu_tests"] > 97
    epochs = gpu_session.FIG2_EPOCHS  # the default of --fig2-epochs: as many as fit, seeds kept
    assert 15 + 25 * epochs + 20 <= b["fig2"]  # with 20 s for the last validation and BLEU
    for session in gpu_session.SESSIONS:
        assert sum(gpu_session.budgets(session).values()) <= 560, session
        tiny = gpu_session.budgets(session, tiny=True)
        assert tiny == {k: v * gpu_session.TINY_SLACK for k, v in gpu_session.budgets(session).items()}
    assert gpu_session.budgets("atlas", atlas_min=3)["atlas"] == 3 * 60 + 60
    assert gpu_session.SESSIONS["atlas"]["atlas"] == 60  # budgets() derives a value, changes nothing


def test_a_resumed_atlas_gets_this_sessions_minutes_on_top_of_what_it_spent(tmp_path):
    """lnexp atlas's --budget-min counts over resumes: a session resuming an atlas that spent 2.5
    minutes with --atlas-min 4 gives it 6.5 (a window of 2026-12-04 gave 2.6 and ran no cell)."""
    gpu_session = session_module()
    assert gpu_session.atlas_budget(tmp_path, 4) == 4
    (tmp_path / "atlas_state.json").write_text(json.dumps({"spent_s": 150.0, "costs": {}}))
    assert gpu_session.atlas_budget(tmp_path, 4) == 6.5


def test_without_a_gpu_the_session_stops_at_once_unless_tiny(tmp_path):
    """On a machine where torch sees no GPU the real session would train the paper's model on CPU
    until its budgets killed it: one line, exit 2, nothing written."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the session would run")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "scripts/gpu_session.py", "--session", "speed", "--out",
                           str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and not out.exists()
    (line,) = proc.stderr.strip().splitlines()
    assert "no GPU" in line and "--tiny" in line


def test_the_speed_session_times_each_setting_and_a_stop_ends_the_parts_group(tmp_path, small_multi30k):
    """``--session speed --tiny``: the GPU tests (skipped here) and scripts/gpu_speed.py's table:
    the default, each CPU-applicable speed setting alone and stock fairseq on Pre-LN, the best
    combination (or none) against them on Pre-LN and Post-LN, a profile. Then the same session
    stopped with SIGTERM while a part runs: the part's whole process group ends with it."""
    import signal
    import time

    out = tmp_path / "out"
    env = {**os.environ, "LNEXP_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "scripts/gpu_session.py", "--session", "speed", "--tiny", "--work",
           str(tmp_path / "work"), f"--dataset-dir={small_multi30k}", "--vocab-size=600"]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600)
    logs = "".join((p.name + ":\n" + p.read_text()[-2500:]) for p in out.glob("*.log"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:] + logs
    session = json.loads((out / "session.json").read_text())
    assert set(session) >= {"gpu_tests", "speed"} and "precision" not in session
    table = rows(out / "gpu_speed.csv")
    singles = {r["run"]: r for r in table if r["phase"] == "singles"}
    assert set(singles) == {"default", "syncs=every", "adam=foreach", "adam=fused", "stock fp32"}
    assert all(positive(r["tok/s"]) and positive(r["x default"]) and r["correct"] == "True"
               for r in table)
    assert float(singles["default"]["x default"]) == 1.0
    best = [r for r in table if r["phase"] == "best"]
    assert {r["placement"] for r in best} == {"pre_ln", "post_ln"}
    assert {"default", "stock fp32"} <= {r["run"] for r in best}
    meta = json.loads((out / "gpu_speed.json").read_text())
    assert meta["best"]["fp32"]["stock"] == "stock fp32" and meta["profile"]["wall_s"] > 0
    assert (out / "profile.txt").read_text().count("\n") > 5

    stopped = subprocess.Popen([*cmd, "--out", str(tmp_path / "stopped")], env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state, deadline = tmp_path / "stopped" / "session.json", time.time() + 120
    while time.time() < deadline:
        running = [v for v in (json.loads(state.read_text()) if state.exists() else {}).values()
                   if isinstance(v, dict) and v.get("running")]
        if running:
            break
        time.sleep(0.2)
    assert running, "no part started"
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) != 0
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(running[0]["pid"], 0)


def test_the_atlas_session_runs_the_atlas_and_its_figures_and_packs_one_tarball(tmp_path, small_multi30k):
    """``--session atlas --tiny``: install skipped, a few tiny atlas cells through the cell worker,
    the atlas's figures, the cells' small files (no checkpoint) and one tarball to bring back."""
    import tarfile

    out, tar = tmp_path / "out", tmp_path / "back" / "atlas.tgz"
    env = {**os.environ, "LNEXP_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "scripts/gpu_session.py", "--session", "atlas", "--tiny",
                           "--out", str(out), "--work", str(tmp_path / "work"), "--tar", str(tar),
                           f"--dataset-dir={small_multi30k}", "--vocab-size=600"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    logs = "".join((p.name + ":\n" + p.read_text()[-2500:]) for p in out.glob("*.log"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:] + logs
    session = json.loads((out / "session.json").read_text())
    assert set(session) >= {"atlas", "atlas_figure"} and "gpu_tests" not in session
    assert session["atlas_figure"]["rc"] == 0 and "--launcher worker" in session["atlas"]["command"]
    plan = json.loads((out / "atlas" / "atlas_plan.json").read_text())
    assert plan["launched"] and plan["claims"]  # cells ran, and every claim has its verdict text
    cells = list((out / "atlas").glob("*/status.json"))
    assert cells and all((c.parent / "metrics.jsonl").is_file() for c in cells)
    assert all((c.parent / "updates.csv").is_file() for c in cells)  # the loss at init (LR sensitivity)
    # what a later window resumes from (--resume-atlas): each cell's overrides name its experiment
    from lnexp.results import collect_runs

    kept = collect_runs(out / "atlas")
    assert len(kept) == len(cells) and {r.experiment for r in kept} == {"atlas_mini"}
    assert not list(out.rglob("*.pt")) and (out / "atlas" / "figures" / "atlas_checks.json").is_file()
    with tarfile.open(tar) as t:
        names = t.getnames()
    assert "out/session.json" in names and "out/atlas/atlas_plan.json" in names
