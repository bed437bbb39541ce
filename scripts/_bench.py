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
# --quick / --tiny: the matmul peak's size on CPU, a figure the tests only read (2048: ~1 CPU s a
# matmul on one core, 512: ~0.01 s)
QUICK_PEAK_N = 512


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


# stock fairseq's settings of each precision, the candidates for its fastest correct one (the
# benchmarks time each and compare lnexp with the fastest whose updates stay finite: see
# docs/performance.md "Stock fairseq's half precision"); fairseq's flags added to the stock run
STOCK_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "fp32": {"fp32": {}},
    "fp16": {"--fp16": {},
             "--fp16 --memory-efficient-fp16": {"memory_efficient_fp16": True},
             "--amp": {"fp16": False, "amp": True}},
    "bf16": {"--bf16": {},
             "--bf16 --memory-efficient-bf16": {"memory_efficient_bf16": True}},
}


class Timed:
    """A training session stepped and timed update by update: ``lnexp.train.session.Session``
    (the path ``lnexp train`` builds, compiled layers and autocast included) with its step, so
    that what the benchmarks time is the real training path; update time and evaluation time
    can be taken apart."""

    def __init__(self, overrides: list[str], stock: dict[str, Any] | bool | None = None,
                 dist=None, resolved=None) -> None:
        """``stock``: build stock fairseq's equivalent run instead (settings.stock_flags), with
        these fairseq flags added (True: none, e.g. a STOCK_SETTINGS entry).
        ``dist``: this process is one rank of a data-parallel run (see ``data_parallel``), with
        ``resolved``, the config its launch resolved (settings.resolve)."""
        import torch

        from lnexp.train import speed
        from lnexp.train.session import Session

        self.overrides = list(overrides)
        self.cfg = cfg = compose_checked(overrides)
        # this run's torch threads (speed.gpu_threads on a GPU), set again before each of its
        # updates: runs interleaved in one process may ask for different counts
        self.threads = speed.threads(cfg)
        self.use_threads()
        extra = None if stock in (None, False) else ({} if stock is True else dict(stock))
        self.session = run = Session.build(cfg, dist=dist, resolved=resolved, stock=extra)
        self.task, self.model, self.trainer = run.task, run.model, run.trainer
        self.epoch_itr, self.fcfg, self.device = run.epoch_itr, run.fcfg, run.device
        self.precision, self.data = run.setup.precision, run.setup.data
        self.flags = run.setup.fairseq.flags
        self._update = run.step
        self._itr = None
        self._sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)

    def use_threads(self) -> None:
        import torch

        if self.threads and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    @property
    def updates_per_epoch(self) -> int:
        from lnexp import fairseq_adapter as fa

        return fa.updates_per_epoch(self.fcfg)

    def params(self) -> int:
        return self.session.params()

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

    def update(self, samples):
        """One update of the session's step (``lnexp train``'s): fairseq's statistics or None."""
        return self._update(self.trainer, samples)

    def step(self, count_flops: bool = False) -> tuple[float, float, float]:
        """One update, batch fetch included: (seconds, target tokens, FLOPs if counted else 0)."""
        self._sync()
        t = time.perf_counter()
        samples = self._next()
        if count_flops:
            with flop_counter() as fc:
                self.update(samples)
            flops = float(fc.get_total_flops())
        else:
            self.update(samples)
            flops = 0.0
        self._sync()
        return time.perf_counter() - t, target_tokens(samples), flops

    def run(self, warmup: int, updates: int, count_flops: int = 1, on_first=None) -> dict[str, Any]:
        """``warmup`` untimed updates (the first ``count_flops`` of them under FlopCounterMode),
        then ``updates`` timed ones: target tokens/s over the timed window (all ranks), FLOPs per
        token, fp16 overflows (skipped updates) and the final loss scale. ``on_first(self, step)``
        runs right after the first update (its gradients still there)."""
        meter = Meter(self)
        for i in range(max(warmup, 1)):
            meter.warm(i < count_flops, on_first if i == 0 else None)
        self._sync()
        t0 = time.perf_counter()
        for _ in range(updates):
            meter.timed(sync=False)
        self._sync()
        meter.seconds = time.perf_counter() - t0  # the window, device time included
        return meter.result()


