"""Every use of fairseq's internals goes through this module, so an upgrade touches one place.

It builds fairseq's argument namespaces from plain settings, binarises text, creates the task,
model, criterion and ``Trainer``, and loads checkpoints with torch's ``weights_only`` check on.
"""

from __future__ import annotations

import argparse
import logging
import math
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
    from fairseq import options

    import lnexp.model  # noqa: F401  (registers ln_transformer)
    import lnexp.optim  # noqa: F401  (registers radam and lnexp's schedules)

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, flags_to_argv(data, flags))


def to_fairseq_config(args: argparse.Namespace):
    """fairseq's namespace -> DictConfig conversion (it composes fairseq's own Hydra schemas)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    _restore_fairseq_schemas()
    try:
        return convert_namespace_to_omegaconf(args)
    finally:
        hide_fairseq_schemas()


# fairseq registers a Hydra schema per optimizer ("optimizer/adam", ...). Under version_base 1.1,
# which fairseq's own compose needs, Hydra would validate lnexp's configs/optimizer/adam.yaml
# against it. Keep those schemas out of the ConfigStore except while fairseq composes.
_HIDDEN: dict[tuple[str, str], object] = {}


def hide_fairseq_schemas(config_dir: Path | None = None) -> None:
    from hydra.core.config_store import ConfigStore

    config_dir = config_dir or Path(__file__).resolve().parents[1] / "configs"
    repo = ConfigStore.instance().repo
    for group_dir in config_dir.iterdir():
        group = repo.get(group_dir.name)
        if not group_dir.is_dir() or not isinstance(group, dict):
            continue
        for yaml in group_dir.glob("*.yaml"):
            if yaml.name in group:
                _HIDDEN[(group_dir.name, yaml.name)] = group.pop(yaml.name)


def _restore_fairseq_schemas() -> None:
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for (group, name), node in _HIDDEN.items():
        repo.setdefault(group, {})[name] = node
    _HIDDEN.clear()


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


def grouped(itr, cfg):
    """Group batches into updates (gradient accumulation), as fairseq-train does."""
    from fairseq.data import iterators

    return iterators.GroupedIterator(itr, cfg.optimization.update_freq[0],
                                     skip_remainder_batch=cfg.optimization.skip_remainder_batch)


def train_step(trainer, samples) -> dict[str, float] | None:
    """One update; returns fairseq's per-update statistics, or None if it went NaN/inf."""
    from fairseq.logging import metrics

    with metrics.aggregate() as agg:  # a fresh aggregator: this update only
        try:
            trainer.train_step(samples)
        except FloatingPointError:
            return None
    meters = agg

    def avg(key: str) -> float:
        m = meters.get(key)
        return float(m.avg) if m is not None and m.avg is not None else math.nan

    def total(key: str) -> float:
        m = meters.get(key)
        return float(m.sum) if m is not None else 0.0

    return {"loss": avg("loss"), "nll_loss": avg("nll_loss"), "gnorm": avg("gnorm"),
            "ntokens": total("wpb"), "sample_size": float(meters["loss"].count)
            if "loss" in meters else 0.0}


def updates_per_epoch(data: str | Path, flags: dict[str, Any]) -> int:
    """Number of updates in one epoch of these settings (the linear schedule needs the total)."""
    from fairseq import tasks

    args = training_args(data, flags)
    cfg = to_fairseq_config(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size, max_positions=(1024, 1024),
        ignore_invalid_inputs=True, required_batch_size_multiple=1, seed=cfg.common.seed)
    return math.ceil(len(itr) / cfg.optimization.update_freq[0])


def batch_iterator(task, split: str, max_tokens: int = 8192, max_sentences: int | None = None,
                   ids=None):
    """Unshuffled batches of a split (or of the examples ``ids``), length-sorted to limit padding."""
    ds = task.dataset(split)
    order = sorted(range(len(ds)) if ids is None else ids, key=lambda i: (ds.num_tokens(i), i))
    batch: list[int] = []
    longest = 0
    for i in order:
        longest = max(longest, ds.num_tokens(i))
        if batch and ((max_sentences and len(batch) >= max_sentences)
                      or longest * (len(batch) + 1) > max_tokens):
            yield ds.collater([ds[j] for j in batch])
            batch, longest = [], ds.num_tokens(i)
        batch.append(i)
    if batch:
        yield ds.collater([ds[j] for j in batch])


