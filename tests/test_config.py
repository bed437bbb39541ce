"""Composing the training config: every axis as typed, the paper's recipe per placement, run names."""

from __future__ import annotations

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
                        "b2t, deepnorm, hybridnorm, "),
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


def test_run_name_leaves_out_length_and_reporting_but_not_for_linear():
    assert config.run_name("placement=pre_ln,warmup=0", "step", 2, 0) == "placement=pre_ln,warmup=0"
    assert config.run_name("", "inverse_sqrt", 4, 0) == "default"
    assert config.run_name("depth='12'", "step", 2, 0) == "depth=12"
    assert config.run_name("schedule=linear", "linear", 4, 0) == "max_epoch=4,schedule=linear"
    assert config.run_name("max_epoch=3,schedule=linear", "linear", 3, 10) == \
        "max_epoch=3,max_update=10,schedule=linear"
    assert config.run_name("dataset.dir=/a/b", "step", 2, 0) == "dataset.dir=_a_b"
