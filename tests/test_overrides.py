"""Override strings are read one way, Hydra's (lnexp.overrides): every reader in lnexp takes ``+key=v``,
``++key=v``, ``~key``, quoted values and ``hydra.launcher.*`` keys as Hydra will, and no other module
looks inside an override by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lnexp import overrides as override
from lnexp.errors import ConfigError, UserError
from tests.conftest import REPO

# (override, the key it sets, the value it gives: None where it deletes)
FORMS = [
    ("device=cpu", "device", "cpu"),
    ("+device=cpu", "device", "cpu"),
    ("++device=cpu", "device", "cpu"),
    ("device='cpu'", "device", "cpu"),
    ('device="cpu"', "device", "cpu"),
    ("~device", "device", None),
    ("~device=cpu", "device", None),
]


@pytest.mark.parametrize("text,key,value", FORMS)
def test_the_module_reads_every_form_as_hydra_does(text, key, value):
    assert override.key(text) == key and override.value([text], key) == value
    assert override.value(["device=cuda", text], "device") == value  # the last one counts
    assert not override.is_hydra(text) and not override.is_launcher(text)


def test_hydra_keys_and_a_malformed_override():
    for text in ("hydra.launcher.partition=gpu", "+hydra.launcher.partition=gpu",
                 "++hydra.launcher.partition=gpu", "hydra.launcher.partition='gpu'",
                 "~hydra.launcher.partition", "hydra/launcher=submitit_slurm",
                 "+hydra/launcher=submitit_slurm"):
        assert override.is_hydra(text) and override.is_launcher(text), text
    assert override.launcher_key("++hydra.launcher.partition='gpu'") == "partition"
    assert override.is_hydra("hydra.run.dir=x") and not override.is_launcher("hydra.run.dir=x")
    assert override.key("group@pkg=option") == "group"
    with pytest.raises(ConfigError, match=r"syntax: key=value, group=option"):
        override.parse("lr=[1,")
    assert override.key("lr=[1,") == "lr"  # not an override: its own check names the mistake


@pytest.mark.parametrize("text,key,value", FORMS)
def test_the_atlas_reads_the_device_of_every_form(text, key, value):
    from lnexp.atlas.resources import machine

    _, gpus, found = machine([text])
    assert (found == "device=cpu given") == (value == "cpu") and (gpus == [] or value != "cpu")


@pytest.mark.parametrize("text,expected", [("max_update=5", 5), ("+max_update=5", 5), ("++max_update=5", 5),
                                           ("max_update='5'", 5), ("~max_update", 0)])
def test_the_atlas_reads_max_update_of_every_form(text, expected):
    from lnexp.atlas.driver import _max_update

    assert _max_update([text]) == expected


@pytest.mark.parametrize("text", ["warmup=3", "+warmup=3", "++seed=2", "~lr", "lr='0.1'",
                                  "+residual_scale=0.5"])
def test_the_atlas_refuses_every_form_of_a_key_it_sets_for_each_cell(text):
    from lnexp.atlas.driver import _check_cell_overrides
    from lnexp.atlas.grid import read_grid
    from lnexp.atlas.launchers import LaunchSetup

    says = f"{re.escape(text)}: lnexp atlas sets {override.key(text)} for each cell"
    with pytest.raises(UserError, match=says):
        _check_cell_overrides(LaunchSetup(Path("runs"), "mini", overrides=(text,)), "mini", read_grid("mini"))


@pytest.mark.parametrize("text", ["hydra.launcher.partition=gpu", "+hydra.launcher.partition=gpu",
                                  "++hydra.launcher.partition=gpu", "hydra.launcher.partition='gpu'"])
def test_a_clusters_setting_of_every_form_is_the_launchers_not_a_cells(text):
    from types import SimpleNamespace

    from lnexp.atlas.cluster import launcher_settings
    from lnexp.atlas.driver import _checked_setup

    args = SimpleNamespace(budget_min=None, shared_lr=None, jobs=None, runs_root="runs", scale="mini",
                           launcher="submitit_slurm", overrides=[text, "max_update=5"])
    setup = _checked_setup(args)
    assert setup.settings == (text,) and setup.overrides == ("max_update=5",)
    assert launcher_settings("slurm", setup.runs_root, setup.settings)[1]["slurm_partition"] == "gpu"
    deleted = (*setup.settings, "~hydra.launcher.partition")  # back to the launcher's default
    assert launcher_settings("slurm", setup.runs_root, deleted)[1]["slurm_partition"] is None
    args.launcher = "process"
    with pytest.raises(UserError, match="a cluster's setting; give it with --launcher submitit_slurm"):
        _checked_setup(args)


@pytest.mark.parametrize("text,named", [("hydra/launcher=submitit_local", "submitit_local"),
                                        ("+hydra/launcher=submitit_local", "submitit_local"),
                                        ("++hydra/launcher=submitit_local", "submitit_local"),
                                        ("hydra/launcher='submitit_local'", "submitit_local"),
                                        ("~hydra/launcher", None), ("hydra/launcher=joblib", None)])
def test_the_launcher_named_in_every_form(text, named):
    from lnexp.atlas.launchers import named_in

    assert named_in(["max_update=5", text]) == named


def test_lnexp_train_leaves_every_form_of_a_hydra_setting_to_hydra():
    from lnexp.train.run import _task_overrides

    argv = ["+hydra.run.dir=x", "++hydra.job.chdir=true", "~hydra.output_subdir", "hydra/launcher=basic",
            "--cfg", "job", "lr=1e-3", "+foo.bar=2", "++warmup=0", "~seed", "dataset.dir='a b'"]
    assert _task_overrides(argv) == ["lr=1e-3", "+foo.bar=2", "++warmup=0", "~seed", "dataset.dir='a b'"]


@pytest.mark.parametrize("text", ["experiment=atlas_mini", "+experiment=atlas_mini",
                                  "++experiment=atlas_mini", "experiment='atlas_mini'"])
def test_a_runs_experiment_is_read_from_every_form(text):
    from lnexp.results import Run

    assert Run(Path("x"), "x", {}, {}, [], ["lr=1e-3", text]).experiment == "atlas_mini"
    assert Run(Path("x"), "x", {}, {}, [], [text, "~experiment"]).experiment == ""


def test_a_sweeps_size_counts_every_form(tmp_path):
    from lnexp.runtime import progress

    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    params:\n      lr: 5.0e-4,1.0e-3\n  overrides:\n"
        "    task: ['+seed=1,2,3', \"++warmup='0','40'\", 'max_update=5']\n")
    assert progress.sweep_size(tmp_path / "multirun.yaml") == 12


def test_the_run_name_reads_every_form_of_a_length_key():
    """A linear schedule's length names the run, whichever way the length was given."""
    from lnexp.run_names import legacy_name

    cfg = {"schedule": {"name": "linear"}, "max_epoch": 3, "max_update": 0}
    for given in ("max_epoch=9", "+max_epoch=9", "++max_epoch=9", "max_epoch='9'"):
        assert legacy_name(f"lr=0.001,{given}", cfg) == "lr=0.001,max_epoch=3"


def test_no_other_module_reads_an_override_by_hand():
    """Outside lnexp/overrides.py no module splits an override on '=', strips its '+'/'~' or makes
    its own parser (lnexp results' filters, KEY=VALUE, are not overrides: parse_filters)."""
    import ast

    pattern = re.compile(r"""split\(["']=["']|partition\(["']=["']|lstrip\(["'][+~]|OverridesParser"""
                         r"""|startswith\(\(?["'][+~]|removeprefix\(["'][+~]|\.startswith\(["'][\w./]+=["']\)""")
    hits = []
    for path in sorted((REPO / "lnexp").rglob("*.py")):
        if path == REPO / "lnexp" / "overrides.py":
            continue
        text = path.read_text()
        filters = [range(f.lineno, f.end_lineno + 1) for f in ast.walk(ast.parse(text))
                   if isinstance(f, ast.FunctionDef) and f.name == "parse_filters"]
        for n, line in enumerate(text.splitlines(), 1):
            if pattern.search(line) and not any(n in r for r in filters):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert hits == [], hits
