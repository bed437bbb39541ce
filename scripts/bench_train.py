#!/usr/bin/env python
"""Training throughput of lnexp against stock fairseq-train, measured side by side.

    python scripts/bench_train.py                       # mini and IWSLT models, 3 repetitions
    python scripts/bench_train.py --models mini --reps 5 --updates 40
    python scripts/bench_train.py --quick               # tiny model, seconds (used by the tests)
    python scripts/bench_train.py --interleaved --compile --models mini   # + torch.compile'd layers
    python scripts/bench_train.py --interleaved --fast bf16,compiled,bf16+compiled --no-stock
                                                        # fp32 (today's default) vs each fast path
    python scripts/bench_train.py --interleaved --placements all --threads 1  # every scheme vs Pre-LN

Each measurement is a fresh subprocess running the real entry point with identical settings:
``fairseq-train <bin> <flags>`` (fairseq_cli.train.cli_main, the console script's function) for
stock, ``lnexp train <overrides>`` (lnexp.cli.main) for lnexp. Both get the same hook on fairseq's
``Trainer.train_step`` that notes the time after every update and the update's target tokens;
tokens/s = target tokens of updates W+1..W+N / time from the end of update W to the end of update
W+N, so everything each loop does between updates (batching, logging, TensorBoard) is counted.
The first update also runs under torch's FlopCounterMode (untimed): model FLOPs per target token.
Runs alternate stock/lnexp (ABAB, the order reversed every other repetition), so the ratios are
paired measurements under the same machine load; the table gives medians over repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

PAIRS = ("post_ln", "pre_ln")  # placements with an exact stock fairseq equivalent
RATIOS = [  # (label, numerator run, denominator run, target)
    ("lnexp/stock post_ln", ("lnexp", "post_ln"), ("stock", "post_ln"), 0.98),
    ("lnexp/stock pre_ln", ("lnexp", "pre_ln"), ("stock", "pre_ln"), 0.98),
    ("peri_ln/pre_ln (lnexp)", ("lnexp", "peri_ln"), ("lnexp", "pre_ln"), 0.92),
    ("deepnorm/post_ln (lnexp)", ("lnexp", "deepnorm"), ("lnexp", "post_ln"), None),
    ("compiled/eager post_ln", ("compiled", "post_ln"), ("lnexp", "post_ln"), None),
    ("compiled/eager pre_ln", ("compiled", "pre_ln"), ("lnexp", "pre_ln"), None),
]
# fast paths against the default fp32 lnexp run (--fast): run kind -> extra overrides, compiled?
FAST = {"bf16": ["precision=bf16"], "compiled": ["compile=true"],
        "bf16+compiled": ["precision=bf16", "compile=true"],
        # issue 44's speed settings, each against the default run (speed.syncs=fewer, fairseq's Adam)
        "syncs_every": ["speed.syncs=every"], "adam_foreach": ["speed.adam=foreach"],
        "adam_fused": ["speed.adam=fused"]}
KINDS = ("stock", "lnexp", *FAST)
# every other scheme against Pre-LN (lnexp both): a scheme under this ratio at the IWSLT size says
# where its time goes (#19; docs/performance.md)
ZOO_FLOOR = 0.8
LOG_INTERVAL = 10


# --- child processes ---------------------------------------------------------------------------


def child(kind: str, spec_path: str) -> None:
    """Run one training with the timing hook, write the measurements to spec['out'], exit."""
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(int(spec["threads"]))
    from lnexp import fairseq_adapter as fa

    warmup, updates = int(spec["warmup"]), int(spec["updates"])
    total = warmup + updates
    rec: list[tuple[float, float]] = []
    flops: list[tuple[float, float]] = []
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def finish(trainer) -> None:
        t = [r[0] for r in rec]
        tokens = sum(r[1] for r in rec[warmup:total])
        out = {"kind": kind, "tokens": tokens, "seconds": t[total - 1] - t[warmup - 1],
               "updates": updates,
               "threads": torch.get_num_threads(), "flops": flops,
               "params": sum(p.numel() for p in trainer.model.parameters())}
        out["tok_s"] = tokens / out["seconds"]
        if kind == "lnexp":  # what one of lnexp's mid-epoch checkpoints costs
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                trainer.consolidate_optimizer()
                trainer.save_checkpoint(os.path.join(d, "c.pt"), {})
                out["checkpoint_s"] = time.perf_counter() - t0
        Path(spec["out"]).write_text(json.dumps(out))

    def timed_step(original, self, samples, *args, **kwargs):
        ntok = B.target_tokens(samples)
        if not rec:  # the first update (untimed): model FLOPs of one training step
            with B.flop_counter() as fc:
                result = original(self, samples, *args, **kwargs)
            flops.append((fc.get_total_flops(), ntok))
        else:
            result = original(self, samples, *args, **kwargs)
        sync()
        rec.append((time.perf_counter(), ntok))
        if len(rec) == total:
            finish(self)
            if kind == "lnexp":  # skip the end-of-run validation and BLEU: not part of updates
                sys.stdout.flush()
                os._exit(0)
        return result

    fa.wrap_train_step(timed_step)  # fairseq's Trainer.train_step, in both entry points
    if kind == "stock":
        fa.run_stock_train(spec["argv"])
    else:
        from lnexp.cli import main
        from lnexp.config import hide_fairseq_schemas

        hide_fairseq_schemas()  # imported fairseq first (the hook): keep lnexp's compose working

        sys.exit(main(["train", *spec["argv"]]))


def run_child(kind: str, argv: list[str], warmup: int, updates: int, threads: int,
              workdir: Path, env: dict[str, str]) -> dict:
    out = workdir / f"{kind}-{time.monotonic_ns()}.json"
    spec = workdir / (out.stem + ".spec.json")
    spec.write_text(json.dumps({"argv": argv, "warmup": warmup, "updates": updates,
                                "threads": threads, "out": str(out)}))
    load0 = B.load_now()
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--spec", str(spec)],
                          capture_output=True, text=True, env=env, cwd=B.REPO)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{kind} run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-4000:]}")
    res = json.loads(out.read_text())
    res["load"] = (load0 + B.load_now()) / 2
    res["fairseq_wps"] = _fairseq_wps(proc.stdout + proc.stderr)
    return res


def _fairseq_wps(log: str) -> float:
    """Stock fairseq's own wps (train_inner lines after the first, which includes warm-up)."""
    wps = []
    for line in log.splitlines():
        if "| train_inner |" in line:
            wps.append(float(json.loads(line.split("| train_inner |", 1)[1])["wps"]))
    return B.median(wps[1:]) if len(wps) > 1 else float("nan")


