#!/usr/bin/env python
"""The prepared GPU session: on a machine with one GPU, its own torch and no network, the GPU
measurements lnexp lacks, each part under its own time budget, each result a small file under OUT
(runs, checkpoints, data cache and venv stay in ``--work``). docs/multi-gpu.md "The prepared GPU
session" says what each session measures and how its budgets were sized; docs/performance.md and
docs/atlas.md give the results.

    python3 scripts/gpu_session.py --session speed --out "$OUT" --wheels wheelhouse-h200   # on the GPU
    python scripts/gpu_session.py --session speed --tiny --out /tmp/gpu-tiny              # CPU, tiny

Sessions (``--session``), each a list of parts with budgets in seconds (``budgets``):
``measure`` (GPU tests, scripts/gpu_check.py, gpu_share.py, a short Fig. 2 at the gpu scale),
``speed`` (GPU tests, scripts/gpu_speed.py: the speed settings timed against stock, a profile) and
``atlas`` (the whole mini atlas through the cell worker within ``--atlas-min``, then its figures).
A part past its budget gets SIGINT (runs and sweeps save what they have), SIGKILL 15 s later, and
the session goes on; a signal to the session ends the running part's whole process group. Without a
visible GPU it stops at once, unless ``--tiny`` (every part on CPU with a tiny model, its budgets 4
times as long: tests/test_gpu_session.py). session.json: each part's command, exit status, seconds
and budget; ``--tar`` packs OUT into one tarball (the device tool brings back 8 files).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# each session's parts and budgets (seconds), sized from the H200 sessions of 2026-12-04
# (docs/multi-gpu.md; the GPU tests took 97 s cold, 18 of 19 done): measure 560 s in all, speed
# 510 s, atlas --atlas-min plus 150 s: each within one 600-second device call
SESSIONS: dict[str, dict[str, float]] = {
    "measure": {"install": 30, "gpu_tests": 150, "precision": 120, "sharing": 120, "fig2": 120,
                "fig2_figure": 20},
    "speed": {"install": 30, "gpu_tests": 150, "speed": 330},
    "atlas": {"install": 30, "atlas": 60, "atlas_figure": 60},  # atlas: + --atlas-min minutes
}
ATLAS_MIN = 5.0  # the atlas's own budget (lnexp atlas --budget-min) in the atlas session
TINY_ATLAS = ["max_update=2", "eval.subset=4", "scale.max_tokens=512", "threads=1"]
TINY_ATLAS_MIN = 1.3  # --tiny's atlas budget (minutes): the smallest that holds one tiny cell
FIG2_EPOCHS = 3  # ~25 s each with four runs side by side on the H200, ~15 s to start: 90 s of 120
TINY_SLACK = 4  # --tiny on a few busy CPU cores: the GPU budgets x4 (2 cores, load 6: 226 s in all)
TINY = ["scale.arch=ln_transformer_mini", "depth.encoder_layers=2", "depth.decoder_layers=2",
        "scale.max_tokens=512", "max_update=3", "eval.subset=4"]


def budgets(session: str, tiny: bool = False, atlas_min: float = ATLAS_MIN) -> dict[str, float]:
    """The parts of ``session`` and their budgets in seconds, for this run of the session."""
    b = dict(SESSIONS[session])
    if session == "atlas":  # the atlas's own budget, and a minute for the cells in flight
        b["atlas"] += atlas_min * 60
    return {k: v * (TINY_SLACK if tiny else 1) for k, v in b.items()}


def stop(proc: subprocess.Popen) -> None:
    """End a part's whole process group: SIGINT first, as Ctrl-C (sweeps and runs save what they
    have), SIGKILL 15 s later."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()
    try:  # what the part left behind in its group (a sweep's workers)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_part(name: str, cmd: list[str], out: Path, budget: float, env: dict[str, str],
             log: dict) -> int:
    """Run one part under its budget in its own process group (``stop`` past the budget, or when
    the session itself is stopped), its output to OUT/NAME.log."""
    t = time.time()
    with open(out / f"{name}.log", "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
        log[name] = {"command": " ".join(cmd), "pid": proc.pid, "running": True, "budget_s": budget}
        (out / "session.json").write_text(json.dumps(log, indent=1) + "\n")
        try:
            rc = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            stop(proc)
            rc = 124
        except BaseException:  # SIGINT/SIGTERM to the session: the part's whole group ends too
            stop(proc)
            raise
    log[name] = {"command": " ".join(cmd), "rc": rc, "seconds": round(time.time() - t, 1),
                 "budget_s": budget, "timed_out": rc == 124}
    print(f"gpu_session: {name}: rc {rc}, {time.time() - t:.0f} s of {budget:.0f}", flush=True)
    (out / "session.json").write_text(json.dumps(log, indent=1) + "\n")
    return rc


def install(wheels: Path, out: Path, work: Path, env: dict[str, str], log: dict,
            budget: float) -> str:
    """A venv over this Python's packages with lnexp from the wheelhouse; its python."""
    venv = work / "venv"
    import sysconfig

    # this Python may itself be a venv (the GPU machine's is): its packages join by a .pth line
    # (`import site; site.addsitedir(...)`, so that .pth files there are read too)
    base = sysconfig.get_paths()["purelib"]
    (work / "base_env.pth").write_text(f"import site; site.addsitedir({base!r})\n")
    site = ("import sysconfig; print(sysconfig.get_paths()['purelib'])")
    script = (f"set -e; {sys.executable} -m venv --system-site-packages --without-pip {venv}; "
              f"cp {work / 'base_env.pth'} \"$({venv}/bin/python -c \"{site}\")/_base_env.pth\"; "
              f"{venv}/bin/python -c 'import torch; print(\"torch before\", torch.__version__)'; "
              f"{sys.executable} -m pip --python {venv}/bin/python install --no-index --no-compile "
              f"--find-links {wheels} -q lnexp; "
              f"{venv}/bin/python -c 'import torch, lnexp; print(\"torch after\", "
              f"torch.__version__, torch.__file__); print(\"lnexp\", lnexp.__file__)'")
    rc = run_part("install", ["bash", "-c", script], out, budget, env, log)
    text = (out / "install.log").read_text()
    before = next((ln.split()[-1] for ln in text.splitlines() if ln.startswith("torch before")), None)
    after = next((ln.split()[2] for ln in text.splitlines() if ln.startswith("torch after")), None)
    (out / "install.json").write_text(json.dumps({"rc": rc, "torch_before": before, "torch_after": after,
                                                  "torch_untouched": before is not None and before == after,
                                                  "wheels": str(wheels)}, indent=1) + "\n")
    return str(venv / "bin" / "python") if rc == 0 else sys.executable


def atlas_budget(runs: Path, minutes: float) -> float:
    """lnexp atlas's --budget-min for ``minutes`` more of atlas: its budget counts over resumes
    (atlas_state.json's spent_s), so what a resumed atlas has spent goes on top."""
    spent = float((read_json(runs / "atlas_state.json") or {}).get("spent_s", 0.0))
    return round(spent / 60 + minutes, 2)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def gpu_visible() -> str | None:
    """None where torch sees a CUDA GPU, else why not (one line). A CPU build of torch (its version
    ends in +cpu, read from its metadata, as lnexp.runtime.host.cpu_torch reads it: this script
    starts before lnexp is installed) sees none: said without importing torch (seconds)."""
    try:
        from importlib.metadata import version

        installed = version("torch")
    except Exception:  # noqa: BLE001 - no torch metadata: importing it decides
        installed = ""
    if installed.endswith("+cpu"):
        return f"torch {installed} is a CPU build (no CUDA)"
    try:
        import torch
    except ImportError as e:
        return f"torch cannot be imported ({e})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results folder ($OUT on the device machine)")
    p.add_argument("--wheels", type=Path, default=None, help="wheelhouse to install from (make wheelhouse)")
    p.add_argument("--work", type=Path, default=Path("/tmp/lnexp-gpu-session"),
                   help="venv, data cache and runs with their checkpoints (only small files go to OUT); "
                        "an atlas there resumes")
    p.add_argument("--session", choices=tuple(SESSIONS), default="measure",
                   help="measure: GPU tests, precision, sharing, Fig. 2 (default); speed: GPU tests, "
                        "the speed settings against stock and a profile; atlas: the whole mini atlas "
                        "and its figures")
    p.add_argument("--fig2-epochs", type=int, default=FIG2_EPOCHS,
                   help=f"measure: epochs of each Fig. 2 run (default {FIG2_EPOCHS}: ~25 s each with "
                        "four runs on an H200)")
    p.add_argument("--atlas-min", type=float, default=ATLAS_MIN,
                   help=f"atlas: minutes of atlas in this session (default {ATLAS_MIN:g}; the session "
                        "takes 2.5 minutes more), on top of what a resumed atlas has spent")
    p.add_argument("--resume-atlas", type=Path, default=None,
                   help="atlas: a kept atlas folder (OUT/atlas of an earlier session, its cells' small "
                        "files) to go on from: copied into WORK/atlas-runs first")
    p.add_argument("--atlas-launcher", default="worker",
                   help="atlas: how the atlas trains its cells (lnexp atlas --launcher; default worker)")
    p.add_argument("--tar", type=Path, default=None,
                   help="pack OUT into this tarball at the end (one file to bring back)")
    p.add_argument("--tiny", action="store_true", help="CPU: every part with a tiny model")
    p.add_argument("--dataset-dir", default=None, help="raw Multi30k-layout data (tests: a small corpus)")
    p.add_argument("--vocab-size", type=int, default=None)
    args = p.parse_args(argv)
    if args.wheels is not None and not (args.wheels / "wheelhouse.json").is_file():
        p.error(f"--wheels {args.wheels}: no wheelhouse.json there; build it with make wheelhouse WHEELS=...")
    if not args.tiny and (why := gpu_visible()) is not None:
        print(f"gpu_session: no GPU: {why}; run it on the GPU machine, or add --tiny for the CPU "
              "smoke run", file=sys.stderr)
        return 2
    # SIGTERM as Ctrl-C: the running part's process group is stopped (run_part), then the session
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    b = budgets(args.session, args.tiny, args.atlas_min)
    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1",
           "LNEXP_CACHE": os.environ.get("LNEXP_CACHE", str(work / "cache"))}
    log: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "session": args.session,
                 "tiny": args.tiny}
    t0 = time.time()
    py = install(args.wheels, out, work, env, log, b["install"]) if args.wheels else sys.executable
    if py != sys.executable:
        env.pop("PYTHONPATH", None)  # the installed lnexp's dependencies; scripts/ import the checkout
    data = ([f"--dataset-dir={args.dataset_dir}"] if args.dataset_dir else []) + (
        [f"--vocab-size={args.vocab_size}"] if args.vocab_size else [])
    data_over = ([f"dataset.dir={args.dataset_dir}"] if args.dataset_dir else []) + (
        [f"dataset.vocab_size={args.vocab_size}"] if args.vocab_size else [])
    if args.session == "atlas":
        rcs = atlas(py, args, out, work, env, log, data_over, b)
        return finish(rcs, log, out, t0, args.tar)
    rcs = [run_part("gpu_tests", [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                                  "tests/test_gpu.py", f"--junitxml={out / 'pytest_gpu.xml'}"],
                    out, b["gpu_tests"], env, log)]
    tiny = ["--tiny"] if args.tiny else []
    if args.session == "speed":
        rcs.append(run_part("speed", [py, "scripts/gpu_speed.py", *tiny, *data, "--out", str(out)],
                            out, b["speed"], env, log))
        return finish(rcs, log, out, t0, args.tar)
    rcs.append(run_part("precision", [py, "scripts/gpu_check.py", *tiny, *data, "--out", str(out)],
                        out, b["precision"], env, log))
    rcs.append(run_part("sharing", [py, "scripts/gpu_share.py", *tiny, *data, "--out", str(out),
                                    "--timeout", str(int(b["sharing"] // 3))],
                        out, b["sharing"], env, log))
    runs = work / "runs"
    sweep = [py, "-m", "lnexp.cli", "train", "-m", "experiment=fig2_gpu", "lr=0.001", "warmup=0,465",
             "seed=1" if args.tiny else "seed=1,2", f"max_epoch={args.fig2_epochs}", "eval.beam=1",
             f"runs_root={runs}", *data_over]
    sweep += [*TINY, "hydra.launcher.n_jobs=1"] if args.tiny else ["hydra.launcher.n_jobs=4"]
    rc = run_part("fig2", sweep, out, b["fig2"], env, log)
    for f in runs.glob("*/*"):  # a run's own files (its logs, status, config), not its folders
        if f.is_file():
            (out / "runs" / f.parent.name).mkdir(parents=True, exist_ok=True)
            (out / "runs" / f.parent.name / f.name).write_bytes(f.read_bytes())
    rc2 = run_part("fig2_figure", [py, "-m", "lnexp.cli", "figure", "fig2", "--scale", "gpu",
                                   "--runs-root", str(runs), "--out", str(out / "fig2")], out,
                   b["fig2_figure"], env, log)
    rcs += [0 if rc in (0, 1) else rc, rc2]  # a sweep exits 1 when a run diverged: a result here
    return finish(rcs, log, out, t0, args.tar)


def atlas(py: str, args: argparse.Namespace, out: Path, work: Path, env: dict[str, str], log: dict,
          data_over: list[str], b: dict[str, float]) -> list[int]:
    """The atlas session's parts: the whole mini atlas within its budget, then its figures; the
    small files of every cell (no checkpoints: atlas cells keep none) copied to OUT/atlas."""
    runs = work / "atlas-runs"
    if args.resume_atlas is not None:  # an earlier window's cells: finished ones are not run again
        import shutil

        shutil.copytree(args.resume_atlas, runs, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("figures"))
    # --tiny: a few tiny cells on CPU: the smallest budget lnexp atlas takes for them (its figures'
    # minute and one cell's first cost, 17 s at max_update=2: lnexp.atlas.resources); the cells'
    # CPU seconds grow with it, as measured cells fill what is left
    budget_min = atlas_budget(runs, TINY_ATLAS_MIN if args.tiny else args.atlas_min)
    cmd = [py, "-m", "lnexp.cli", "atlas", "--scale", "mini", "--runs-root", str(runs),
           "--budget-min", f"{budget_min:g}", "--launcher", args.atlas_launcher,
           *(["--jobs", "1"] if args.tiny else []), *data_over, *(TINY_ATLAS if args.tiny else [])]
    rc = run_part("atlas", cmd, out, b["atlas"], env, log)
    keep = (out / "atlas")
    keep.mkdir(exist_ok=True)
    # each cell's small files, enough for the figures and for a later window to resume from
    # (--resume-atlas): its overrides name its experiment, updates.csv its loss at init (the LR
    # sensitivity's cap); no checkpoints (atlas cells keep none)
    for f in (*runs.glob("atlas_*.json"), *runs.glob("*/status.json"), *runs.glob("*/run.json"),
              *runs.glob("*/metrics.jsonl"), *runs.glob("*/norms.csv"), *runs.glob("*/updates.csv"),
              *runs.glob("*/.hydra/overrides.yaml")):
        dest = keep / f.relative_to(runs)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
    rc2 = run_part("atlas_figure", [py, "-m", "lnexp.cli", "figure", "atlas", "--scale", "mini",
                                    "--runs-root", str(runs), "--out", str(keep / "figures")],
                   out, b["atlas_figure"], env, log)
    # the atlas stopped by the part's budget (124) or ended by its own (0) both leave a result
    return [0 if rc in (0, 124, 130) else rc, rc2]


def finish(rcs: list[int], log: dict, out: Path, t0: float, tar: Path | None) -> int:
    """session.json, and OUT packed into ``tar`` if asked."""
    log["total_s"] = round(time.time() - t0, 1)
    (out / "session.json").write_text(json.dumps(log, indent=1) + "\n")
    if tar is not None:
        import tarfile

        tar.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar, "w:gz") as t:
            t.add(out, arcname=out.name)
    print(f"gpu_session: done in {log['total_s']:.0f} s; results in {out}"
          + (f" (packed: {tar})" if tar else ""))
    return 0 if all(r == 0 for r in rcs) else 1


if __name__ == "__main__":
    sys.exit(main())
