"""Composing the training config: every axis as typed, the paper's recipe per placement, run names."""

from __future__ import annotations

import json

import pytest

from lnexp import config
from lnexp.errors import ConfigError


@pytest.mark.parametrize("n", [1, 7, 12, 30])
def test_depth_any_n_sets_both_stacks(n):
    cfg = config.compose([f"depth={n}"])
    assert (cfg.depth.encoder_layers, cfg.depth.decoder_layers) == (n, n)


def test_depth_unequal_stacks_and_quoted_form():
    cfg = config.compose(["depth.encoder_layers=3", "depth.decoder_layers=5"])
    assert (cfg.depth.encoder_layers, cfg.depth.decoder_layers) == (3, 5)
    assert config.compose(["depth='12'"]).depth.encoder_layers == 12


@pytest.mark.parametrize("override,needle", [
    ("depth=0", "depth=0 must be a whole number of layers >= 1"),
    ("depth=2.5", "depth=2.5 must be a whole number of layers >= 1"),
    ("depth.encoder_layers=0", "depth.encoder_layers=0 must be a whole number of layers >= 1"),
    ("placement=preln", "placement=preln is not an option of the placement group: use one of "
                        "admin, b2t, b2t_noinit, deepnorm, "),
    ("warmup=abc", "warmup='abc' is not a whole number: e.g. warmup=4000"),
    ("max_epoch=abc", "max_epoch='abc' is not a whole number: e.g. max_epoch=2"),
    ("lr=abc", "lr='abc' is not a number: e.g. lr=5e-4"),
    ("lr=interval(1e-4,1e-3)", "the basic sweeper takes lists and ranges, not interval sweeps"),
    ("log_interval=0", "log_interval=0 must be a whole number of updates >= 1"),
    ("eval.beam=0", "eval.beam=0 must be a whole number >= 1"),
])
def test_mistakes_name_the_fix(override, needle):
    with pytest.raises(ConfigError) as e:
        config.compose([override])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_numeric_group_sweeps_are_quoted_and_registered():
    assert config.normalise(["depth=6,8", "depth=range(2,5)", "lr=1e-3,2e-3", "placement=pre_ln"]) == [
        "depth='6','8'", "depth='2','3','4'", "lr=1e-3,2e-3", "placement=pre_ln"]
    assert config.compose(["depth=3"]).depth.decoder_layers == 3  # registered, no yaml file


@pytest.mark.parametrize("placement,schedule,warmup", [
    ("post_ln", "inverse_sqrt", 100), ("deepnorm", "inverse_sqrt", 100),
    ("pre_ln", "step", 0), ("peri_ln", "step", 0)])
def test_default_schedule_is_the_papers_recipe_for_the_placement(placement, schedule, warmup):
    cfg = config.compose([f"placement={placement}"])
    assert (cfg.schedule.name, cfg.warmup) == (schedule, warmup)
    assert "recipe" in cfg.schedule.why
    if schedule == "step":
        assert list(cfg.schedule.epochs) == [8] and cfg.schedule.gamma == 0.1


def test_explicit_schedule_always_wins():
    cfg = config.compose(["placement=pre_ln", "schedule=inverse_sqrt", "warmup=0"])
    assert (cfg.schedule.name, cfg.warmup) == ("inverse_sqrt", 0)  # Fig. 2's T_warmup = 1
    cfg = config.compose(["placement=pre_ln", "schedule=inverse_sqrt"])
    assert cfg.warmup == 100  # an explicit schedule takes the scale's warm-up
    cfg = config.compose(["placement=pre_ln", "warmup=50"])
    assert (cfg.schedule.name, cfg.warmup) == ("step", 50)


def test_paper_scale_decay_epoch_follows_the_dataset():
    iwslt = config.compose(["placement=pre_ln", "scale=paper", "dataset=iwslt14_de_en"], check=False)
    wmt = config.compose(["placement=pre_ln", "scale=paper", "dataset=wmt14_en_de"], check=False)
    assert list(iwslt.schedule.epochs) == [8] and list(wmt.schedule.epochs) == [6]
    assert iwslt.warmup == 0 and iwslt.lr == 5e-4


