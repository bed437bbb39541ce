"""Hydra config -> fairseq flags: the paper's settings arrive where fairseq reads them."""

from __future__ import annotations

import pytest

from lnexp.config import compose as _compose
from lnexp.config import validate


def compose(*overrides: str):
    return _compose(list(overrides), check=False)


def fairseq_flags(cfg, device: str) -> dict:
    """The fairseq-train flags a config resolves to on ``device`` (settings.resolve)."""
    from lnexp.train.settings import resolve

    return resolve(cfg, device).flags


def test_paper_iwslt_run_has_the_papers_settings():
    cfg = compose("dataset=iwslt14_de_en", "scale=paper")
    validate(cfg)
    flags = fairseq_flags(cfg, device="cpu")
    assert flags["arch"] == "ln_transformer_iwslt_de_en"
    assert flags["max_tokens"] == 4096 and flags["update_freq"] == 1
    assert flags["label_smoothing"] == 0.1 and flags["dropout"] == 0.1
    assert flags["adam_betas"] == "(0.9, 0.98)"
    assert flags["lr"] == 5e-4 and flags["warmup_updates"] == 4000
    assert flags["schedule"] == "inverse_sqrt" and flags["share_all_embeddings"]
    assert (cfg.eval.beam, cfg.eval.lenpen) == (5, 1.2)


def test_wmt_paper_emulates_16_gpus_and_pre_ln_recipe():
    cfg = compose("dataset=wmt14_en_de", "scale=paper", "placement=pre_ln", "warmup=0",
                  "schedule=step", "lr=7e-4", "schedule.epochs=[6]")
    flags = fairseq_flags(cfg, device="cpu")
    assert flags["arch"] == "ln_transformer_wmt_en_de"
    assert flags["max_tokens"] * flags["update_freq"] == 8192 * 16
    assert flags["step_epochs"] == "6" and flags["warmup_updates"] == 0


def test_mini_default_and_stock_equivalent_flags():
    from lnexp.train.settings import stock_flags

    cfg = compose()
    flags = fairseq_flags(cfg, device="cpu")
    assert flags["arch"] == "ln_transformer_mini" and flags["placement"] == "post_ln"
    stock = stock_flags(flags)
    assert stock["arch"] == "transformer" and stock["encoder_embed_dim"] == 128
    assert stock["lr_scheduler"] == "inverse_sqrt" and not stock["encoder_normalize_before"]
    assert stock_flags(fairseq_flags(compose("placement=peri_ln"), device="cpu")) is None


def test_fp16_needs_a_gpu_and_bf16_on_cpu_is_not_fairseqs(monkeypatch):
    from lnexp.errors import ConfigError
    from lnexp.train import precision

    with pytest.raises(ConfigError, match="needs a GPU"):
        fairseq_flags(compose("precision=fp16"), device="cpu")
    assert fairseq_flags(compose("precision=bf16"), device="cuda")["bf16"] is True
    # on CPU bf16 is lnexp's autocast (tests/test_precision.py): fairseq itself runs fp32. The
    # flags, not the CPU, are under test: the self-check is faked both ways (issue 49: an AMD EPYC
    # without bf16 failed here), as it passes on an Intel Xeon and fails on such an EPYC
    monkeypatch.setattr(precision, "self_check", lambda: None)
    assert fairseq_flags(compose("precision=bf16"), device="cpu")["bf16"] is False
    monkeypatch.setattr(precision, "self_check", lambda: "oneDNN reports no bf16 support")
    with pytest.raises(ConfigError, match="bf16 failed its self-check.*use precision=fp32"):
        fairseq_flags(compose("precision=bf16"), device="cpu")
    assert fairseq_flags(compose("precision=auto"), device="cuda")["bf16"] is False


# the defaults the training code once repeated, each changed in a copy of configs/train.yaml
CHANGED_DEFAULTS = {"compile: false": "compile: true", "  at_end: keep": "  at_end: delete",
                    "  syncs: fewer": "  syncs: every", "  adam: auto": "  adam: foreach",
                    "  half: cast": "  half: autocast", "  buckets: []": "  buckets: [16, 8]",
                    "  compile_mode: default": "  compile_mode: max-autotune-no-cudagraphs",
                    "  gpu_threads: 0": "  gpu_threads: 3", "  backend: auto": "  backend: nccl",
                    "  ddp_backend: auto": "  ddp_backend: c10d", "  port: -1": "  port: 2345",
                    "  init_method: null": "  init_method: tcp://h:1",
                    "  bucket_cap_mb: 25": "  bucket_cap_mb: 50",
                    "  find_unused_parameters: false": "  find_unused_parameters: true",
                    "  heartbeat_timeout: -1": "  heartbeat_timeout: 30"}


def test_the_defaults_live_in_train_yaml_only(small_multi30k, tmp_path, monkeypatch):
    """Changed in a copy of configs/train.yaml, each default reaches the run as changed (the
    run's settings, the speed group, fairseq's distributed flags); a config without the key gets
    no default of the code's own: it is an error."""
    import copy
    import shutil

    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import ConfigAttributeError

    from lnexp import config
    from lnexp.rundir import run_paths
    from lnexp.train.settings import distributed_flags, run_setup
    from lnexp.train.speed import Speed

    configs = tmp_path / "configs"
    shutil.copytree(config.CONFIG_DIR, configs)
    text = (configs / "train.yaml").read_text()
    for was, now in CHANGED_DEFAULTS.items():
        assert text.count(f"\n{was} ") == 1, was
        text = text.replace(f"\n{was} ", f"\n{now} ")
    (configs / "train.yaml").write_text(text)
    monkeypatch.setattr(config, "CONFIG_DIR", configs)
    monkeypatch.setattr(config, "_REFERENCES", {})
    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    cfg = compose(f"dataset.dir={small_multi30k}", "dataset.vocab_size=600")
    dist = compose("distributed.world_size=2")
    run = tmp_path / "run"
    setup = run_setup(cfg, run_paths(run), run)
    assert (setup.checkpoints_at_end, setup.compile) == ("delete", True)
    assert Speed.of(cfg) == Speed(syncs="every", adam="foreach", half="autocast",
                                  compile_mode="max-autotune-no-cudagraphs", buckets=(8, 16),
                                  gpu_threads=3)
    assert distributed_flags(dist, "cuda") == {
        "distributed_world_size": 2, "distributed_backend": "nccl", "ddp_backend": "c10d",
        "bucket_cap_mb": 50, "find_unused_parameters": True, "heartbeat_timeout": 30,
        "distributed_port": 2345, "distributed_init_method": "tcp://h:1"}
    for key, base, read in [
            *((k, cfg, lambda c: run_setup(c, run_paths(run), run)) for k in ("checkpoint.at_end",
                                                                             "compile")),
            *((f"speed.{k}", cfg, Speed.of) for k in ("syncs", "adam", "half", "buckets",
                                                      "compile_mode", "gpu_threads")),
            *((f"distributed.{k}", dist, lambda c: distributed_flags(c, "cuda"))
              for k in ("backend", "ddp_backend", "port", "init_method", "bucket_cap_mb",
                        "find_unused_parameters", "heartbeat_timeout"))]:
        bare = copy.deepcopy(base)
        parent, _, leaf = key.rpartition(".")
        with open_dict(bare):
            del (OmegaConf.select(bare, parent) if parent else bare)[leaf]
        with pytest.raises(ConfigAttributeError):
            read(bare)
