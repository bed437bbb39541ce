"""fairseq's runtime internals, behind one module: an upgrade of fairseq touches this file and
lnexp's two plugin modules, nothing else.

Everything lnexp and its scripts do with fairseq at run time goes through here: fairseq's argument
namespaces and configs from plain settings (and its Hydra schemas kept out of lnexp's), binarising
text, the task, model, criterion and ``Trainer``, epoch and batch iterators, the sequence generator,
checkpoints loaded with torch's ``weights_only`` check on, and stock ``fairseq-train`` itself for the
side-by-side benchmarks.

Not here, by design: lnexp's fairseq plugins. ``lnexp/model/`` subclasses fairseq's Transformer layers
and registers ``ln_transformer`` (``register_model``); ``lnexp/optim.py`` registers ``radam`` and the
``lnexp`` schedule (``register_optimizer``, ``register_lr_scheduler``). Those are fairseq's public
extension points, the ones a ``--user-dir`` module uses; a class registered with fairseq has to import
fairseq where it is defined, and none of them touches the runtime internals above.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import logging
import math
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
logging.getLogger("fairseq").setLevel(logging.WARNING)

# fairseq imports every module of its tasks/ and criterions/ folders when it is imported. Two of them
# import scikit-learn, and with it scipy and pandas: about 1 CPU s of the ~3 s that every process
# importing fairseq pays, for an audio task and a sentence-classification criterion (and its
# adapters' criterion, which imports it) that lnexp never uses.
DEFERRED_FAIRSEQ_MODULES = ("fairseq.criterions.sentence_prediction",
                            "fairseq.criterions.sentence_prediction_adapters",
                            "fairseq.tasks.audio_classification")


def defer_unused_fairseq_modules() -> None:
    """Import DEFERRED_FAIRSEQ_MODULES as empty modules that run their code when a name is first
    read from them (then they register their task or criterion, as fairseq would have). Called when
    lnexp is imported, before anything imports fairseq; a process that imported fairseq earlier
    keeps it as it is."""
    if not any(isinstance(f, _DeferredFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferredFinder())


class _DeferredFinder:
    """A meta path finder (importlib's protocol; its abc would import importlib.resources at every
    start)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in DEFERRED_FAIRSEQ_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _RunOnFirstRead(spec.loader)
        return spec


class _RunOnFirstRead:
    """Not importlib's LazyLoader: that one runs a module when anything reads ``__file__``, which
    torch does of every module in sys.modules when it registers an operator."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        loader = self.loader

        def run_then_read(name: str) -> Any:  # a module's __getattr__: names it does not hold yet
            del module.__dict__["__getattr__"]
            module.__loader__ = module.__spec__.loader = loader
            loader.exec_module(module)
            return getattr(module, name)

        module.__dict__["__getattr__"] = run_then_read


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
    args = options.parse_args_and_arch(parser, flags_to_argv(data, flags))
    # fairseq's parser turns --bf16 into --tpu as well; the Trainer then asks torch_xla for its
    # device. lnexp runs bf16 on GPUs (and CPUs), never on TPUs.
    args.tpu = bool(flags.get("tpu", False))
    return args


def training_config(data: str | Path, flags: dict[str, Any]):
    """fairseq's config of fairseq-train settings, as fairseq-train makes it (its parser, then its
    namespace -> config conversion). lnexp's config reaches it through
    ``lnexp.train.settings.fairseq_setup``."""
    return to_fairseq_config(training_args(data, flags))


def to_fairseq_config(args: argparse.Namespace):
    """fairseq's namespace -> DictConfig conversion (it composes fairseq's own Hydra schemas)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from lnexp.config import hide_fairseq_schemas, restore_fairseq_schemas

    restore_fairseq_schemas()
    _store_missing_fairseq_schemas()
    try:
        return convert_namespace_to_omegaconf(args)
    finally:
        hide_fairseq_schemas()


def _store_missing_fairseq_schemas() -> None:
    """fairseq stores a Hydra schema per registered component once, when it is imported. A
    launcher that restores Hydra's ConfigStore before each job (joblib does, in its workers) drops
    them for every job after a worker's first; store the missing ones again, as fairseq does."""
    from fairseq.dataclass.initialize import hydra_init
    from fairseq.models import MODEL_DATACLASS_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if "config.yaml" not in store.repo:
        hydra_init()
    groups = [(name, reg["dataclass_registry"]) for name, reg in REGISTRIES.items()]
    groups += [("task", TASK_DATACLASS_REGISTRY), ("model", MODEL_DATACLASS_REGISTRY)]
    for group, registry in groups:
        stored = store.repo.get(group, {})
        for name, dataclass in registry.items():
            if f"{name}.yaml" not in stored:
                node = dataclass()
                node._name = name
                store.store(name=name, group=group, node=node, provider="fairseq")


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