# --- parent ------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mini,iwslt", help="comma list of: " + ",".join(B.ARCHS))
    p.add_argument("--placements", default="post_ln,pre_ln,peri_ln,deepnorm",
                   help="comma list, or all (every configs/placement/*.yaml)")
    p.add_argument("--updates", type=int, default=None,
                   help="timed updates per run (default: mini 30, iwslt 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed updates before the window")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="tokens per batch (scale.max_tokens; 0 = the scale's)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--quick", action="store_true",
                   help="tiny 2+2-layer mini model, small batches, 1 repetition (for tests)")
    B.add_data_args(p)
    p.add_argument("--interleaved", action="store_true",
                   help="one process, updates round-robin across all runs (robust under load; "
                        "model and Trainer cost only, lnexp's loop bookkeeping timed separately)")
    p.add_argument("--compile", action="store_true",
                   help="with --interleaved: also run lnexp with each encoder/decoder layer under "
                        "torch.compile (inductor, dynamic shapes), to see whether fusing the "
                        "element-wise ops and dropout pays on this machine")
    p.add_argument("--fast", default="",
                   help="with --interleaved: comma list of fast paths to run against the default "
                        "fp32 lnexp run, round for round: " + ", ".join(FAST) + " (bf16: CPU "
                        "autocast, lnexp/train/precision.py; compiled: every layer torch.compile'd)")
    p.add_argument("--override", action="append", default=[],
                   help="an lnexp override for every lnexp run (repeatable), e.g. norm=dyt")
    p.add_argument("--no-stock", action="store_true",
                   help="leave out the stock fairseq-train runs (fast paths only)")
    p.add_argument("--child", choices=("stock", "lnexp"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.spec)
        return
    fast = [f.strip() for f in args.fast.split(",") if f.strip()]
    if args.compile and "compiled" not in fast:
        fast.append("compiled")
    if fast and not args.interleaved:
        p.error("--fast/--compile compare paths in one process, round for round: add --interleaved")
    if any(f not in FAST for f in fast):
        p.error(f"--fast takes a comma list of: {', '.join(FAST)}")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    placements = [x.strip() for x in args.placements.split(",") if x.strip()]
    if placements == ["all"]:
        from lnexp.names import PLACEMENTS

        placements = list(PLACEMENTS)
    extra = [f"threads={threads}", f"precision={args.precision}", "seed=1"]
    extra += B.data_overrides(args)
    extra += args.override
    if args.override and not args.no_stock:
        p.error("--override changes lnexp's runs only: add --no-stock")
    if args.max_tokens:
        extra.append(f"scale.max_tokens={args.max_tokens}")
    peak_reps = 10  # matmuls of the peak's best-of (--quick: 1, a figure the tests only read)
    peak_n = 2048  # its size (--quick: B.QUICK_PEAK_N)
    if args.quick:
        extra += B.QUICK_OVERRIDES
        args.reps = 1 if args.reps == 3 else args.reps
        peak_reps, peak_n = 1, B.QUICK_PEAK_N
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}

    print(B.machine_line())
    peak0 = B.matmul_peak(peak_n, "float32", reps=peak_reps)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[tuple[str, str, str], list[dict]] = {}
    commands: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory(prefix="lnexp-bench-") as tmp:
        work = Path(tmp)
        for model in models:
            updates = args.updates or (4 if args.quick else {"mini": 30}.get(model, 10))
            warmup = 1 if args.quick else args.warmup
            total = warmup + updates
            runs = _runs_for(model, placements, extra, total, work, device, commands,
                             with_stock=not args.no_stock)
            if args.interleaved:
                for f in fast:
                    runs += [(f, p, [*argv, *FAST[f]]) for kind, p, argv in runs if kind == "lnexp"]
                results.update(interleaved(model, runs, warmup, updates))
                continue
            for rep in range(args.reps):
                order = runs if rep % 2 == 0 else runs[::-1]
                for kind, placement, argv in order:
                    res = run_child(kind, argv, warmup, updates, threads, work, env)
                    results.setdefault((model, placement, kind), []).append(res)
                    print(f"  {model:5} {placement:8} {kind:5} rep {rep + 1}: {res['tok_s']:8.0f} "
                          f"tok/s (load {res['load']:.2f})", file=sys.stderr, flush=True)
    peak1 = B.matmul_peak(peak_n, "float32", reps=peak_reps)
    peak = max(peak0, peak1)
    peaks = {"fp32": peak}
    if device == "cuda":
        peaks["bf16"] = B.matmul_peak(4096, "bfloat16", "cuda")
        peaks["fp32"] = B.matmul_peak(4096, "float32", "cuda")
    report(results, commands, models, placements, peaks, args, threads, device, peak_reps,
           4096 if device == "cuda" else peak_n)


