"""Shared helpers of the benchmark scripts: machine load, matmul peak, lnexp configs, tables.

Everything heavy (torch, fairseq, hydra) is imported inside the functions that need it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# model name on the command line -> lnexp architecture (stock equivalents: settings.stock_flags)
ARCHS = {"mini": "ln_transformer_mini", "iwslt": "ln_transformer_iwslt_de_en"}
# --quick / --tiny: the shipped data's first pairs, 2+2 layers of the mini model, small batches
# stock fairseq's schedule (warm-up then inverse-sqrt), so that every placement has the same one
# and Post-/Pre-LN have a stock equivalent (Pre-LN's default recipe, step, has none)
STOCK_SCHEDULE = "schedule=inverse_sqrt"
QUICK_OVERRIDES = ["depth.encoder_layers=2", "depth.decoder_layers=2", "scale.max_tokens=512"]


def machine_line() -> str:
    """Date, load average, CPU and torch threads: printed above every table."""
    import torch

    from lnexp.runtime.host import cpu_model

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cpu = cpu_model()
    return (f"# {time.strftime('%Y-%m-%d %H:%M')} | load avg (1/5/15 min) {load} | {os.cpu_count()} CPUs "
            f"({cpu}) | torch {torch.__version__}, {torch.get_num_threads()} threads")


def load_now() -> float:
    return os.getloadavg()[0]


def matmul_peak(n: int = 2048, dtype: str = "float32", device: str = "cpu", reps: int = 10,
                seconds: float = 0.0) -> float:
    """Best-of-``reps`` FLOP/s of an n x n x n matrix multiply (2 n^3 FLOPs) with torch's threads."""
    import torch

    dt = getattr(torch, dtype)
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best = float("inf")
    inner = 10 if device == "cuda" else 1
    end = time.perf_counter() + seconds
    i = 0
    while i < reps or time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(inner):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - t) / inner)
        i += 1
    return 2 * n ** 3 / best


def compose(overrides: list[str]):
    """lnexp's train config with these overrides (as ``lnexp train`` composes it), resolved."""
    from lnexp import config

    return config.compose(overrides, check=False)


def flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


class LnexpTrainer:
    """lnexp's training path in-process: config -> fairseq flags -> Trainer, batches, updates.

    The same adapter calls as ``lnexp.train.loop.train_run`` (settings.fairseq_config,
    fa.build_trainer, fa.epoch_iterator (with Admin's pass), fa.grouped,
    fa.train_step), without its logging, so update time and evaluation time can be taken apart.
    """

    def __init__(self, overrides: list[str], stock: bool = False, compile_layers: bool = False,
                 dist=None) -> None:
        """``stock``: build the same run as stock fairseq's ``transformer`` (settings.stock_flags).
        ``compile_layers``: wrap every encoder/decoder layer in torch.compile (dynamic shapes); the
        first updates then include compilation, so give them as untimed warm-up.
        ``dist``: this process is one rank of a data-parallel run (see ``data_parallel``)."""
        import torch

        from lnexp import config
        from lnexp import fairseq_adapter as fa
        from lnexp.data.registry import load_for_training
        from lnexp.train import settings

        self.cfg = cfg = config.compose(overrides)
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        self.data = load_for_training(cfg.dataset)
        self.device = settings.resolve_device(cfg)
        self.updates_per_epoch = fa.updates_per_epoch(
            settings.fairseq_config(cfg, self.device, 1).config)
        flags = settings.fairseq_flags(cfg, self.updates_per_epoch, self.device)
        if stock:
            flags = settings.stock_flags(flags)
            if flags is None:
                raise ValueError(f"{cfg.placement.name} has no stock fairseq equivalent")
        flags.update(save_dir="/nonexistent/lnexp-bench", no_progress_bar=True,
                     disable_validation=True, no_epoch_checkpoints=True)
        self.flags = flags
        self.fcfg = fa.fairseq_config(self.data.bin_dir, flags)
        if dist is not None:
            fa.adopt_distributed(self.fcfg, dist)
        self.task, self.model, _, self.trainer = fa.build_trainer(self.fcfg)
        from lnexp.train import precision, speed

        settings_ = speed.Speed.of(cfg)
        self.precision = precision.resolve(str(cfg.precision), self.device, half=settings_.half)
        context = precision.forward_context(self.precision)
        if context is not None:  # as lnexp.train.loop.Training does
            fa.autocast_forward(self.trainer, context)
        _, self.epoch_itr, _ = fa.epoch_iterator(self.fcfg, self.trainer, None, self.task)
        # the update as lnexp.train.loop makes it (speed.*); stock fairseq's own update for --stock
        self._update = fa.train_step if stock else speed.make_step(
            self.trainer, self.model, settings_, self.device, False, int(self.fcfg.dataset.max_tokens))
        if compile_layers:
            torch._dynamo.config.recompile_limit = 64  # one code object, 12 layer instances
            for layer in [*self.model.encoder.layers, *self.model.decoder.layers]:
                layer.compile(dynamic=True)
        self._itr = None
        self._sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)

    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def _next(self):
        from lnexp import fairseq_adapter as fa

        while True:
            if self._itr is None:
                itr = self.epoch_itr.next_epoch_itr(fix_batches_to_gpus=False, shuffle=True)
                self.trainer.begin_epoch(self.epoch_itr.epoch)
                self._itr = iter(fa.grouped(itr, self.fcfg))
            try:
                return next(self._itr)
            except StopIteration:
                self._itr = None

    def step(self, count_flops: bool = False) -> tuple[float, float, float]:
        """One update, batch fetch included: (seconds, target tokens, FLOPs if counted else 0)."""

        self._sync()
        t = time.perf_counter()
        samples = self._next()
        if count_flops:
            with flop_counter() as fc:
                self._update(self.trainer, samples)
            flops = float(fc.get_total_flops())
        else:
            self._update(self.trainer, samples)
            flops = 0.0
        self._sync()
        return time.perf_counter() - t, target_tokens(samples), flops

    def run(self, warmup: int, updates: int, count_flops: int = 1, on_first=None) -> dict[str, Any]:
        """``warmup`` untimed updates (the first ``count_flops`` of them under FlopCounterMode),
        then ``updates`` timed ones: target tokens/s over the timed window (all ranks), FLOPs per
        token, fp16 overflows (skipped updates) and the final loss scale. ``on_first(self, step)``
        runs right after the first update (its gradients still there)."""
        import torch

        from lnexp import fairseq_adapter as fa

        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        flops = ftok = 0.0
        overflows = 0
        for i in range(max(warmup, 1)):
            samples = self._next()
            if i < count_flops:
                with flop_counter() as fc:
                    step = self._update(self.trainer, samples)
                flops += fc.get_total_flops()
                ftok += target_tokens(samples)
            else:
                step = self._update(self.trainer, samples)
            if i == 0 and on_first is not None:
                on_first(self, step)
            overflows += bool(step and step.get("overflow"))
        sync()
        t0 = time.perf_counter()
        tokens = 0.0
        world = self.trainer.data_parallel_world_size
        for _ in range(updates):
            samples = self._next()
            step = self._update(self.trainer, samples)
            if step and not step.get("overflow"):
                tokens += step["ntokens"]  # all ranks' target tokens (fairseq's wpb)
            else:
                tokens += target_tokens(samples) * world
                overflows += bool(step)
        sync()
        dt = time.perf_counter() - t0
        return {"tokens": tokens, "seconds": dt, "tok_s": tokens / dt, "s_per_update": dt / updates,
                "flops_per_token": flops / ftok if ftok else float("nan"), "overflows": overflows,
                "loss_scale": fa.loss_scale(self.trainer), "world_size": world}