def generate_batches(task, split: str, model, max_sentences: int):
    """Batches of a split exactly as fairseq-generate forms them (its defaults: sorted by source
    then target length, --required-batch-size-multiple 8, no shuffling). The length limit of a
    hypothesis depends on the longest source in its batch, so reproducing fairseq-generate's
    output needs its batches."""
    from fairseq import utils

    return task.get_batch_iterator(
        dataset=task.dataset(split), max_tokens=None, max_sentences=max_sentences,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, required_batch_size_multiple=8, seed=1,
    ).next_epoch_itr(shuffle=False)


# Hypotheses up to 1.2 x source + 10 tokens: untrained models stop early instead of at 200.
MAX_LEN_A, MAX_LEN_B = 1.2, 10


def sequence_generator(task, model, beam: int, lenpen: float, max_len_a: float = MAX_LEN_A,
                       max_len_b: int = MAX_LEN_B):
    """fairseq's beam search with fairseq-generate's defaults except the length limit above."""
    from fairseq.dataclass.configs import GenerationConfig

    gen = GenerationConfig(beam=beam, lenpen=lenpen, max_len_a=max_len_a, max_len_b=max_len_b)
    return task.build_generator([model], gen)


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


def average_checkpoints(paths: list[Path], arg_overrides: dict[str, Any] | None = None) -> dict:
    """fairseq's ``scripts/average_checkpoints.py`` (not in the wheel), same semantics: the state of
    the first file with every model tensor replaced by the mean over the files (half tensors
    summed in fp32; integer tensors floor-divided)."""
    import collections

    import torch
    from fairseq import checkpoint_utils

    allow_fairseq_checkpoint_globals()
    new_state, sums, keys = None, collections.OrderedDict(), None
    for path in paths:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path), arg_overrides)
        new_state = new_state or state
        if keys is None:
            keys = list(state["model"])
        elif keys != list(state["model"]):
            raise KeyError(f"{path} holds other parameters than {paths[0]}: cannot average them")
        for k in keys:
            p = state["model"][k]
            p = p.float() if p.dtype == torch.float16 else p
            sums[k] = p.clone() if k not in sums else sums[k] + p
    for v in sums.values():
        if v.is_floating_point():
            v.div_(len(paths))
        else:
            v //= len(paths)
    new_state["model"] = sums
    return new_state


def load_for_inference(path: Path, data_dir: str | Path, dataset_impl: str | None = None,
                       state: dict | None = None):
    """(model, task) of a checkpoint as fairseq-generate loads it, reading data from ``data_dir``
    (``dataset_impl='raw'``: plain subword text files); ``state``: an already loaded (averaged) one."""
    from fairseq import checkpoint_utils

    import lnexp.model  # noqa: F401  (registers ln_transformer)
    import lnexp.optim  # noqa: F401  (radam and lnexp's schedules, named in the checkpoint's config)

    allow_fairseq_checkpoint_globals()
    overrides: dict[str, Any] = {"data": str(data_dir)}
    if dataset_impl:
        overrides["dataset_impl"] = dataset_impl
    if state is not None:
        from fairseq.dataclass.utils import overwrite_args_by_name

        overwrite_args_by_name(state["cfg"], overrides)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides=overrides, state=state)
    return models[0], task


def add_inference_split(task, name: str, lines: list[str]) -> None:
    """Register subword-encoded source ``lines`` as split ``name`` of ``task`` (no targets)."""
    tokens = [task.source_dictionary.encode_line(line, add_if_not_exist=False).long()
              for line in lines]
    task.datasets[name] = task.build_dataset_for_inference(tokens, [t.numel() for t in tokens])


# --- measurement objects (lnexp.probes, lnexp.figures.fig3/theory) ------------------------------


def setup_task(cfg, splits: tuple[str, ...] = ("train",)):
    """fairseq's task of a config (dictionaries), with ``splits`` loaded."""
    from fairseq import tasks, utils

    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    for split in splits:
        task.load_dataset(split, combine=False, epoch=1)
    return task


def build_model(cfg, task, seed: int):
    """The model of ``cfg`` initialised from ``seed`` (torch seeded as fairseq-train seeds it)."""
    from fairseq import utils

    utils.set_torch_seed(seed)
    return task.build_model(cfg.model)


def build_criterion(cfg, task):
    return task.build_criterion(cfg.criterion)