def _runs_for(model: str, placements: list[str], extra: list[str], total: int, work: Path,
              device: str, commands: dict, with_stock: bool = True) -> list[tuple[str, str, list[str]]]:
    """[(kind, placement, argv)] in ABAB order: stock then lnexp for Post-/Pre-LN, then the rest
    (``with_stock=False``: lnexp's runs only)."""
    from lnexp.data.registry import load_for_training
    from lnexp.fairseq_adapter import flags_to_argv
    from lnexp.train import settings

    runs = []
    for placement in placements:
        over = [f"placement={placement}", B.STOCK_SCHEDULE, f"scale.arch={B.ARCHS[model]}",
                f"max_update={total}", "eval.subset=1", f"runs_root={work / 'runs'}", *extra]
        if with_stock and placement in PAIRS:
            cfg = B.compose(over)
            data = load_for_training(cfg.dataset)
            stock = settings.stock_flags(settings.resolve(cfg, device).flags)
            assert stock is not None, f"{placement} has no stock fairseq equivalent"
            stock.update(max_update=total, log_format="json", log_interval=LOG_INTERVAL,
                         disable_validation=True, no_save=True, save_dir=str(work / "stock"))
            argv = flags_to_argv(data.bin_dir, stock)
            commands[(model, placement)] = shlex.join(["fairseq-train", *argv])
            runs.append(("stock", placement, argv))
        runs.append(("lnexp", placement, over))
    return runs


