"""The one-GPU scale (configs/scale/gpu.yaml): the paper's IWSLT model on the shipped Multi30k,
its warm-ups mapped in epochs. It composes, its experiments agree with the figures' labels, and it
trains 2 updates on CPU (the experiments' own first jobs train in tests/test_experiments.py)."""

from __future__ import annotations

from omegaconf import OmegaConf

from lnexp import config
from lnexp.figures.fig2 import PAPER_WARMUP
from lnexp.names import ARCH_SIZES


def test_gpu_scale_is_the_papers_iwslt_model_with_its_warmups_mapped_in_epochs():
    cfg = config.compose(["scale=gpu", "placement=post_ln", "schedule=inverse_sqrt"])
    assert cfg.dataset.name == "multi30k" and cfg.scale.arch == "ln_transformer_iwslt_de_en"
    assert ARCH_SIZES[cfg.scale.arch] == {"layers": 6, "embed_dim": 512, "ffn_embed_dim": 1024,
                                          "attention_heads": 4}
    assert (cfg.scale.max_tokens, cfg.scale.lr, cfg.eval.beam, cfg.max_epoch) == (4096, 5e-4, 5, 15)
    # the paper's 500 and 4000 keep their ratio 1:8 and are what fig2_gpu sweeps and fig2 labels
    labels = {v: k for k, v in PAPER_WARMUP["gpu"].items()}
    assert cfg.warmup == labels["4000"] and round(labels["4000"] / 8) == labels["500"]
    sweep = OmegaConf.load(config.CONFIG_DIR / "experiment" / "fig2_gpu.yaml").hydra.sweeper.params
    assert [int(w) for w in str(sweep.warmup).split(",")] == sorted(PAPER_WARMUP["gpu"])
    fig4 = config.compose(["experiment=fig4_gpu", "placement=post_ln", "optimizer=adam"])
    assert fig4.warmup == cfg.warmup and fig4.scale.name == "gpu"
