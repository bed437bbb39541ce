"""Every launchable experiment config: each sweep value composes and validates, and one job of each
trains 2 updates on a tiny corpus at its own architecture (paper-size models included), so that no
GPU hour is spent on a config that crashes at start."""

from __future__ import annotations

import json
import shutil

import pytest
from omegaconf import OmegaConf

from lnexp import config
from lnexp.errors import ConfigError

EXPERIMENTS = sorted(p.stem for p in (config.CONFIG_DIR / "experiment").glob("*.yaml"))


def sweep_params(name: str) -> dict[str, list[str]]:
    """The experiment's hydra.sweeper.params, each as its list of values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    raw = OmegaConf.load(config.CONFIG_DIR / "experiment" / f"{name}.yaml")
    params = OmegaConf.select(raw, "hydra.sweeper.params") or {}
    out = {}
    for key, value in params.items():
        o = OverridesParser.create().parse_override(f"{key}={value}")
        out[key] = list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(value)]
    return out


def parent(name: str) -> str | None:
    """The experiment this one's defaults list builds on, if any."""
    raw = OmegaConf.load(config.CONFIG_DIR / "experiment" / f"{name}.yaml")
    return next((d for d in raw.get("defaults", []) if isinstance(d, str) and d in EXPERIMENTS), None)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_sweep_value_composes_and_validates(name):
    """Every value of every swept key composes and validates, each in a job of the sweep (a value of
    every key, as the sweeper composes them): the jobs lnexp train's own check composes."""
    from lnexp.train.run import covering_jobs

    params = sweep_params(name)
    assert params, f"{name} sweeps nothing"
    with config.composer() as compose:
        for job in covering_jobs([[f"{key}={v}" for v in values] for key, values in params.items()]):
            try:
                config.validate(compose([f"experiment={name}", *job]))
            except ConfigError as e:
                pytest.fail(f"{name} {' '.join(job)}: {e}")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_group_sweeps_are_strings_as_hydras_sweeper_needs(name):
    """Hydra's basic sweeper passes a swept value on as it parses it, and a config group (depth=6)
    takes only strings: an unquoted number stops `lnexp train -m experiment=NAME` before any run.
    A parent experiment's sweep is merged in, so its groups count too."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import QuotedString

    chain, params = [name], {}
    while (up := parent(chain[-1])) is not None:  # Hydra merges a parent experiment's sweep in
        chain.append(up)
    for exp in reversed(chain):
        raw = OmegaConf.load(config.CONFIG_DIR / "experiment" / f"{exp}.yaml")
        params.update(OmegaConf.select(raw, "hydra.sweeper.params") or {})
    groups = {p.name for p in config.CONFIG_DIR.iterdir() if p.is_dir()}
    for key, value in params.items():
        if key not in groups:
            continue
        o = OverridesParser.create().parse_override(f"{key}={value}")
        parsed = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        assert all(isinstance(v, str | QuotedString) for v in parsed), (
            f"{name}: hydra.sweeper.params.{key}: {value!r} parses to {parsed}: quote group names "
            f"(e.g. {key}: \"'6','18'\")")
    if name.startswith("atlas_dt_"):  # the dt column: 6 layers, though its parent also sweeps 18
        assert str(params.get("depth")).strip("'\"") == "6", params.get("depth")


@pytest.fixture
def short_valid_multi30k(tmp_path, small_multi30k):
    """small_multi30k with 8 validation pairs: the per-epoch validation loss at paper size costs
    what the two updates do per 8 pairs, and whether it runs does not depend on how many."""
    import gzip

    raw = tmp_path / "multi30k_short_valid"
    raw.mkdir()
    for f in small_multi30k.iterdir():
        if f.name.startswith("val."):
            with gzip.open(f, "rt", encoding="utf-8") as src:
                lines = [next(src) for _ in range(8)]
            with gzip.open(raw / f.name, "wt", encoding="utf-8") as dst:
                dst.writelines(lines)
        else:
            shutil.copy(f, raw / f.name)
    return raw


def test_every_experiment_trains_two_updates_at_its_architecture(tmp_path, short_valid_multi30k,
                                                                 monkeypatch):
    """In one process (the imports are paid once): the first job of each experiment's sweep, one
    experiment per scale, architecture and optimizer (the others differ from it in placement,
    schedule and sweep values, which the test above composes and validates, and which the model
    and schedule tests train). An experiment built on another (fig2_low_lr_*, atlas_dt_*: its
    defaults name it) changes only sweep values: its parent stands for it."""
    from lnexp.train.loop import train_run

    monkeypatch.setenv("LNEXP_CACHE", str(tmp_path / "cache"))
    trained, kinds = {}, set()
    for name in [e for e in EXPERIMENTS if not parent(e)]:
        first = [f"{k}={v[0]}" for k, v in sweep_params(name).items()]
        composed = config.compose([f"experiment={name}", *first])
        arch, kind = composed.scale.arch, (composed.scale.name, composed.scale.arch,
                                           composed.optimizer.name)
        if kind in kinds:
            continue
        kinds.add(kind)
        cfg = config.compose([
            f"experiment={name}", *first, "dataset=multi30k", f"dataset.dir={short_valid_multi30k}",
            "dataset.vocab_size=600", f"scale.arch={arch}", "scale.max_tokens=128",  # > the longest pair (81)
            "scale.update_freq=1", "max_update=2", "eval.subset=1", "eval.beam=2",
            "divergence.plateau_epoch=99"])  # 2 updates are on the plateau by design; the end of
        # the epoch's BLEU (beam search at the architecture) is a path here: one sentence
        status = train_run(cfg, tmp_path / "runs" / name)
        assert status["status"] == "stopped" and status["updates"] == 2, (name, status)
        run = json.loads((tmp_path / "runs" / name / "run.json").read_text())
        trained[name] = run["fairseq_flags"]["arch"]
        assert trained[name] == arch
        ckpts = tmp_path / "runs" / name / "checkpoints"
        if composed.checkpoint.at_end == "delete":  # the atlas's cells keep none once ended
            assert not ckpts.exists(), name
            assert json.loads((ckpts.parent / "status.json").read_text())["checkpoints_deleted"], name
            continue
        assert (ckpts / "checkpoint_last.pt").is_file(), name
        shutil.rmtree(ckpts)  # a paper-size run's checkpoints take up to 1 GB: one at a time on disk
    assert {"ln_transformer_mini", "ln_transformer_iwslt_de_en", "ln_transformer_wmt_en_de"} <= set(
        trained.values())