def interleaved(model: str, runs, warmup: int, updates: int) -> dict:
    """All runs' trainers in this process, one update of each in turn (order reversed every other
    round); every timed round is one paired sample. Same seed and data: the same batches."""
    trainers = [(kind, placement, B.Timed(argv if kind != "stock" else _lnexp_argv(runs, placement),
                                          stock=kind == "stock"))
                for kind, placement, argv in runs]
    for kind, placement, tr in trainers:
        print(f"  {model} {placement} {kind}: precision {tr.precision.why}", file=sys.stderr, flush=True)
    out: dict = {}
    flops: dict = {}
    for i in range(warmup + updates):
        order = trainers if i % 2 == 0 else trainers[::-1]
        for kind, placement, tr in order:
            load0 = B.load_now()
            dt, ntok, fl = tr.step(count_flops=i == 0)
            if i == 0:
                flops[(kind, placement)] = [(fl, ntok)]
            if i >= warmup:
                out.setdefault((model, placement, kind), []).append({
                    "tok_s": ntok / dt, "seconds": dt, "updates": 1, "tokens": ntok,
                    "flops": flops[(kind, placement)], "load": load0, "fairseq_wps": float("nan")})
        print(f"  {model} round {i + 1}/{warmup + updates}" + (" (warm-up)" if i < warmup else ""),
              file=sys.stderr, flush=True)
    return out


def _lnexp_argv(runs, placement: str) -> list[str]:
    return next(argv for kind, p, argv in runs if kind == "lnexp" and p == placement)


def loop_bookkeeping_s(n: int = 300) -> float:
    """Seconds per update of lnexp's per-update logging (RunLog.update: the row + 4 TensorBoard
    scalars), which the interleaved mode does not run."""
    from lnexp.rundir import run_paths
    from lnexp.train.runlog import RunLog

    with tempfile.TemporaryDirectory() as d:
        log = RunLog(run_paths(Path(d)), 0)
        t = time.perf_counter()
        for i in range(n):
            log.update({"update": i + 1, "epoch": 1, "lr": 1e-3, "loss": 5.0, "nll_loss": 4.0,
                        "gnorm": 1.0, "ntokens": 4000.0, "sample_size": 4000.0})
        dt = (time.perf_counter() - t) / n
        log.close()
    return dt


def fast_table(results, models, placements) -> None:
    """updates/s of the default fp32 lnexp run and of each fast path, and their paired ratio per
    round (the same batch in the same round: the ratio of updates/s is that of tokens/s)."""
    rows = []
    for model in models:
        for placement in placements:
            base = results.get((model, placement, "lnexp"))
            for kind in FAST:
                rs = results.get((model, placement, kind))
                if not rs or not base:
                    continue
                paired = [y["seconds"] / x["seconds"] for x, y in zip(rs, base, strict=False)]
                q = statistics.quantiles(paired, n=4) if len(paired) > 2 else [min(paired), 0, max(paired)]
                goal = FAST_GOAL.get(model)
                rows.append([model, placement, kind, 1 / B.median([r["seconds"] for r in base]),
                             1 / B.median([r["seconds"] for r in rs]), B.median(paired),
                             f"{q[0]:.2f}-{q[2]:.2f}", len(paired),
                             "-" if goal is None else f">= {goal}"])
    if rows:
        print()
        print("Fast paths against the default fp32 path (interleaved: paired per round)")
        print(B.table(["model", "placement", "path", "fp32 updates/s", "path updates/s",
                       "path/fp32 (median of rounds)", "quartiles", "rounds", "goal (AMX CPU)"],
                      rows))


# issue 31's goal: 2x updates/s at the mini 6+6 model on a CPU with AMX
FAST_GOAL = {"mini": 2.0}