def fresh_process_state() -> None:
    """fairseq's process-wide state as a new process has it: its metrics aggregators (which a
    Trainer's checkpoint carries) and fairseq-train's best-loss memo. lnexp.atlas.worker trains
    cells one after another in one process, each as if in its own."""
    from fairseq import checkpoint_utils
    from fairseq.logging import metrics

    metrics.reset()
    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best


def epoch_iterator(cfg, trainer, restore_file: Path | None):
    """Where training starts: the last checkpoint if any (weights_only kept on), else the model as
    it is (a fresh run's scheme init, Admin's profiling pass included, is done before: see
    lnexp.train.session); returns (extra_state, epoch_itr)."""
    from fairseq import checkpoint_utils

    allow_fairseq_checkpoint_globals()
    if restore_file is not None and restore_file.is_file():
        cfg.checkpoint.restore_file = str(restore_file)
    else:
        cfg.checkpoint.restore_file = "/nonexistent/checkpoint.pt"
    return checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)


def first_batch_on_device(cfg, task, trainer):
    """The first training batch (``first_train_batch``) on the trainer's device, for a profiling
    pass at a fresh run's start."""
    return move_to(first_train_batch(cfg, task, trainer.get_model()), trainer.device.type)


def first_train_batch(cfg, task, model):
    """The first batch of epoch 1 as fairseq-train's iterator forms it, from an iterator of its own
    (the training's is left untouched)."""
    from fairseq import utils

    split = cfg.dataset.train_subset
    task.load_dataset(split, combine=True, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset(split), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(),
                                                  cfg.dataset.max_tokens),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, num_shards=1, shard_id=0, num_workers=0, epoch=1,
        disable_iterator_cache=True)
    return next(iter(itr.next_epoch_itr(shuffle=True)))


def grouped(itr, cfg):
    """Group batches into updates (gradient accumulation), as fairseq-train does."""
    from fairseq.data import iterators

    return iterators.GroupedIterator(itr, cfg.optimization.update_freq[0],
                                     skip_remainder_batch=cfg.optimization.skip_remainder_batch)


def autocast_forward(trainer, context) -> None:
    """Run the forward pass and the loss of every training and validation step under
    ``context()`` (lnexp.train.precision.autocast_context): fairseq's task calls the criterion,
    which calls the model and computes the loss, inside its "forward" region, and the backward
    outside it; so wrapping the criterion covers exactly forward + loss. The optimizer, gradient
    clipping and the weights are untouched (fp32)."""
    import functools

    criterion = trainer.criterion
    forward = criterion.forward

    @functools.wraps(forward)
    def under_context(*args, **kwargs):
        with context():
            return forward(*args, **kwargs)

    criterion.forward = under_context


def use_torch_adam(trainer, impl: str) -> str | None:
    """Step with torch's multi-tensor Adam kernels (``impl``: foreach or fused; lnexp.optim's
    ``TorchKernelAdam``, fairseq's arithmetic) instead of fairseq's per-parameter Adam, in the
    place where fairseq puts apex's FusedAdam: the ``_optimizer`` of its ``FairseqAdam`` (under
    ``FP16Optimizer``/``AMPOptimizer``, the one over the fp32 master weights). Call it after the
    checkpoint is loaded: the state carries over. Returns None, or why it kept fairseq's Adam."""
    from fairseq.optim.adam import Adam, FairseqAdam

    from lnexp.optim import torch_kernel_adam

    wrapper = trainer.optimizer
    inner = getattr(wrapper, "fp32_optimizer", wrapper)
    if not isinstance(inner, FairseqAdam):
        return f"the optimizer is {type(inner).__name__}, not fairseq's Adam"
    if type(inner._optimizer) is not Adam:  # apex's FusedAdam, or use_old_adam's
        return f"fairseq already steps with {type(inner._optimizer).__name__}"
    if inner._optimizer.defaults.get("amsgrad"):
        return "amsgrad is not among torch's fused kernels' options here"
    try:
        inner._optimizer = torch_kernel_adam(inner._optimizer, impl)
    except (RuntimeError, ValueError) as e:  # e.g. a device or dtype the kernels do not take
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if wrapper is inner:  # fp32 weights: fairseq scales and clips each parameter's gradient
        _foreach_gradient_ops(inner)
    return None


