"""README.md and docs/ as a user reads them: every `lnexp` command in a code block runs as written,
and every link between the pages leads somewhere.

Training commands are checked with ``--cfg job`` (one run) or by composing every swept value (``-m``);
the others run for real in an empty folder and must end well: exit 0, or exit 2 with one line that
names the fix (a run folder or an archive the reader does not have yet), never a traceback. A run
folder that a command reads (``lnexp evaluate runs/X``, also in the prose) must be one that a
training command of these pages (or ``make demo``) writes: no folder runs as written otherwise.
"""

from __future__ import annotations

import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, lnexp_main

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def commands(page: Path) -> list[str]:
    """The `lnexp ...` commands of a page's fenced code blocks (comments dropped, continued lines
    joined)."""
    out, fenced, pending = [], False, ""
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        text = pending + line.split(" #", 1)[0].strip()
        pending = ""
        if text.endswith("\\"):  # a command continued on the next line
            pending = text[:-1] + " "
        elif fenced and text.startswith("lnexp "):
            out.append(text)
    return out


ALL = [(p.relative_to(REPO).as_posix(), c) for p in PAGES for c in commands(p)]
FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
INLINE = re.compile(r"`(lnexp [^`]+)`")


def inline_commands(page: Path) -> list[str]:
    """The `lnexp ...` code spans of a page's prose (one may run over a line break)."""
    prose = FENCE.sub("", page.read_text())
    return [" ".join(c.split()) for c in INLINE.findall(prose)]


PROSE = [(p.relative_to(REPO).as_posix(), c) for p in PAGES for c in inline_commands(p)]
MAKE = [ln.strip().replace("$(LNEXP)", "lnexp") for ln in (REPO / "Makefile").read_text().splitlines()
        if ln.strip().startswith("$(LNEXP) train ")]


def test_the_pages_show_commands():
    assert len([c for page, c in ALL if page == "README.md"]) >= 5


@pytest.mark.parametrize("page,line", ALL, ids=[f"{p}: {c}" for p, c in ALL])
def test_command_runs_as_written(page, line, tmp_path, monkeypatch):
    argv = shlex.split(line)[1:]
    if "..." in argv:
        pytest.fail(f"{page}: `{line}` has a placeholder; show a command that runs")
    if argv[0] == "train" and not ({"--help", "-h", "--cfg", "-c"} & set(argv)):
        if "-m" in argv or "--multirun" in argv:
            from lnexp.errors import UserError
            from lnexp.train.run import check_overrides

            try:  # every swept value composes; data the reader must prepare first is named
                check_overrides([a for a in argv[1:] if a not in ("-m", "--multirun")])
            except UserError as e:
                assert "\n" not in str(e) and "lnexp prepare" in str(e), str(e)
            return
        argv = ["train", "--cfg", "job", *argv[1:]]
    # in this process (lnexp_main: the CLI's dispatch, exit status and streams), in an empty folder
    # with nothing on stdin: a fresh interpreter cost each command 0.1-0.4 CPU s (a training
    # command's config check imports torch: 2-3 s)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO())
    proc = lnexp_main(*argv, cache=REPO / "cache", check=False)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-2000:]
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    else:
        assert proc.returncode == 0, out[-2000:]


def training_commands() -> list[tuple[str, list[str]]]:
    """(runs root, overrides that name the run) of the single-run `lnexp train` commands of the
    pages and the Makefile, fewest overrides first."""
    from omegaconf import OmegaConf

    from lnexp import config
    from lnexp.train.run import _task_overrides

    hydra = OmegaConf.load(config.CONFIG_DIR / "train.yaml").hydra
    exclude = set(hydra.job.config.override_dirname.exclude_keys)
    out = []
    for line in [c for _, c in ALL + PROSE] + MAKE:
        argv = shlex.split(line)[1:]
        if argv[0] != "train" or {"-m", "--multirun", "--help", "-h"} & set(argv) or any(
                mark in line for mark in ("[", "...", "<")):  # sweeps, help, placeholders
            continue
        overrides = _task_overrides(argv[1:])
        root = next((o.split("=", 1)[1] for o in overrides if o.startswith("runs_root=")), "runs")
        out.append((root, [o for o in overrides if o.split("=", 1)[0] not in exclude]))
    return sorted(out, key=lambda c: len(c[1]))


def test_run_folders_that_commands_read_are_ones_the_pages_train():
    """A folder is written by a command whose overrides name at least its keys (a name only
    leaves overrides out) and whose run is named so (lnexp/run_names.py)."""
    from lnexp import run_names

    commands, wrong = training_commands(), []
    with run_names.composing() as compose_raw:
        def trained(folder: str) -> bool:
            root, _, name = folder.rpartition("/")
            keys = {i.split("=", 1)[0] for i in name.split(",")} - {"default", "max_epoch", "max_update"}
            return any(r == root and keys <= {o.split("=", 1)[0] for o in overrides}
                       and run_names.name_and_config(overrides, compose_raw)[0] == name
                       for r, overrides in commands)

        assert trained("runs/default") and trained("runs/placement=pre_ln")
        for page, line in ALL + PROSE:
            argv = shlex.split(line)[1:]
            if argv[0] not in ("evaluate", "translate", "plot"):
                continue
            for arg in argv[1:]:
                if arg.startswith("runs/") and arg.rstrip("/") != "runs" and not trained(arg.rstrip("/")):
                    wrong.append(f"{page}: `{line}` reads {arg}, which no training command here writes")
    assert not wrong, "\n".join(wrong)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_links_lead_somewhere(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target} leads nowhere"
        if anchor and dest.suffix == ".md":
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
            assert anchor in slugs, f"{page.name}: no heading #{anchor} in {dest.name}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")
