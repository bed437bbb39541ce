"""Hydra config -> fairseq flags: the paper's settings arrive where fairseq reads them."""

from __future__ import annotations

import pytest

from lnexp.config import compose as _compose
from lnexp.config import validate


def compose(*overrides: str):
    return _compose(list(overrides), check=False)


def test_paper_iwslt_run_has_the_papers_settings():
    from lnexp.train.settings import fairseq_flags

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
    from lnexp.train.settings import fairseq_flags

    cfg = compose("dataset=wmt14_en_de", "scale=paper", "placement=pre_ln", "warmup=0",
                  "schedule=step", "lr=7e-4", "schedule.epochs=[6]")
    flags = fairseq_flags(cfg, device="cpu")
    assert flags["arch"] == "ln_transformer_wmt_en_de"
    assert flags["max_tokens"] * flags["update_freq"] == 8192 * 16
    assert flags["step_epochs"] == "6" and flags["warmup_updates"] == 0


def test_mini_default_and_stock_equivalent_flags():
    from lnexp.train.settings import fairseq_flags, stock_flags

    cfg = compose()
    flags = fairseq_flags(cfg, device="cpu")
    assert flags["arch"] == "ln_transformer_mini" and flags["placement"] == "post_ln"
    stock = stock_flags(flags)
    assert stock["arch"] == "transformer" and stock["encoder_embed_dim"] == 128
    assert stock["lr_scheduler"] == "inverse_sqrt" and not stock["encoder_normalize_before"]
    assert stock_flags(fairseq_flags(compose("placement=peri_ln"), device="cpu")) is None


def test_fp16_needs_a_gpu_and_bf16_on_cpu_is_not_fairseqs():
    from lnexp.errors import ConfigError
    from lnexp.train.settings import fairseq_flags

    with pytest.raises(ConfigError, match="needs a GPU"):
        fairseq_flags(compose("precision=fp16"), device="cpu")
    assert fairseq_flags(compose("precision=bf16"), device="cuda")["bf16"] is True
    # on CPU bf16 is lnexp's autocast (tests/test_precision.py): fairseq itself runs fp32
    assert fairseq_flags(compose("precision=bf16"), device="cpu")["bf16"] is False
    assert fairseq_flags(compose("precision=auto"), device="cuda")["bf16"] is False