def report(results, commands, models, placements, peaks, args, threads, device,
           peak_reps: int = 10, peak_n: int = 2048) -> None:
    peak = peaks["fp32" if args.precision == "fp32" else "bf16"]
    print(f"# peak: {args.precision if device == 'cuda' else 'fp32'} matmul {peak_n}x{peak_n}, "
          f"{threads} threads: {peak / 1e9:.1f} GFLOP/s (best of {peak_reps}, before and after "
          "the runs)"
          + (f"; bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s" if "bf16" in peaks else ""))
    print()
    rows = []
    for model in models:
        for placement in placements:
            for kind in KINDS:
                rs = results.get((model, placement, kind))
                if not rs:
                    continue
                tok_s = B.median([r["tok_s"] for r in rs])
                fpt = B.median([f / n for r in rs for f, n in r["flops"] if n])
                rows.append([model, placement, kind, len(rs), tok_s, min(r["tok_s"] for r in rs),
                             max(r["tok_s"] for r in rs), B.median([r["fairseq_wps"] for r in rs]),
                             fpt / 1e6, tok_s * fpt / 1e9, tok_s * fpt / peak,
                             B.median([r["load"] for r in rs])])
    if args.interleaved:
        print("Target tokens/s (interleaved in one process: median over timed updates, each run's "
              "updates alternating round-robin; reps = timed updates)")
    else:
        print("Target tokens/s (median over repetitions, each a fresh process; window: updates "
              "after the warm-up)")
    print(B.table(["model", "placement", "impl", "reps", "tok/s", "min", "max", "fairseq log wps",
                   "MFLOP/tok", "GFLOP/s", "of peak", "load"], rows))
    print()
    rows = []
    zoo = [(f"{p}/pre_ln (lnexp)", ("lnexp", p), ("lnexp", "pre_ln"), ZOO_FLOOR)
           for p in placements if p not in ("pre_ln", "peri_ln")]
    for model in models:
        for label, num, den, target in RATIOS + zoo:
            a = results.get((model, num[1], num[0]))
            b = results.get((model, den[1], den[0]))
            if not a or not b:
                continue
            paired = [x["tok_s"] / y["tok_s"] for x, y in zip(a, b, strict=False)]
            r = B.median(paired)
            ok = "-" if target is None else ("yes" if r >= target else "NO")
            if len(paired) <= 6:
                spread = " ".join(f"{x:.3f}" for x in paired)
            else:
                q = statistics.quantiles(paired, n=4)
                spread = f"n={len(paired)}, quartiles {q[0]:.3f}-{q[2]:.3f}"
            rows.append([model, label, r, spread,
                         "-" if target is None else f">= {target}", ok])
    print("Ratios of tokens/s (median of paired ratios: per repetition, or per round if interleaved)")
    print(B.table(["model", "ratio", "median", "per repetition (or spread)", "target", "met"], rows))
    fast_table(results, models, placements)
    ck = [(m, B.median([r["checkpoint_s"] for p in placements
                        for r in results.get((m, p, "lnexp"), []) if "checkpoint_s" in r]))
          for m in models]
    print()
    for m, s in ck:
        lnexp_post = results.get((m, "post_ln", "lnexp")) or results.get((m, placements[0], "lnexp"))
        if not lnexp_post or s != s:
            continue
        per_update = B.median([r["seconds"] / r["updates"] for r in lnexp_post])
        share = f" = {s / (50 * per_update):.2%} of 50 updates"
        print(f"# {m}: one lnexp mid-epoch checkpoint (every save_interval_updates=50) takes "
              f"{s:.2f} s{share}; stock fairseq-train saves at epoch ends only")
    if args.interleaved:
        book = loop_bookkeeping_s()
        for m in models:
            rs = results.get((m, "post_ln", "lnexp")) or results.get((m, placements[0], "lnexp"))
            if rs:
                per = B.median([r["seconds"] for r in rs])
                print(f"# {m}: lnexp's per-update logging (RunLog.update, not in the interleaved "
                      f"loop) {book * 1e3:.2f} ms = {book / per:.3%} of an update")
    print()
    if args.no_stock:
        return
    print("Stock commands (the lnexp run uses the same settings via `lnexp train`):")
    for (model, placement), cmd in commands.items():
        print(f"  [{model} {placement}] {cmd}")


if __name__ == "__main__":
    main()
