"""The offline install: `scripts/wheelhouse.py` (make wheelhouse) builds wheels for the running
Python, and a fresh venv that already has torch installs lnexp from them with no index and trains.

The fresh venv gets torch the way a GPU node has its own: a .pth pointing at a folder of links to
torch, torchaudio and their own dependencies in this environment (nothing else of it), so pip sees
them installed and must find everything else in the wheelhouse. The wheelhouse folder persists in
the user's cache (~/.cache/lnexp): a rerun re-reads the environment and fetches only what changed
(the first run downloads ~130 MiB through pip's cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO

pytestmark = pytest.mark.slow
sys.path.insert(0, str(REPO / "scripts"))

import wheelhouse as W  # noqa: E402


def torch_only_env(root: Path) -> Path:
    """A folder of links to the installed torch family and its dependencies (packages + dist-info)."""
    env = W.target_env(f"{sys.version_info.major}.{sys.version_info.minor}", "manylinux_2_28_x86_64")
    found, _ = W.walk([Requirement(n) for n in W.LEFT_TO_TARGET], env, set())
    root.mkdir()
    for name in found:
        dist = metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            src = Path(str(dist.locate_file(top)))
            if top in ("..", "bin", "__pycache__", "_distutils_hack") or top.endswith(".pth"):
                continue
            if src.exists() and not (root / top).exists():
                (root / top).symlink_to(src)
    return root


def test_wheelhouse_installs_offline_beside_an_existing_torch_and_trains(tmp_path, small_multi30k):
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    wheels = cache / "lnexp" / f"test-wheelhouse-py{py}"
    assert W.main(["--out", str(wheels), "--python-version", py, "--extras", ""]) == 0
    manifest = json.loads((wheels / "wheelhouse.json").read_text())
    names = {w.split("-")[0].lower() for w in manifest["wheels"]}
    assert {"lnexp", "ve_fairseq", "hydra_core", "antlr4_python3_runtime", "sentencepiece"} <= names
    # left to the target, with what only torch needs
    assert not names & {"torch", "torchaudio", "triton", "sympy"}

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "torch_env.pth").write_text(f"{torch_only_env(tmp_path / 'torch_env')}\n")
    # --isolated: no pip configuration or PIP_* variable may add an index or a local wheel folder;
    # no PYTHONPATH: nothing of the checkout may count as installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--isolated", "-q", "--no-compile", "--no-index", "--find-links", str(wheels),
                           "lnexp"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert "lnexp" in installed and "torch" not in installed and not (site / "torch").exists()

    env.update(LNEXP_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([str(venv / "bin" / "lnexp"), "train", "max_update=2", "threads=1",
                           f"dataset.dir={small_multi30k}", "dataset.vocab_size=600",
                           "depth.encoder_layers=2", "depth.decoder_layers=2", "scale.max_tokens=512",
                           "eval.subset=4", f"runs_root={tmp_path / 'runs'}"],
                          capture_output=True, text=True, env=env, cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    status = json.loads(next((tmp_path / "runs").glob("*/status.json")).read_text())
    assert status["status"] == "stopped" and status["updates"] == 2