def _foreach_gradient_ops(opt) -> None:
    """fairseq's gradient clipping (``clip_grad_norm``: one norm per parameter, then their norm;
    without apex on a GPU) with the per-parameter norms from torch's foreach kernel: the same
    operations, ~400 kernel launches fewer an update at the IWSLT size (fairseq scales and clips
    the gradients with foreach kernels already; FP16Optimizer's flat master copy has one norm)."""
    import torch
    from fairseq import utils

    def clip_grad_norm(max_norm, aggregate_norm_fn=None):
        grads = [p.grad.detach() for p in opt.params if p.grad is not None]
        if len(grads) < 2 or any(hasattr(p, "expert") for p in opt.params):
            return utils.clip_grad_norm_(opt.params, max_norm, aggregate_norm_fn)
        total = torch.norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))
        if aggregate_norm_fn is not None:
            total = aggregate_norm_fn(total)
        if max_norm > 0:
            coef = (float(max_norm) / (total + 1e-6)).clamp_(max=1)
            torch._foreach_mul_(grads, coef)
        return total

    opt.clip_grad_norm = clip_grad_norm


def lean_stats(trainer):
    """fairseq's ``Trainer._reduce_and_log_stats`` without what only fairseq-train's own progress
    lines use: the same meters logged with the same tensors, but not rounded to Python floats
    (one device-to-host read per meter), and no finiteness check of the gradient norm (the
    update checked it already: fairseq raises, or skips the update, before it logs). Returns the
    replacement, for ``train_step(fewer_syncs=True)`` to put in place during an update."""
    import torch
    from fairseq.logging import metrics

    def reduce_and_log(logging_outputs, sample_size, grad_norm=None):
        if grad_norm is not None:
            metrics.log_speed("ups", 1.0, priority=100, round=2)
            metrics.log_scalar("gnorm", grad_norm, priority=400, round=3)
            if trainer.cfg.optimization.clip_norm > 0:
                metrics.log_scalar("clip", torch.where(
                    grad_norm > trainer.cfg.optimization.clip_norm, grad_norm.new_tensor(100),
                    grad_norm.new_tensor(0)), priority=500, round=1)
        with metrics.aggregate() as agg:
            if logging_outputs is not None:
                trainer.task.reduce_metrics(logging_outputs, trainer.get_criterion())
            if "loss" not in agg:
                metrics.log_scalar("loss", -1)
        return {"sample_size": sample_size}

    return reduce_and_log


def phase_clock(trainer, clock) -> dict[str, float]:
    """Seconds spent in each phase of fairseq's update, summed from now on (for
    scripts/profile_step.py): "forward" (the criterion: model forward + loss), "backward"
    (the optimizer wrapper's backward), "optimizer" (gradient clipping + the optimizer's step).
    ``clock``: a no-argument function giving seconds (time.perf_counter)."""
    import functools

    spent = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    def timed(obj, name: str, phase: str) -> None:
        f = getattr(obj, name)

        @functools.wraps(f)
        def run(*args, **kwargs):
            t = clock()
            try:
                return f(*args, **kwargs)
            finally:
                spent[phase] += clock() - t
        setattr(obj, name, run)

    timed(trainer.criterion, "forward", "forward")
    timed(trainer.optimizer, "backward", "backward")
    timed(trainer.optimizer, "clip_grad_norm", "optimizer")
    timed(trainer.optimizer, "step", "optimizer")
    return spent


