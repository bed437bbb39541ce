#!/usr/bin/env python
"""How many training runs pay on one GPU: aggregate tokens/s of N concurrent runs against one.

    python scripts/gpu_share.py                          # paper IWSLT model and mini, N = 1, 4, 8
    python scripts/gpu_share.py --models iwslt --concurrency 1,2,4,8,16 --updates 40
    python scripts/gpu_share.py --tiny                   # CPU: 2+2-layer mini model, N = 1, 2

Each of the N runs is its own process (as joblib's workers of a sweep are: ``hydra/launcher=joblib
hydra.launcher.n_jobs=N``), building lnexp's training path in-process (config -> fairseq flags ->
Trainer; scripts/_bench.py), Pre-LN, seed = its index. All N do ``--warmup`` untimed updates, wait
at one barrier, then ``--updates`` timed ones (device synchronised). Aggregate tokens/s = all runs'
target tokens over the span from the barrier to the last run's end; ``x one run`` = that over the
N = 1 row of the same model: above 1 the GPU has room for more runs, and the largest N before it
stops growing is how many jobs a sweep should run at once. ``--out DIR`` writes gpu_share.csv/json.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

NAN = float("nan")


def worker(overrides: list[str], warmup: int, updates: int, barrier, results) -> None:
    """One run: set up and warm up, wait for the others, then the timed updates."""
    import torch

    try:
        run = B.Timed(overrides)
        for _ in range(max(warmup, 1)):
            run.update(run._next())
        run._sync()
        barrier.wait()
        t0 = time.time()
        tokens = 0.0
        for _ in range(updates):
            samples = run._next()
            run.update(samples)
            tokens += B.target_tokens(samples)
        run._sync()
        mem = torch.cuda.max_memory_allocated() / 2**30 if run.device == "cuda" else NAN
        results.put({"t0": t0, "t1": time.time(), "tokens": tokens, "max_mem_gib": mem})
    except Exception as e:  # noqa: BLE001  (reported in the table; the barrier must not hang)
        barrier.abort()
        results.put({"error": f"{type(e).__name__}: {e}"})


def measure(overrides: list[str], n: int, warmup: int, updates: int, timeout: float) -> dict:
    """N concurrent runs: spawned processes on a GPU (CUDA needs them fresh), forked ones on CPU
    (they inherit the parent's imports: ``--tiny`` stays quick)."""
    ctx = mp.get_context("spawn" if "device=cuda" in overrides else "fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=worker, args=([*overrides, f"seed={i + 1}"], warmup, updates, barrier,
                                              results)) for i in range(n)]
    for p in procs:
        p.start()
    out = []
    deadline = time.time() + timeout
    for _ in procs:
        try:
            out.append(results.get(timeout=max(1.0, deadline - time.time())))
        except Exception:  # noqa: BLE001  (queue.Empty: past the budget)
            out.append({"error": f"no result within {timeout:.0f} s"})
            break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    errors = [r["error"] for r in out if "error" in r]
    if errors or len(out) < n:
        return {"error": errors[0] if errors else "a run gave no result"}
    span = max(r["t1"] for r in out) - min(r["t0"] for r in out)
    tokens = sum(r["tokens"] for r in out)
    per_run = [r["tokens"] / (r["t1"] - r["t0"]) for r in out]
    return {"aggregate_tok_s": tokens / span, "per_run_tok_s": per_run,
            "span_s": span, "max_mem_gib": max(r["max_mem_gib"] for r in out)}


COLS = ["model", "runs", "aggregate_tok_s", "per_run_tok_s_mean", "x_one_run", "max_mem_gib", "wall_s",
        "error"]


def save(out: Path, rows: list[dict], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_share.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS)
        w.writeheader()
        w.writerows(rows)
    (out / "gpu_share.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="iwslt,mini", help="of: " + ", ".join(sorted(B.ARCHS)))
    p.add_argument("--concurrency", default="1,4,8", help="numbers of runs at once (1 comes first)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per measurement before giving up")
    p.add_argument("--out", type=Path, default=None, help="folder for gpu_share.csv and gpu_share.json")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: 2+2-layer mini model, N = 1, 2")
    B.add_data_args(p)
    args = p.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    ns = sorted({int(x) for x in args.concurrency.split(",")} | {1})
    base = ["placement=pre_ln", B.STOCK_SCHEDULE, f"precision={args.precision}", "threads=1",
            "device=cuda" if cuda else "device=cpu", *B.data_overrides(args)]
    if args.tiny:
        models, ns = ["mini"], [1, 2]
        base += B.QUICK_OVERRIDES
        args.warmup, args.updates = 1, min(args.updates, 2)
    if not cuda:  # forked runs inherit what one run's set-up imports (torch, fairseq's tasks,
        # criterions and optimizers: ~4 CPU s of a run's first set-up) and the prepared data
        B.Timed([*base, f"scale.arch={B.ARCHS[models[0]]}", "seed=1"])
    print(B.machine_line())
    if cuda:
        print(f"# GPU: {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}")
    rows = []
    for model in models:
        single = NAN
        for n in ns:
            t = time.time()
            res = measure([*base, f"scale.arch={B.ARCHS[model]}"], n, args.warmup, args.updates, args.timeout)
            if n == 1:
                single = res.get("aggregate_tok_s", NAN)
            agg = res.get("aggregate_tok_s", NAN)
            per = res.get("per_run_tok_s", [])
            rows.append({"model": model, "runs": n, "aggregate_tok_s": agg,
                         "per_run_tok_s_mean": sum(per) / len(per) if per else NAN,
                         "x_one_run": agg / single if single == single else NAN,
                         "max_mem_gib": res.get("max_mem_gib", NAN), "wall_s": time.time() - t,
                         "error": res.get("error", "")})
            if args.out:  # after every row: a run stopped at its time budget keeps what it measured
                save(args.out, rows, {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                                      "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                                      "precision": args.precision, "warmup": args.warmup,
                                      "updates": args.updates})
    print(f"# {args.precision}, Pre-LN, {args.warmup} untimed + {args.updates} timed updates per run, "
          f"runs in separate processes started together (barrier before the timed updates)")
    print(B.table(["model", "runs", "aggregate tok/s", "tok/s per run", "x one run", "max GiB", "wall s",
                   "error"], [[r[c] for c in COLS] for r in rows]))
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
