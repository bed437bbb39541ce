"""Every use of fairseq's internals goes through this module, so an upgrade touches one place.

It builds fairseq's argument namespaces from plain settings, binarises text, creates the task,
model, criterion and ``Trainer``, and loads checkpoints with torch's ``weights_only`` check on.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
logging.getLogger("fairseq").setLevel(logging.WARNING)


def _fairseq_flags(flags: dict[str, Any]) -> list[str]:
    """{'max_tokens': 4096, 'share_all_embeddings': True} -> ['--max-tokens', '4096', ...]."""
    argv: list[str] = []
    for key, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, list | tuple):
            argv += [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def flags_to_argv(data: str | Path, flags: dict[str, Any]) -> list[str]:
    """The exact fairseq-train command line equivalent to a set of settings."""
    return [str(data), *_fairseq_flags(flags)]


def training_args(data: str | Path, flags: dict[str, Any]) -> argparse.Namespace:
    """Parse settings with fairseq-train's own parser, so defaults are fairseq's."""
    import lnexp.model  # noqa: F401  (registers ln_transformer)
    import lnexp.optim  # noqa: F401  (registers radam and lnexp's schedules)
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, flags_to_argv(data, flags))


def to_fairseq_config(args: argparse.Namespace):
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(args)


def binarize(
    train_prefix: Path, valid_prefix: Path, test_prefix: Path, src: str, tgt: str, dest: Path,
    workers: int = 1,
) -> None:
    """fairseq-preprocess with one joined dictionary, as the paper's shared embeddings need."""
    from fairseq import options
    from fairseq_cli import preprocess

    argv = _fairseq_flags(dict(
        source_lang=src, target_lang=tgt, trainpref=train_prefix, validpref=valid_prefix,
        testpref=test_prefix, destdir=dest, joined_dictionary=True, workers=workers,
    ))
    args = options.get_preprocessing_parser().parse_args(argv)
    logging.getLogger("fairseq_cli.preprocess").setLevel(logging.WARNING)
    preprocess.main(args)
    for f in dest.glob("preprocess.log"):
        f.unlink()


# --- training objects -------------------------------------------------------------------------


def build_trainer(cfg):
    """Task, model, criterion and fairseq's Trainer, seeded exactly as fairseq-train seeds them."""
    import numpy as np
    from fairseq import tasks, utils
    from fairseq.trainer import Trainer

    utils.import_user_module(cfg.common)
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    for split in cfg.dataset.valid_subset.split(","):
        task.load_dataset(split, combine=False, epoch=1)
    trainer = Trainer(cfg, task, model, criterion)
    return task, model, criterion, trainer


def epoch_iterator(cfg, trainer, restore_file: Path | None):
    """Load the last checkpoint if any (weights_only kept on) and return (extra_state, epoch_itr)."""
    from fairseq import checkpoint_utils

    allow_fairseq_checkpoint_globals()
    if restore_file is not None and restore_file.is_file():
        cfg.checkpoint.restore_file = str(restore_file)
    else:
        cfg.checkpoint.restore_file = "/nonexistent/checkpoint.pt"
    extra_state, epoch_itr = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    return extra_state, epoch_itr


def next_epoch_iterator(trainer, epoch_itr):
    return trainer.get_train_iterator(epoch_itr.next_epoch_idx, load_dataset=False)


def batch_iterator(task, cfg, split: str, max_tokens: int | None = None, max_sentences=None):
    """Ordered, unshuffled batches of a split (for validation and generation)."""
    ds = task.dataset(split)
    return task.get_batch_iterator(
        dataset=ds,
        max_tokens=max_tokens or cfg.dataset.max_tokens_valid,
        max_sentences=max_sentences,
        max_positions=(1024, 1024),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=1,
        seed=cfg.common.seed,
        num_workers=0,
    ).next_epoch_itr(shuffle=False)


def sequence_generator(task, model, beam: int, lenpen: float, max_len_b: int = 200):
    from fairseq.dataclass.configs import GenerationConfig

    gen = GenerationConfig(beam=beam, lenpen=lenpen, max_len_a=1.2, max_len_b=max_len_b)
    return task.build_generator([model], gen)


def strip_pad(tokens, pad: int):
    from fairseq import utils

    return utils.strip_pad(tokens, pad)


def move_to(sample, device: str):
    from fairseq import utils

    return utils.move_to_cuda(sample) if device == "cuda" else sample


# --- checkpoints --------------------------------------------------------------------------------

_ALLOWED = False


def allow_fairseq_checkpoint_globals() -> None:
    """Let ``torch.load(weights_only=True)`` read fairseq checkpoints.

    fairseq stores its config as an OmegaConf DictConfig and argparse Namespace; allow-list exactly
    the classes that appear in them, instead of switching the safety check off.
    """
    global _ALLOWED
    if _ALLOWED:
        return
    import collections
    import typing

    import torch
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode, BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode

    torch.serialization.add_safe_globals([
        DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, BooleanNode, EnumNode,
        FloatNode, IntegerNode, StringNode, argparse.Namespace, typing.Any, dict, list, int,
        collections.defaultdict, collections.OrderedDict,
    ])
    _ALLOWED = True


def load_checkpoint_state(path: Path) -> dict:
    """A fairseq checkpoint as a dict, read with weights_only=True."""
    import torch

    allow_fairseq_checkpoint_globals()
    with open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)
