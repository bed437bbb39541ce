#!/usr/bin/env python
"""The speed settings on a GPU (issue 53): the paper's IWSLT model, Pre-LN and Post-LN, in fp32,
bf16 and fp16, timed round for round against stock fairseq's fastest correct setting: today's
default, each speed setting alone, then the best combination; a short torch.profiler trace of
the best combination says where an update's time goes.

    python scripts/gpu_speed.py --out OUT            # on the GPU (scripts/gpu_session.py --session speed)
    python scripts/gpu_speed.py --tiny --out OUT     # CPU: 2+2-layer mini model, fp32 only

Per precision, in one process (OUT/gpu_speed.csv and .json rewritten after each step, so that a
run stopped at its time budget keeps what it measured):

1. ``singles``: on the lead placement (Pre-LN), the default lnexp run, each setting of ``SETTINGS``
   alone and every stock setting of that precision (scripts/_bench.py STOCK_SETTINGS), ``--warmup``
   untimed updates each, then ``--updates`` timed rounds (the order reversed every other round).
2. ``best``: the default plus every setting that alone beat it by ``WIN`` or more (of the two Adam
   kernels, the faster), against the default and stock's fastest correct setting (the same
   warmed-up runs), timed again round for round; then the same three for the other placements.
3. ``profile`` (half precision; OUT/profile.txt, profile.json): 5 updates (--tiny: 2) of the best
   combination under torch.profiler: the GPU's busy share of the wall time, the operators with the
   most time.
4. ``graphs`` (last; GPU, bf16): CUDA graphs (compile=true, speed.compile_mode=reduce-overhead,
   speed.buckets) added to the best combination: compiling every layer for each bucket takes longest.

Every row: tokens/s (target tokens, all of an update's work, device synchronised around it), x
default and x stock (paired by round), the share of the same dtype's measured matmul peak (FLOPs
per token counted under FlopCounterMode on the first update), and whether every update stayed
finite. docs/performance.md "The GPU step" reads these files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# each speed setting alone, against the default run (configs/train.yaml's speed group); "half":
# only for bf16/fp16; "gpu": only where a GPU is
BUCKETS = "speed.buckets=[16,32,48,64,256]"  # Multi30k: most batches 16-64 tokens a sentence
SETTINGS: dict[str, dict] = {
    "syncs=every": {"over": ["speed.syncs=every"]},
    "adam=foreach": {"over": ["speed.adam=foreach"]},
    "adam=fused": {"over": ["speed.adam=fused"]},
    "half=autocast": {"over": ["speed.half=autocast"], "half": True},
    "gpu_threads=1": {"over": ["speed.gpu_threads=1"], "gpu": True},
}
GRAPHS = ["compile=true", "speed.compile_mode=reduce-overhead", BUCKETS]  # last phase
WIN = 1.03  # a setting joins the best combination if alone it is at least 3% faster (paired)
NAN = float("nan")
HEADERS = ["phase", "placement", "precision", "run", "tok/s", "median tok/s", "x default", "x stock",
           "of peak", "s/update", "median s/update", "correct", "overflows", "stock setting"]


def combine(singles: dict[str, dict], precision: str) -> tuple[list[str], list[str]]:
    """The best combination's settings and overrides: every setting that alone beat the default by
    WIN or more (paired) with every update finite; of the two Adam kernels only the faster."""
    wins = {k: v for k, v in singles.items()
            if k in SETTINGS and v["correct"] and v["x_default"] >= WIN}
    adams = [k for k in wins if k.startswith("adam=")]
    if len(adams) > 1:
        slower = min(adams, key=lambda k: wins[k]["x_default"])
        wins.pop(slower)
    names = sorted(wins)
    return names, [o for k in names for o in SETTINGS[k]["over"]]


class Table:
    """The rows so far, written to OUT after every phase."""

    def __init__(self, out: Path | None, meta: dict) -> None:
        self.out, self.meta, self.rows = out, meta, []

    def add(self, phase: str, placement: str, precision: str, results: dict[str, dict],
            peak: float) -> None:
        default = results["default"]
        stock_label, stock = B.fastest_correct({k: v for k, v in results.items()
                                                if k.startswith("stock")}) if any(
            k.startswith("stock") for k in results) else ("", None)
        for k, v in results.items():
            v["x_default"] = 1.0 if k == "default" else B.paired_ratio(default, v)
            x_stock = B.paired_ratio(stock, v) if stock is not None else NAN
            of_peak = v["tok_s"] * default["flops_per_token"] / peak if peak else NAN
            self.rows.append([phase, placement, precision, k, v["tok_s"], v["tok_s_median"],
                              v["x_default"], x_stock, of_peak, v["s_per_update"],
                              B.median(v["times"]), v["correct"], v["overflows"],
                              stock_label if k == "default" else ""])
            self.meta.setdefault("times", {})[f"{phase} {placement} {precision} {k}"] = [
                round(t, 5) for t in v["times"]]
        self.save()

    def save(self) -> None:
        if self.out is None:
            return
        import csv

        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "gpu_speed.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HEADERS)
            w.writerows(self.rows)
        self.meta["rows"] = [dict(zip(HEADERS, r, strict=True)) for r in self.rows]
        (self.out / "gpu_speed.json").write_text(json.dumps(self.meta, indent=1) + "\n")


def build(base: list[str], variants: dict[str, list[str]],
          stock: dict | None = None) -> dict[str, B.Timed]:
    """lnexp's runs (``variants``: label -> extra overrides) and stock's settings (label -> its
    fairseq flags, labelled "stock LABEL"), built through the training session."""
    runs = {k: B.Timed([*base, *extra]) for k, extra in variants.items()}
    for label, flags in (stock or {}).items():
        runs[f"stock {label}"] = B.Timed(base, stock=flags)
    return runs


def release() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def profile(run: B.Timed, out: Path | None, updates: int = 5) -> dict:
    """``updates`` more updates of a warmed-up run under torch.profiler: wall seconds, the device's
    busy seconds, the operators with the most device (else CPU) time."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    meter = B.Meter(run)
    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    run._sync()
    t = time.perf_counter()
    with torch_profile(activities=acts) as prof:
        for _ in range(updates):
            meter.timed()
    wall = time.perf_counter() - t
    events = prof.key_averages()
    if out is not None:  # torch's own table first: kept even if the reading below fails
        out.mkdir(parents=True, exist_ok=True)
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        (out / "profile.txt").write_text(f"# {' '.join(run.overrides)}\n# {updates} updates, "
                                         f"{wall:.3f} s wall\n"
                                         + events.table(sort_by=sort, row_limit=40) + "\n")

    def dev(e) -> float:  # microseconds of device time an event itself took
        return float(getattr(e, "self_device_time_total", None)
                     or getattr(e, "self_cuda_time_total", 0) or 0)

    def on_device(e) -> bool:  # a kernel, copy or set on the GPU: not an operator (its device
        # time is its kernels' again) nor a user annotation ("forward", "clip-grads": ranges)
        return (str(getattr(e, "device_type", "")).endswith("CUDA")
                and not getattr(e, "is_user_annotation", False))

    key = dev if cuda else (lambda e: float(e.self_cpu_time_total))
    busy = sum(dev(e) for e in events if on_device(e)) / 1e6 if cuda else NAN
    top = sorted(events, key=key, reverse=True)[:25]
    rows = [{"op": e.key, "self_s": key(e) / 1e6, "share_of_wall": key(e) / 1e6 / wall,
             "calls": e.count, "on_device": on_device(e)} for e in top]
    res = {"overrides": run.overrides, "updates": updates, "wall_s": wall, "device_busy_s": busy,
           "device_busy_share": busy / wall if cuda else NAN, "time_is": "device" if cuda else "cpu",
           "top": rows}
    if out is not None:
        (out / "profile.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="iwslt", choices=sorted(B.ARCHS))
    p.add_argument("--placements", default="pre_ln,post_ln")
    p.add_argument("--precisions", default="fp32,bf16,fp16")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--no-graphs", action="store_true", help="leave out phase 4 (CUDA graphs)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny model, few updates")
    p.add_argument("--out", type=Path, default=None, help="folder for gpu_speed.csv/json, profile.*")
    B.add_data_args(p)
    args = p.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    threads = torch.get_num_threads()
    print(B.machine_line(), flush=True)
    precisions = [x for x in args.precisions.split(",") if x]
    tiny = []
    if args.tiny:  # the quick model: 2+2 layers, 512 tokens a batch
        tiny = [o for o in B.QUICK_OVERRIDES if not o.startswith("scale.max_tokens=")]
        args.max_tokens, args.model = 512, "mini"
        args.warmup, args.updates = 1, min(args.updates, 2)  # 2 rounds: both orders
    over = [f"scale.arch={B.ARCHS[args.model]}", B.STOCK_SCHEDULE, f"device={device}", "seed=1",
            f"threads={threads}", f"scale.max_tokens={args.max_tokens}", *tiny,
            *B.data_overrides(args)]
    if not cuda:
        precisions = [x for x in precisions if x == "fp32"]
    n = 8192 if cuda else (B.QUICK_PEAK_N if args.tiny else 1024)
    peaks = {x: B.matmul_peak(n, DTYPES[x], device) for x in precisions}
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": B.machine_line().lstrip("# "),
            "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "model": args.model, "max_tokens": args.max_tokens, "warmup": args.warmup,
            "updates": args.updates, "peaks_flop_s": peaks, "peak_matmul_n": n, "win": WIN,
            "best": {}, "phases_s": {}}
    table = Table(args.out, meta)
    placements = [x for x in args.placements.split(",") if x]
    lead, others = placements[0], placements[1:]
    half = next((x for x in ("bf16", "fp16") if x in precisions), precisions[0])
    best_over: dict[str, list[str]] = {}
    for precision in precisions:
        t0 = time.perf_counter()
        at = [*over, f"precision={precision}"]
        # 1. each setting alone, on the lead placement
        variants = {"default": []}
        variants.update({k: s["over"] for k, s in SETTINGS.items()
                         if (precision != "fp32" or not s.get("half")) and (cuda or not s.get("gpu"))})
        runs = build([*at, f"placement={lead}"], variants, B.STOCK_SETTINGS[precision])
        res = B.interleaved(runs, args.warmup, args.updates, counted=("default",))
        table.add("singles", lead, precision, res, peaks[precision])
        print(f"# singles {lead} {precision}: default {res['default']['tok_s']:,.0f} tok/s; "
              + ", ".join(f"{k} x{v['x_default']:.2f}" for k, v in res.items() if k != "default"),
              flush=True)
        # 2. the best combination against the default and stock's fastest correct setting (the
        # same warmed-up runs)
        stock_label, _ = B.fastest_correct({k: v for k, v in res.items() if k.startswith("stock")})
        stock_label = stock_label.split(" (")[0]
        names, extra = combine(res, precision)
        best_over[precision] = extra
        meta["best"][precision] = {"settings": names, "stock": stock_label}
        keep = {"default": runs["default"], stock_label: runs[stock_label]}
        del runs, res
        release()
        if extra:
            keep["best"] = B.Timed([*at, f"placement={lead}", *extra])
        res = B.interleaved(keep, args.warmup, args.updates, counted=("default", "best"))
        table.add("best", lead, precision, res, peaks[precision])
        print(f"# best {lead} {precision}: {' + '.join(names) or 'none beat the default'}; "
              + ", ".join(f"{k} {v['tok_s']:,.0f} tok/s" for k, v in res.items()), flush=True)
        if precision == half:  # 3. where the time of the best half-precision update goes
            try:
                prof = profile(keep.get("best", keep["default"]), args.out, 2 if args.tiny else 5)
            except Exception as e:  # one reading among several: the rest still runs
                meta["profile"] = {"error": f"{type(e).__name__}: {e}"}
                print(f"# profile failed: {meta['profile']['error']}", flush=True)
            else:
                meta["profile"] = {k: prof[k] for k in ("overrides", "wall_s", "device_busy_s",
                                                        "device_busy_share", "time_is")}
                print(f"# profile {lead} {precision}: {prof['wall_s'] / prof['updates'] * 1e3:.1f} ms an "
                      f"update, device busy {prof['device_busy_share']:.0%}", flush=True)
        del keep
        release()
        # the other placements: the default, the lead's best combination, stock's setting
        for placement in others:
            pick = {"default": [], **({"best": extra} if extra else {})}
            flags = {stock_label.removeprefix("stock "):
                     B.STOCK_SETTINGS[precision][stock_label.removeprefix("stock ")]}
            runs = build([*at, f"placement={placement}"], pick, flags)
            res = B.interleaved(runs, args.warmup, args.updates, counted=("default", "best"))
            table.add("best", placement, precision, res, peaks[precision])
            print(f"# best {placement} {precision}: "
                  + ", ".join(f"{k} {v['tok_s']:,.0f} tok/s" for k, v in res.items()), flush=True)
            del runs
            release()
        meta["phases_s"][precision] = round(time.perf_counter() - t0, 1)
        table.save()
    if cuda and not args.no_graphs and "bf16" in precisions:  # 4. CUDA graphs, last
        t0 = time.perf_counter()
        extra = best_over["bf16"]
        runs = build([*over, "precision=bf16", f"placement={lead}"],
                     {"default": [], "best": extra, "best+graphs": [*extra, *GRAPHS]})
        res = B.interleaved(runs, args.warmup + 12, args.updates, counted=("default",))
        table.add("graphs", lead, "bf16", res, peaks["bf16"])
        meta["phases_s"]["graphs"] = round(time.perf_counter() - t0, 1)
        table.save()
    print(B.table(HEADERS, table.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