def train_step(trainer, samples, fewer_syncs: bool = False) -> dict[str, Any] | None:
    """One update, handled as fairseq-train handles it.

    ``fewer_syncs`` (``speed.syncs=fewer``): fairseq's logging of the update without its
    device-to-host reads (``lean_stats``) and lnexp's statistics read in one transfer; the same
    numbers, one read instead of about eight per update (on a GPU each stalls the host until the
    device has caught up).

    Returns fairseq's per-update statistics plus ``loss_scale`` (None without a loss scaler);
    ``{"overflow": True, "loss_scale": ...}`` when fairseq's fp16 loss scaler found an overflow,
    skipped the update and lowered the scale (stock fairseq goes on); None when fairseq gives up
    (FloatingPointError: non-finite gradients without a scaler, or ``min_loss_scale`` reached).
    """
    from fairseq.logging import metrics

    before = trainer.get_num_updates()
    if fewer_syncs:  # (an instance attribute: the class's method again once deleted)
        trainer._reduce_and_log_stats = lean_stats(trainer)
    with metrics.aggregate() as agg:  # a fresh aggregator: this update only
        try:
            trainer.train_step(samples)
        except FloatingPointError:
            return None
        except Exception as e:
            # On FloatingPointError fairseq saves crash.pt and re-runs the update under its
            # NanDetector, whose hooks fail on encoders that return dicts of lists (torch >= 2):
            # that error replaces the FloatingPointError it was reporting.
            if isinstance(e.__context__, FloatingPointError):
                logging.getLogger("lnexp.train").warning("fairseq gave up: %s", e.__context__)
                return None
            raise
        finally:
            if fewer_syncs:
                del trainer._reduce_and_log_stats
    meters = agg
    scale = loss_scale(trainer)
    if trainer.get_num_updates() == before:
        return {"overflow": True, "loss_scale": scale}
    after_update(trainer)
    means = _read_at_once(meters, ("loss", "nll_loss", "gnorm")) if fewer_syncs else {}

    def avg(key: str) -> float:
        if key in means:
            return means[key]
        m = meters.get(key)
        return float(m.avg) if m is not None and m.avg is not None else math.nan

    def total(key: str) -> float:
        m = meters.get(key)
        return float(m.sum) if m is not None else 0.0

    return {"loss": avg("loss"), "nll_loss": avg("nll_loss"), "gnorm": avg("gnorm"),
            "ntokens": total("wpb"), "sample_size": float(meters["loss"].count)
            if "loss" in meters else 0.0, "loss_scale": scale}


def _read_at_once(meters, keys: tuple[str, ...]) -> dict[str, float]:
    """The averages of the meters ``keys`` that hold one-element tensors of one device and dtype,
    as floats, in one device-to-host transfer (the same values as ``float(m.avg)`` each)."""
    import torch

    held = {}
    for key in keys:
        m = meters.get(key)
        value = None if m is None else m.avg
        if torch.is_tensor(value) and value.numel() == 1:
            held[key] = value.reshape(())
    kinds = {(t.device, t.dtype) for t in held.values()}
    if len(kinds) != 1:
        return {}
    return dict(zip(held, torch.stack(list(held.values())).tolist(), strict=True))


def loss_scale(trainer) -> float | None:
    """The fp16 loss scale fairseq's optimizer wrapper uses now (None: fp32/bf16, no scaler)."""
    scaler = getattr(trainer.optimizer, "scaler", None)
    if scaler is None:
        return None
    value = scaler.get_scale() if hasattr(scaler, "get_scale") else scaler.loss_scale
    return float(value)


def stepped_grads(trainer):
    """``grad_of(param)``: the gradient the optimizer stepped with for a model parameter.

    fp32: the model's ``.grad`` (fairseq divides by the sample size and clips it in place). With
    ``FP16Optimizer`` (bf16, fp16) that happens on the fp32 master copy (flat or one tensor per
    parameter), while the model's ``.grad`` keeps the raw (loss-scaled) sum; this returns the view
    of the master gradient for that parameter. Valid until the next update zeroes gradients.
    """
    master = _masters(trainer)
    if master is None:
        return lambda p: p.grad
    return lambda p: master(p, grad=True)


def _masters(trainer):
    """``master(param, grad=False)``: the view of the fp32 master copy that ``FP16Optimizer`` (bf16,
    fp16) steps for a model parameter (of its gradient with ``grad``), None for a frozen one;
    None where the optimizer steps the model's own parameters (fp32)."""
    opt = trainer.optimizer
    fp32 = getattr(opt, "fp32_params", None)
    if fp32 is None:
        return None
    trainable = [p for p in opt.fp16_params if p.requires_grad]
    where: dict[int, Any] = {}
    if opt.has_flat_params:  # one flat fp32 tensor per device, parameters in order (fairseq's sync)
        offsets: dict[Any, int] = {}
        for p in trainable:
            key = p.device.index if p.device.index in fp32 else next(iter(fp32))
            start = offsets.get(key, 0)
            where[id(p)] = (fp32[key], start, p.numel(), p.shape)
            offsets[key] = start + p.numel()

        def flat(p, grad: bool = False):
            if id(p) not in where:
                return None
            master, start, n, shape = where[id(p)]
            held = master.grad if grad else master.data
            return None if held is None else held[start:start + n].view(shape)
        return flat
    for p, p32 in zip(opt.fp16_params, fp32, strict=True):
        where[id(p)] = p32

    def each(p, grad: bool = False):
        if id(p) not in where:
            return None
        return where[id(p)].grad if grad else where[id(p)].data
    return each


