"""The choices of each axis of the study and the architectures' sizes, importable without torch or
fairseq (the CLI's start-up path, settings and the report read them)."""

from functools import cache
from pathlib import Path

# The placements of 2020 first (the figures' order), then every other configs/placement/*.yaml
# Xiong et al.'s two and Peri-LN: the default placements of fig3 and theory
PAPER_PLACEMENTS = ("post_ln", "pre_ln", "peri_ln")
_FIRST = (*PAPER_PLACEMENTS, "deepnorm")
# A link to the top-level configs/ in a checkout; the YAML files themselves in an installed wheel.
CONFIG_DIR = (Path(__file__).parent / "configs").resolve()


def option_files(group: str) -> list[Path]:
    """configs/GROUP/*.yaml that are options; a name starting with ``_`` is what the options share
    (placement/_base.yaml), not one of them."""
    return sorted(p for p in (CONFIG_DIR / group).glob("*.yaml") if not p.name.startswith("_"))


PLACEMENTS = _FIRST + tuple(sorted(p.stem for p in option_files("placement") if p.stem not in _FIRST))
# the files of configs/norm/ (each a module of lnexp/model/norms.py): the atlas's first four in its
# order, then every other file (a new configs/norm/NAME.yaml is listed without an edit here)
_FIRST_NORMS = ("layernorm", "rmsnorm", "dyt", "scalenorm")
NORMS = _FIRST_NORMS + tuple(sorted(p.stem for p in option_files("norm") if p.stem not in _FIRST_NORMS))
# a norm's name in the figures (one not listed is shown by its file's name)
NORM_LABELS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "dyt": "DyT", "scalenorm": "ScaleNorm",
               "derf": "Derf", "seednorm": "SeeDNorm"}
SCHEDULES = ("inverse_sqrt", "constant", "step", "linear")
# auto: bf16 autocast on a CPU with bf16 units whose self-check passes, else fp32 (lnexp/train/precision.py)
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
# configs/scale: mini (CPU, d=128), gpu (the paper's IWSLT model on Multi30k, one GPU), paper
SCALES = ("mini", "gpu", "paper")

# Sizes of each stack (encoder and decoder alike) of the registered architectures. The mini size is
# lnexp's own and its fairseq architecture reads it from here; the other two are fairseq's
# transformer_iwslt_de_en and transformer_wmt_en_de, which tests/test_model.py checks this table against.
ARCH_SIZES: dict[str, dict[str, int]] = {
    "ln_transformer_mini": {"layers": 6, "embed_dim": 128, "ffn_embed_dim": 512, "attention_heads": 4},
    "ln_transformer_iwslt_de_en": {"layers": 6, "embed_dim": 512, "ffn_embed_dim": 1024,
                                   "attention_heads": 4},
    "ln_transformer_wmt_en_de": {"layers": 6, "embed_dim": 512, "ffn_embed_dim": 2048,
                                 "attention_heads": 8},
}


def arch_flags(arch: str, layers: bool = True) -> dict[str, int]:
    """``arch``'s sizes as fairseq options: {'encoder_embed_dim': 128, ...} (``layers``: with the depth)."""
    return {f"{side}_{key}": value for side in ("encoder", "decoder")
            for key, value in ARCH_SIZES[arch].items() if layers or key != "layers"}


def describe_arch(arch: str) -> str:
    """'6+6 layers, d=128, FFN 512, 4 heads'."""
    s = ARCH_SIZES[arch]
    return (f"{s['layers']}+{s['layers']} layers, d={s['embed_dim']}, FFN {s['ffn_embed_dim']}, "
            f"{s['attention_heads']} heads")


# Keys that say how long to train: they do not name the run, so raising max_epoch continues a
# finished run in its own folder (configs/train.yaml's exclude_keys holds them for Hydra)
LENGTH_KEYS = ("max_epoch", "max_update")


@cache
def unnamed_keys() -> tuple[str, ...]:
    """The config keys that do not name a run (configs/train.yaml's ``exclude_keys``: how long to
    train, how to report, the machine's settings), so that what tells runs apart in a legend or a
    table is what names them."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(CONFIG_DIR / "train.yaml")
    return tuple(str(k) for k in cfg.hydra.job.config.override_dirname.exclude_keys)