def test_one_configuration_one_folder():
    """The folder name comes from the resolved config: overrides that change nothing are left out
    (in the context of the others), numbers are written one way."""
    from lnexp import run_names

    with run_names.composing() as compose_raw:
        def name(*overrides: str) -> str:
            return run_names.name_and_config(list(overrides), compose_raw)[0]

        six = [(), ("placement=post_ln",), ("seed=1",), ("lr=0.001",), ("lr=1e-3",), ("schedule=auto",)]
        assert {name(*o) for o in six} == {"default"}
        # `-m placement=post_ln,pre_ln seed=1,2`: its first job is the demo's run, runs/default
        assert [name(f"placement={p}", f"seed={s}") for p in ("post_ln", "pre_ln") for s in (1, 2)] == [
            "default", "seed=2", "placement=pre_ln", "placement=pre_ln,seed=2"]
        assert name("placement=pre_ln", "warmup=0") == "placement=pre_ln"  # Pre-LN's recipe: no warm-up
        assert name("lr=5e-4") == name("lr=0.0005") == "lr=0.0005"
        assert name("scale=paper", "lr=1e-3") == "lr=0.001,scale=paper"  # the paper scale's lr is 5e-4
        assert name("schedule=linear", "max_epoch=3") == "max_epoch=3,schedule=linear"  # length trained
    assert [run_names.number(x) for x in (1e-3, 5e-4, 1e-05, 2.0, 4000, 0.1)] == [
        "0.001", "0.0005", "1e-5", "2", "4000", "0.1"]


def test_a_run_under_its_old_folder_name_stays_there(tmp_path, capsys):
    from lnexp import run_names

    args = (["lr=1e-3", "seed=1", "threads=1"], ["threads"], str(tmp_path))
    assert run_names.run_name(*args, typed_name="lr=1e-3,seed=1") == "default"
    (tmp_path / "lr=1e-3,seed=1").mkdir()  # what lnexp named it before
    assert run_names.run_name(*args, typed_name="lr=1e-3,seed=1") == "lr=1e-3,seed=1"
    assert "its folder's old name; it stays there (today's name: default)" in capsys.readouterr().err
    (tmp_path / "default").mkdir()  # today's folder exists: it wins
    assert run_names.run_name(*args, typed_name="lr=1e-3,seed=1") == "default"
    # typed another way before: found by the configuration its run.json holds
    with run_names.composing() as compose_raw:
        resolved = run_names.name_and_config(["seed=2", "max_epoch=3"], compose_raw)[1]
    (tmp_path / "lr=0.001,seed=2").mkdir()
    (tmp_path / "lr=0.001,seed=2" / "run.json").write_text(json.dumps({"config": resolved}))
    assert run_names.run_name(["seed=2", "lr=1e-3"], ["max_epoch"], str(tmp_path),
                              typed_name="lr=1e-3,seed=2") == "lr=0.001,seed=2"
    assert run_names.run_name(["seed=3"], ["max_epoch"], str(tmp_path), typed_name="seed=3") == "seed=3"


def test_a_name_too_long_for_a_folder_is_cut_with_a_hash_and_says_so(tmp_path, capsys):
    from lnexp import run_names

    long = ["+note=" + "x" * 300, "seed=7"]
    name = run_names.run_name(long, ["max_epoch"], str(tmp_path), typed_name=",".join(long))
    assert len(name.encode()) == run_names.NAME_MAX and name.startswith("+note=xxx")
    (tmp_path / name).mkdir()  # the file system takes it (the full name raised ENAMETOOLONG)
    assert run_names.run_name(long, ["max_epoch"], str(tmp_path)) == name  # one folder per config
    other = run_names.run_name(["+note=" + "x" * 300, "seed=8"], ["max_epoch"], str(tmp_path))
    assert other != name and other[:-12] == name[:-12]  # the hash tells configs apart
    assert "over the 255 a folder name may have" in capsys.readouterr().err
    assert run_names.name_of(["seed=7"]) == "seed=7"  # short names are as before


def test_train_help_shows_each_keys_comment_and_the_allowed_values(capsys):
    from lnexp.names import NORMS, PRECISIONS
    from lnexp.train.run import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    yaml = (config.CONFIG_DIR / "train.yaml").read_text().split("\nhydra:")[0]
    commented = [ln for ln in yaml.splitlines() if " # " in ln  # the defaults list is the groups above
                 and not ln.lstrip().startswith(("-", "#", "defaults:"))]
    assert len(commented) > 20 and all(f"  {ln}" in out.splitlines() for ln in commented)
    allowed = next(ln for ln in out.splitlines() if ln.startswith("Allowed values: "))
    assert all(v in allowed for v in (*NORMS, *PRECISIONS, "auto | cpu | cuda"))
    assert "6* 8 10 12 14 18 24 (any depth=N (N >= 1) works" in out  # not only these files
    assert "post_ln*" in out and "multi30k*" in out and "    fig2_mini " in out