def data_parallel(overrides: list[str], warmup: int, updates: int, out: Path) -> dict[str, Any]:
    """``LnexpTrainer.run`` in every rank of a data-parallel run (``distributed.world_size`` in
    ``overrides``), started as ``lnexp train`` starts one (fairseq's infer_init_method and
    call_main); rank 0's result, tokens counted over all ranks."""
    import json

    from lnexp import fairseq_adapter as fa
    from lnexp.train import settings

    cfg = compose(overrides)
    device = settings.resolve_device(cfg)
    fcfg = settings.fairseq_config(cfg, device, 1).config
    if fa.infer_init_method(fcfg) is None:
        raise ValueError("data_parallel needs distributed.world_size > 1")
    out.unlink(missing_ok=True)
    fa.call_main(fcfg, _rank_run, overrides=overrides, warmup=warmup, updates=updates,
                 out=str(out))
    return json.loads(out.read_text())


def _rank_run(fcfg, overrides: list[str], warmup: int, updates: int, out: str, **_) -> None:
    import json

    from lnexp import fairseq_adapter as fa

    run = LnexpTrainer(overrides, dist=fcfg.distributed_training)
    res = run.run(warmup, updates, count_flops=0)
    if fa.is_master(run.fcfg):
        res["params"] = run.params()
        Path(out).write_text(json.dumps(res))


def target_tokens(samples) -> float:
    return float(sum(s.get("ntokens", 0) for s in samples if s))


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain fixed-width table (first column left-aligned, the rest right-aligned)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()

    out = [line(cells[0]), line(["-" * w for w in widths])]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if x != x:
            return "-"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        return f"{x:.3f}"
    return str(x)


def add_data_args(p) -> None:
    """The data options every benchmark takes (a small corpus for tests)."""
    p.add_argument("--dataset-dir", default=None, help="raw Multi30k-layout data (dataset.dir)")
    p.add_argument("--vocab-size", type=int, default=None, help="dataset.vocab_size override")


def data_overrides(args) -> list[str]:
    """Hydra overrides for ``add_data_args``'s options."""
    over = []
    if args.dataset_dir:
        over.append(f"dataset.dir={args.dataset_dir}")
    if args.vocab_size:
        over.append(f"dataset.vocab_size={args.vocab_size}")
    return over