class Meter:
    """Updates of one ``Timed`` run, counted: tokens, seconds, FLOPs, overflows, non-finite ones."""

    def __init__(self, run: Timed) -> None:
        self.run = run
        self.flops = self.ftok = self.tokens = self.seconds = 0.0
        self.overflows = self.updates = self.failed = 0
        self.losses: list[float] = []
        self.times: list[float] = []  # each timed update's seconds
        self.rates: list[float] = []  # ... and its target tokens/s

    def warm(self, count_flops: bool = False, on_first=None) -> None:
        """One untimed update (under FlopCounterMode if ``count_flops``)."""
        self.run.use_threads()
        samples = self.run._next()
        if count_flops:
            with flop_counter() as fc:
                step = self.run.update(samples)
            self.flops += fc.get_total_flops()
            self.ftok += target_tokens(samples)
        else:
            step = self.run.update(samples)
        if on_first is not None:
            on_first(self.run, step)
        self._count(step)

    def timed(self, sync: bool = True) -> float:
        """One timed update, device synchronised before and after (``sync=False``: the caller
        times a window of them); its seconds."""
        run = self.run
        run.use_threads()
        if sync:
            run._sync()
        t = time.perf_counter()
        samples = run._next()
        step = run.update(samples)
        if sync:
            run._sync()
        dt = time.perf_counter() - t
        self.seconds += dt
        self.times.append(dt)
        self.updates += 1
        if step and not step.get("overflow"):
            tokens = float(step["ntokens"])  # all ranks' target tokens (fairseq's wpb)
        else:
            tokens = target_tokens(samples) * run.trainer.data_parallel_world_size
        self.tokens += tokens
        self.rates.append(tokens / dt if dt > 0 else float("nan"))
        self._count(step)
        return dt

    def _count(self, step) -> None:
        if step is None:
            self.failed += 1
        elif step.get("overflow"):
            self.overflows += 1
        else:
            self.losses.append(float(step["loss"]))

    @property
    def correct(self) -> bool:
        """Every update finite, and at most a quarter of them skipped by the fp16 loss scaler."""
        import math

        n = len(self.losses) + self.overflows
        return (not self.failed and bool(self.losses) and all(map(math.isfinite, self.losses))
                and self.overflows <= max(1, n // 4))

    def result(self) -> dict[str, Any]:
        from lnexp import fairseq_adapter as fa

        dt = self.seconds
        return {"tokens": self.tokens, "seconds": dt, "tok_s": self.tokens / dt if dt else float("nan"),
                "tok_s_median": median(self.rates),
                "s_per_update": dt / self.updates if self.updates else float("nan"),
                "flops_per_token": self.flops / self.ftok if self.ftok else float("nan"),
                "overflows": self.overflows, "failed": self.failed, "correct": self.correct,
                "times": self.times,
                "loss_scale": fa.loss_scale(self.run.trainer),
                "world_size": self.run.trainer.data_parallel_world_size}


def interleaved(runs: dict[str, Timed], warmup: int, updates: int, on_first=None,
                counted: tuple[str, ...] = ("lnexp",)) -> dict[str, dict]:
    """Every run's ``warmup`` untimed updates (the first of each run in ``counted`` under
    FlopCounterMode, ``on_first`` after lnexp's), then ``updates`` timed rounds of one update each,
    the order reversed every other round. All runs have the same seed and data, so they meet the
    same batch shapes: run one after another, the first would pay every new shape's first-use cost
    (kernel loading, plans) and the second none, which is how stock fairseq's half precision came
    out at a quarter of its fp32 on the H200 (docs/performance.md); round for round they share it.
    Each result keeps its per-round seconds (``times``), for ratios paired by round."""
    meters = {k: Meter(r) for k, r in runs.items()}
    for i in range(max(warmup, 1)):
        for k, m in meters.items():
            m.warm(count_flops=i == 0 and k in counted,
                   on_first=on_first if i == 0 and k == "lnexp" else None)
    order = list(meters.values())
    for i in range(updates):
        for m in order if i % 2 == 0 else order[::-1]:
            m.timed()
    out = {}
    for k, m in meters.items():
        out[k] = m.result()
        out[k]["params"] = m.run.params()
    return out


def fastest_correct(results: dict[str, dict]) -> tuple[str, dict]:
    """Stock fairseq's fastest setting whose updates stayed finite (Meter.correct); if none
    did, the fastest, named so."""
    correct = {k: v for k, v in results.items() if v["correct"]}
    pool = correct or results
    label = max(pool, key=lambda k: pool[k]["tok_s"])
    return (label if correct else f"{label} (none correct)"), pool[label]


def paired_ratio(base: dict, other: dict) -> float:
    """``other``'s speed over ``base``'s, paired by round (both met the same batch in each round of
    ``interleaved``): the median over rounds of base's seconds / other's."""
    pairs = [tb / to for tb, to in zip(base["times"], other["times"], strict=True) if to > 0]
    return median(pairs)


def compose_checked(overrides: list[str]):
    """lnexp's train config with these overrides, checked as ``lnexp train`` checks it."""
    from lnexp import config

    return config.compose(overrides)


def data_parallel(overrides: list[str], warmup: int, updates: int, out: Path) -> dict[str, Any]:
    """``Timed.run`` in every rank of a data-parallel run (``distributed.world_size`` in
    ``overrides``), started as ``lnexp train`` starts one (lnexp.train.distributed.launch:
    fairseq's infer_init_method and call_main); rank 0's result, tokens counted over all ranks."""
    import functools
    import json
    import tempfile

    from lnexp.train import distributed

    cfg = compose_checked(overrides)
    if int(cfg.distributed.world_size) < 2:
        raise ValueError("data_parallel needs distributed.world_size > 1")
    out.unlink(missing_ok=True)
    body = functools.partial(_rank_run, overrides=overrides, warmup=warmup, updates=updates,
                             out=str(out))
    with tempfile.TemporaryDirectory(prefix="lnexp-bench-dp-") as run_dir:
        distributed.launch(cfg, Path(run_dir), body)
    return json.loads(out.read_text())


def _rank_run(cfg, run_dir: Path, dist, resolved, overrides: list[str], warmup: int, updates: int,
              out: str) -> dict[str, Any]:
    """One rank of ``data_parallel`` (lnexp.train.distributed's body)."""
    import json

    run = Timed(overrides, dist=dist, resolved=resolved)
    res = run.run(warmup, updates, count_flops=0)
    if run.session.setup.master:
        res["params"] = run.params()
        Path(out).write_text(json.dumps(res))
    return res


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
