"""A scheme is data: configs/placement/NAME.yaml states only what differs from _base.yaml, plus how
it is shown (``about``), and everything that lists schemes (figures, the docs table, the atlas) reads
them from there, so a scheme added as a YAML needs no Python change."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lnexp import scheme_table
from lnexp.names import CONFIG_DIR, PLACEMENTS, option_files
from lnexp.scheme import Placement, group_file
from tests.conftest import REPO

BASE = CONFIG_DIR / "placement" / "_base.yaml"


def _flat(node: dict, prefix: str = "") -> dict[str, object]:
    """Dotted keys of the mappings the base defines (init, recipe, about), others as values."""
    out: dict[str, object] = {}
    for k, v in node.items():
        if isinstance(v, dict) and k in ("init", "recipe", "about"):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def repeated_defaults(path: Path) -> list[str]:
    """The keys of a scheme's own file whose value is _base.yaml's: each should go."""
    base = _flat(OmegaConf.to_container(OmegaConf.load(BASE), resolve=False))
    own = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    own.pop("defaults", None)
    return sorted(k for k, v in _flat(own).items() if k in base and base[k] == v)


@pytest.mark.parametrize("name", PLACEMENTS)
def test_a_scheme_states_only_what_differs_from_the_base(name):
    path = CONFIG_DIR / "placement" / f"{name}.yaml"
    assert repeated_defaults(path) == [], (
        f"{path.relative_to(REPO)} repeats _base.yaml's value of {repeated_defaults(path)}: "
        "delete those lines")
    assert OmegaConf.load(path).defaults == ["_base", "_self_"]


def test_the_check_names_a_repeated_default(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("defaults: [_base, _self_]\nname: x\nsum_norm: true\n"
                    "init:\n  gain: 1.0\n  draw: xavier_normal\n")
    assert repeated_defaults(path) == ["init.gain", "sum_norm"]


@pytest.mark.parametrize("name", PLACEMENTS)
def test_every_scheme_fills_what_the_base_leaves_open(name):
    node = group_file("placement", name)
    assert node.name == name
    missing = [k for k, v in _flat(OmegaConf.to_container(node, resolve=False)).items() if v == "???"]
    assert missing == [], f"configs/placement/{name}.yaml: set {missing}"


def test_the_base_is_the_network_a_run_without_the_key_had():
    """_base.yaml's values are lnexp.scheme.Placement's defaults: a run.json written before a key
    existed rebuilds the network it trained, and a YAML that leaves the key out builds the same."""
    base = OmegaConf.load(BASE)
    base.name = "x"
    assert Placement.from_config(base) == Placement(name="x")


def test_the_base_is_no_option():
    assert "_base" not in PLACEMENTS
    assert "_base.yaml" not in [p.name for p in option_files("placement")]
    with pytest.raises(ValueError, match="placement=_base is not one of admin, b2t, "):
        group_file("placement", "_base")


def test_the_docs_table_is_the_yamls():
    page = REPO / "docs" / "configuration.md"
    text = page.read_text(encoding="utf-8")
    assert scheme_table.rewrite(text) == text, (
        "docs/configuration.md's scheme table differs from configs/placement/*.yaml: run "
        "python -m lnexp.scheme_table docs/configuration.md")
    assert all(f"| `{p}` |" in text for p in PLACEMENTS)


def test_a_scheme_added_as_a_yaml_is_shown_everywhere_with_no_python_change(tmp_path):
    """A copy of the package with one more YAML: its label and colour reach the figures' style, its
    row the docs table, and the atlas trains it."""
    shutil.copytree(REPO / "lnexp", tmp_path / "lnexp", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    (tmp_path / "configs" / "placement" / "zz_new.yaml").write_text(
        "# A new scheme, as a user adds one.\n"
        "defaults: [_base, _self_]    # _base.yaml explains every key\n"
        "name: zz_new\n"
        "about:\n"
        "  label: Newcomer\n"
        "  color: \"#123456\"\n"
        "  paper: Someone 2026\n"
        "  block: x ← x + F(LN(x))\n"
        "input_norm: true\n"
        "sum_norm: false\n"
        "recipe:\n"
        "  why: a test's\n")
    probe = (
        "from lnexp.figures import style; from lnexp import scheme_table; "
        "from lnexp.atlas.schemes import schemes; "
        "print(style.LABELS['zz_new'], style.COLORS['zz_new']); "
        "print([r for r in scheme_table.table().splitlines() if 'zz_new' in r][0]); "
        "print([s.placement for s in schemes()].count('zz_new'))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    label, row, atlas = out.stdout.splitlines()
    assert label == "Newcomer #123456"
    assert row == ("| `zz_new` | x ← x + F(LN(x)) | fairseq's | Someone 2026 | its formula "
                   "(`tests/test_zoo.py`) | Post-LN's |")
    assert atlas == "1"
