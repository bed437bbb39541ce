"""The config files explain themselves: every key carries a one-line comment on its own line (what
it does, its unit), once (a scheme's keys are explained in placement/_base.yaml, which it starts
from), and the pointers into docs/ lead to a heading that exists.

The comment sits on the key's line because that is what `lnexp train --help` shows (it prints
configs/train.yaml as written) and what a reader sees next to the value. Experiment YAMLs keep a
header of at most 3 lines; their rationale, timings and calibration numbers live in docs/, which
drift less than copies.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lnexp.config import CONFIG_DIR
from tests.conftest import REPO

FILES = sorted(CONFIG_DIR.rglob("*.yaml"))
COMMENT = re.compile(r"\s#\s")  # a YAML comment: whitespace, then #
POINTER = re.compile(r"(docs/[\w-]+\.md) \"([^\"]+)\"")
HEADER_MAX = 3


def keys_and_lines(path: Path) -> dict[str, int]:
    """Dotted name -> 0-based line of every key of a YAML file (the defaults list's entries are
    Hydra directives, not keys)."""
    out: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            out[prefix + str(key.value)] = key.start_mark.line
            walk(value, prefix + str(key.value) + ".")

    walk(yaml.compose(path.read_text(encoding="utf-8")), "")
    return out


def uncommented_keys(path: Path) -> list[str]:
    """Dotted names of the keys whose line has no comment. A file whose defaults list starts from a
    ``_`` file of its group (placement/_base.yaml) has its keys explained there, once."""
    lines = path.read_text(encoding="utf-8").splitlines()
    shared = {}
    for base in sorted(path.parent.glob("_*.yaml")):
        if base != path and re.search(rf"^defaults:.*\b{base.stem}\b", "\n".join(lines), re.M):
            shared |= keys_and_lines(base)
    explained = lambda name: any(name == k or name.startswith(k + ".") for k in shared)  # noqa: E731
    return [f"{name} (line {line + 1})" for name, line in keys_and_lines(path).items()
            if not explained(name) and not COMMENT.search(lines[line])]


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(CONFIG_DIR).as_posix() for p in FILES])
def test_every_key_has_a_comment_on_its_line(path):
    missing = uncommented_keys(path)
    assert not missing, (f"{path.relative_to(REPO)}: give these keys a one-line comment on their line "
                         f"(what it does, its unit): {', '.join(missing)}")


def test_experiment_headers_are_short_and_point_into_docs():
    long, pointless = [], []
    for path in sorted((CONFIG_DIR / "experiment").glob("*.yaml")):
        lines = path.read_text(encoding="utf-8").splitlines()
        header = [ln for ln in lines[:next(i for i, ln in enumerate(lines) if not ln.startswith("#"))]
                  if not ln.startswith("# @package")]
        if len(header) > HEADER_MAX:
            long.append(f"{path.name} ({len(header)} lines)")
        if not any(POINTER.search(ln) or "docs/" in ln for ln in header):
            pointless.append(path.name)
    assert not long, f"headers over {HEADER_MAX} lines (the why belongs in docs/): {', '.join(long)}"
    assert not pointless, f"headers without a pointer into docs/: {', '.join(pointless)}"


def _headings(page: Path) -> set[str]:
    return set(re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M))


def test_docs_pointers_name_a_heading_that_exists():
    wrong = []
    for path in FILES:
        for page, heading in POINTER.findall(path.read_text(encoding="utf-8")):
            if not (REPO / page).is_file() or heading not in _headings(REPO / page):
                wrong.append(f"{path.relative_to(REPO)}: {page} \"{heading}\"")
    assert not wrong, "pointers to no heading: " + "; ".join(wrong)