def after_update(trainer) -> None:
    """The model's own step after each optimizer update, if it has one (nGPT renormalises its
    matrices), on the model's parameters and on the fp32 master copies the optimizer steps."""
    hook = getattr(trainer.get_model(), "after_update", None)
    if hook is None:
        return
    master = _masters(trainer)
    hook(None if master is None else lambda p: [t for t in [master(p)] if t is not None])


def updates_per_epoch(cfg) -> int:
    """Number of updates in one epoch of a fairseq config, per rank (the linear schedule needs the
    run's total)."""
    from fairseq import tasks

    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size, max_positions=(1024, 1024),
        ignore_invalid_inputs=True, required_batch_size_multiple=1, seed=cfg.common.seed)
    world = int(cfg.distributed_training.distributed_world_size)
    per_rank = math.ceil(len(itr) / max(world, 1))
    return math.ceil(per_rank / cfg.optimization.update_freq[0])


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


# fairseq-generate's batching flags as lnexp prints them. fairseq's default
# --required-batch-size-multiple 8 silently drops the last (n mod 8) sentences of a set: its
# batch_by_size (fairseq/data/data_utils.py) cuts the last batch to a multiple of 8 and then drops
# the rest, so every sentence only gets a hypothesis with a multiple of 1.
GENERATE_BATCH_MULTIPLE = 1
GENERATE_SEED = 1  # fairseq-generate's --seed: its batches are those of epoch 1 under this seed


def generate_batches(task, split: str, model, max_sentences: int, ids=None):
    """Batches of a split (or of its examples ``ids``) as ``fairseq-generate --batch-size
    max_sentences --required-batch-size-multiple 1`` forms them: fairseq's own order (sorted by
    source then target length, ties in the order of its seeded permutation), its size filter, its
    ``batch_by_size``; no shuffling. The length limit of a hypothesis depends on the longest source
    in its batch, so reproducing fairseq-generate's output needs its batches."""
    import numpy as np
    from fairseq import utils
    from fairseq.data import data_utils

    ds = task.dataset(split)
    with data_utils.numpy_seed(GENERATE_SEED + 1):  # get_batch_iterator's seed + epoch
        order = ds.ordered_indices()
    if ids is not None:
        keep = np.zeros(len(ds), dtype=bool)
        keep[np.fromiter(ids, dtype=np.int64)] = True
        order = order[keep[order]]
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    order = task.filter_indices_by_size(order, ds, max_positions, ignore_invalid_inputs=False)
    for batch in ds.batch_by_size(order, max_tokens=None, max_sentences=max_sentences,
                                  required_batch_size_multiple=GENERATE_BATCH_MULTIPLE):
        yield ds.collater([ds[int(i)] for i in batch])


def source_tokens(task, split: str, ids) -> int:
    """The source tokens of a split's examples ``ids`` (what decoding them costs, roughly)."""
    import numpy as np

    sizes = task.dataset(split).src_sizes
    return int(np.asarray(sizes)[np.fromiter(ids, dtype=np.int64)].sum())


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


# --- data-parallel runtime (lnexp.train.distributed) -------------------------------------------

TORCHRUN_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_DIST_KEYS = ("distributed_world_size", "distributed_rank", "distributed_backend",
              "distributed_init_method", "distributed_port", "device_id", "distributed_no_spawn",
              "distributed_num_procs")


