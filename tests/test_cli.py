"""The command line as users type it: one-line mistakes, pipes, ``python -m lnexp``, a real package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO, lnexp_cmd, lnexp_main


@pytest.mark.parametrize("argv,needle", [
    (["train", "depth=0"], "depth=0 must be a whole number of layers >= 1"),
    (["train", "-m", "lr=interval(1e-4,1e-3)"], "write e.g. lr=1e-4,5e-4,1e-3"),
    (["train", "warmup=abc"], "e.g. warmup=4000"),
    (["train", "max_epoch=abc"], "e.g. max_epoch=2"),
    (["train", "placement=preln"], "use one of admin, b2t, b2t_noinit, deepnorm, "),
    (["train", "-m", "depth=6,0"], "depth=0 must be a whole number"),
    (["figure", "fig3", "--replot", "--out", "/nonexistent/figs"], "run `lnexp figure fig3`"),
    (["prepare", "nope"], "invalid choice: 'nope'"),
    (["results", "--bogus"], "unrecognized arguments: --bogus (lnexp results --help)"),
    (["nope"], "unknown command 'nope'"),
])
def test_mistakes_are_one_line_exit_2(tmp_path, argv, needle):
    """(In this process, lnexp_main: the same dispatch, exit status and streams as the installed
    command's; a fresh interpreter for each mistake added ~0.3 CPU s.)"""
    extra = [f"runs_root={tmp_path / 'runs'}"] if argv[0] == "train" else []
    proc = lnexp_main(*argv, *extra, cache=tmp_path / "c", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_depth_sweep_and_cfg_job_print_resolved_values(tmp_path):
    proc = lnexp_main("train", "--cfg", "job", "depth=12", "placement=pre_ln", "warmup=0",
                      cache=tmp_path / "c")  # in this process: what it prints, not its process
    assert "${" not in proc.stdout  # resolved, as README promises
    assert "encoder_layers: 12" in proc.stdout and "lr: 0.001" in proc.stdout
    assert "name: step" in proc.stdout  # Pre-LN's recipe
    proc = lnexp_main("train", "-m", "--cfg", "job", "depth=6,8", cache=tmp_path / "c", check=False)
    assert proc.returncode == 2 and "drop -m" in proc.stderr and "Traceback" not in proc.stderr


def test_help_into_a_closed_pipe_is_quiet():
    proc = subprocess.run(f"{sys.executable} -m lnexp --help | head -1", shell=True, cwd=REPO,
                          capture_output=True, text=True)
    assert proc.stdout.startswith("usage: lnexp")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_python_dash_m_lnexp():
    proc = subprocess.run([sys.executable, "-m", "lnexp", "--version"], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.startswith("lnexp ")


def test_results_unknown_status_is_one_line(tmp_path):
    (tmp_path / "runs").mkdir()
    proc = lnexp_cmd("results", "status=runing", "--runs-root", str(tmp_path / "runs"),
                     cache=tmp_path / "c", check=False)
    assert proc.returncode == 2 and "not one of done, stopped, plateau, diverged" in proc.stderr


@pytest.mark.slow
def test_wheel_ships_the_configs_and_runs_from_any_folder(tmp_path):
    """A plain (not editable) install: the wheel holds configs/ as package data."""
    src = tmp_path / "src"  # a copy: building in place would leave build/ in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    (src / "data").mkdir()
    shutil.copytree(REPO / "data" / "multi30k", src / "data" / "multi30k")
    for name in ("lnexp", "configs"):
        shutil.copytree(REPO / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    flags = ["--no-build-isolation"] if _has("setuptools") else []  # else pip fetches setuptools
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *flags, str(src), "-w",
                    str(tmp_path / "dist")], check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("lnexp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("lnexp/configs/") for n in names if n.startswith("lnexp/configs/")}
    in_repo = {str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").rglob("*.yaml")}
    assert shipped == in_repo
    corpus = {n.rsplit("/", 1)[1] for n in names if n.startswith("lnexp/data/multi30k_corpus/")}
    assert {p.name for p in (REPO / "data" / "multi30k").iterdir()} == corpus
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-m", "lnexp", "train", "--cfg", "job", "depth=7",
                           "experiment=fig4_mini"], cwd=elsewhere, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "encoder_layers: 7" in proc.stdout
    where = subprocess.run([sys.executable, "-c", "import lnexp; print(lnexp.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True).stdout
    assert where.startswith(str(site))


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_fairseq_starts_without_scikit_learn_and_a_deferred_module_runs_when_read():
    """lnexp's model imports fairseq without the two plugins that pull in scikit-learn (~1 s of
    every start); reading a name from one runs it, and it registers its criterion as fairseq would."""
    probe = ("import sys; import lnexp.model; "
             "from lnexp.fairseq_adapter import DEFERRED_FAIRSEQ_MODULES as D; "
             "from fairseq.criterions import CRITERION_REGISTRY as R; "
             "print(all(m in sys.modules for m in D), 'sklearn' in sys.modules, 'sentence_prediction' in R); "
             "import fairseq.criterions.sentence_prediction as sp; sp.SentencePredictionCriterion; "
             "print('sklearn' in sys.modules, R['sentence_prediction'] is sp.SentencePredictionCriterion)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False", "False", "True", "True"], proc.stdout