def infer_init_method(cfg) -> str | None:
    """fairseq's ``infer_init_method`` on ``cfg.distributed_training``; returns how this process
    takes part: None (one process), "spawn" (start one worker per rank on this node, as fairseq
    does per GPU) or "member" (torchrun or SLURM started this process as one rank).

    On CPU fairseq's inference divides by the GPU count, so the same rules are applied here:
    torchrun's environment (env://), else a free port on this node.
    """
    from fairseq.distributed import utils as du

    dt = cfg.distributed_training
    if cfg.common.cpu and dt.distributed_init_method is None and dt.distributed_world_size > 1:
        if all(k in os.environ for k in TORCHRUN_ENV):
            dt.distributed_init_method = "env://"
            dt.distributed_world_size = int(os.environ["WORLD_SIZE"])
            dt.distributed_rank = int(os.environ["RANK"])
            dt.device_id = int(os.environ.get("LOCAL_RANK", 0))
            dt.distributed_no_spawn = True
        else:
            port = dt.distributed_port if dt.distributed_port > 0 else _free_port()
            dt.distributed_init_method = f"tcp://localhost:{port}"
    elif not cfg.common.cpu:
        du.infer_init_method(dt)
    if dt.distributed_init_method is None:
        return None
    return "member" if dt.distributed_no_spawn else "spawn"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def call_main(cfg, main, **kwargs) -> None:
    """fairseq's ``call_main`` once ``infer_init_method`` ran: ``main(cfg, **kwargs)`` in every
    rank after fairseq's ``distributed_init``. fairseq spawns min(GPUs, world size) workers, which
    is none on CPU; there, spawn world-size workers with fairseq's own ``distributed_main``."""
    import torch
    from fairseq.distributed import utils as du

    dt = cfg.distributed_training
    if cfg.common.cpu and dt.distributed_init_method is not None and not dt.distributed_no_spawn:
        kwargs["start_rank"] = dt.distributed_rank or 0
        dt.distributed_rank = None  # assigned per worker, as fairseq does
        torch.multiprocessing.spawn(fn=du.distributed_main, args=(main, cfg, kwargs),
                                    nprocs=dt.distributed_world_size, join=True)
    else:
        du.call_main(cfg, main, **kwargs)


def leave_process_group() -> None:
    """A rank that finished waits for the others, then tears the process group down itself: gloo's
    threads left to the interpreter's exit sometimes abort the process ("terminate called without
    an active exception": 1 in 8 runs of tests/test_distributed.py at 4544eb3, 2 in 9 at 960833b,
    none in 16 with this)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def adopt_distributed(cfg, dist) -> None:
    """Copy the rank, device and rendezvous that ``distributed_main`` set into a fresh config."""
    for key in _DIST_KEYS:
        cfg.distributed_training[key] = dist[key]


def is_master(cfg) -> bool:
    from fairseq.distributed import utils as du

    return du.is_master(cfg.distributed_training)


def broadcast_from_master(obj: Any) -> Any:
    """``obj`` of rank 0 on every rank (the others pass None and wait here); as is in one process."""
    import torch
    from fairseq.distributed import utils as du

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return obj
    return du.broadcast_object(obj, src_rank=0, group=du.get_global_group())


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


def checkpoint_state(trainer, extra_state: dict[str, Any]) -> dict | None:
    """What ``Trainer.save_checkpoint`` writes (fairseq's state dict with ``extra_state``), on the
    rank that saves; None on the others. lnexp writes it itself (``save_checkpoint_file`` through
    lnexp.rundir), so that a full disk is one clean error rather than fairseq's three retries and a
    temporary file left behind."""
    from fairseq import utils

    if not trainer.should_save_checkpoint_on_current_rank:
        return None
    state = utils.move_to_cpu(trainer.state_dict())
    state["extra_state"].update(extra_state)
    return state


class _WriteErrors:
    """A file's ``write`` that keeps the OSError it raised: torch's zip writer turns a failed write
    (a full disk) into its own RuntimeError (``unexpected pos ...``), losing the errno."""

    def __init__(self, f) -> None:
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint_file(state: dict, path: Path) -> None:
    """Write a checkpoint as fairseq writes it (``torch.save`` of the state); a write that fails
    (a full disk, a quota) is its OSError, which lnexp.rundir reports in one line."""
    import torch

    with open(path, "wb") as f:
        writer = _WriteErrors(f)
        try:
            torch.save(state, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise


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


def max_source_tokens(task, model) -> int:
    """The most source tokens (EOS included) the model reads: fairseq refuses a longer sentence."""
    from fairseq import utils

    limit = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    return int(limit[0] if isinstance(limit, tuple) else limit)


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


# --- stock fairseq, for side-by-side benchmarks (scripts/bench_train.py) ------------------------


def wrap_train_step(wrapper) -> None:
    """Route every update of fairseq's ``Trainer`` in this process, lnexp's and stock
    fairseq-train's alike, through ``wrapper(original, trainer, samples, ...)`` (a benchmark
    times each update of either entry point this way; it builds no trainer)."""
    import functools

    from fairseq.trainer import Trainer

    original = Trainer.train_step

    @functools.wraps(original)
    def train_step(self, samples, *args, **kwargs):
        return wrapper(original, self, samples, *args, **kwargs)

    Trainer.train_step = train_step


def run_stock_train(argv: list[str]) -> None:
    """``fairseq-train ARGV`` in this process: the console script's own function, unchanged."""
    import sys

    from fairseq_cli.train import cli_main

    sys.argv = ["fairseq-train", *argv]
    cli_main()
