#!/usr/bin/env python
"""The GPU session script: paper-scale tokens/s of stock fairseq and lnexp in fp32, bf16 and fp16,
side by side, with fp16 overflows, gradient norms against fp32, and data-parallel training over
every visible GPU. One table (``--out DIR``: also gpu_check.csv and gpu_check.json, rewritten after
every row); part 3 of scripts/gpu_session.py, which gives it 120 s on one GPU (6 short runs; not
yet timed on one: --tiny takes about 20 CPU seconds, most of them its 3 processes' start-up).

    python scripts/gpu_check.py                  # paper IWSLT model (6+6, d=512), all precisions
    python scripts/gpu_check.py --updates 50 --max-tokens 8192
    python scripts/gpu_check.py --tiny           # CPU: 2+2-layer mini model, fp32, 2 gloo workers

Per precision, lnexp's Pre-LN model and stock fairseq's ``transformer`` (settings.stock_flags) in
each of stock's settings of that precision (scripts/_bench.py STOCK_SETTINGS: fp16 as --fp16,
--fp16 --memory-efficient-fp16 and --amp; bf16 as --bf16 and --bf16 --memory-efficient-bf16) are
built in-process through lnexp's training session (lnexp.train.session.Session, what ``lnexp train``
builds), run ``--warmup`` untimed updates each (lnexp's first under torch's FlopCounterMode), then
``--updates`` timed rounds of one update of each run, the order reversed every other round (device
synchronised around each). lnexp is compared with stock's fastest correct setting (every update
finite, at most a quarter skipped by the fp16 loss scaler), named in ``stock setting``. Columns:

- ``overflows``: fp16 updates fairseq skipped (loss scale lowered), lnexp / stock, with lnexp's
  final loss scale;
- ``gnorm vs fp32``: the largest relative difference, over layers, between the FFN gradient norms
  ``track_norms`` reads after the first update (the fp32 master gradients the optimizer steps
  with) and those of fp32 on the same first batch; bf16/fp16 should stay at their precision;
- ``of peak``: lnexp's achieved FLOP/s over the measured matmul peak of the same precision;
- the ``x N`` row: lnexp data-parallel over N processes (``distributed.world_size=N``, fairseq's
  DDP and sharded batches; N = visible GPUs when there are 2 or more, ``--world-size`` to set it;
  on CPU gloo workers), tokens/s over all ranks, scaling = its tokens/s over N x the one-GPU row.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
NAN = float("nan")


def first_update_norms(store: dict):
    """``on_first`` for Timed.run: the per-layer FFN gradient norms track_norms reads."""
    def record(run, step) -> None:
        from lnexp import fairseq_adapter as fa
        from lnexp.train.norm_tracking import ffn_grad_norms

        if step and not step.get("overflow"):  # an fp16 overflow leaves no gradients: nan
            store.update(ffn_grad_norms(run.model, fa.stepped_grads(run.trainer)))
    return record


def max_rel_diff(a: dict, ref: dict) -> float:
    diffs = [abs(a[k] - v) / v for k, v in ref.items() if k in a and v > 0]
    return max(diffs) if diffs else NAN


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="iwslt", choices=sorted(B.ARCHS))
    p.add_argument("--precisions", default="fp32,bf16,fp16")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per batch (default: config's)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--world-size", type=int, default=None,
                   help="data-parallel processes (default: visible GPUs if 2 or more, else none; "
                        "--tiny: 2 gloo workers)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny model, few updates")
    p.add_argument("--out", type=Path, default=None, help="folder for gpu_check.csv and gpu_check.json")
    B.add_data_args(p)
    args = p.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    print(B.machine_line())
    if cuda:
        print(f"# GPU: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, CUDA "
              f"{torch.version.cuda}, TF32 matmul "
              f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
    if args.tiny:  # the mini model (d=128), cut to 2+2 layers below
        args.model = "mini"
    over = [f"scale.arch={B.ARCHS[args.model]}", "placement=pre_ln", B.STOCK_SCHEDULE, f"device={device}",
            "seed=1", f"threads={torch.get_num_threads()}"]
    world = args.world_size
    if world is None:
        world = torch.cuda.device_count() if cuda and torch.cuda.device_count() >= 2 else 1
    if args.tiny:
        over += B.QUICK_OVERRIDES
        args.model = "mini (2+2 layers)"
        args.warmup, args.updates = 1, min(args.updates, 2)  # 2 rounds: both orders
        world = args.world_size or 2
    if args.max_tokens:
        over.append(f"scale.max_tokens={args.max_tokens}")
    over += B.data_overrides(args)
    n = 8192 if cuda else (B.QUICK_PEAK_N if args.tiny else 2048)
    rows, single, ref_norms, peaks = [], {}, {}, {}
    headers = ["precision", "world", "model", "lnexp tok/s", "stock tok/s", "lnexp/stock",
               "overflows l/s", "loss scale", "gnorm vs fp32", "of peak", "stock setting",
               "stock settings tok/s"]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": B.machine_line().lstrip("# "),
            "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "model": args.model, "warmup": args.warmup,
            "updates": args.updates, "peak_matmul_n": n, "peaks_flop_s": peaks}

    def save() -> None:  # after every row: a part stopped at its time budget keeps what it measured
        if args.out:
            write_results(args.out, headers, rows, meta)

    for precision in [x.strip() for x in args.precisions.split(",") if x.strip()]:
        if precision != "fp32" and not cuda:
            rows.append([precision, 1, "skipped: needs a GPU"] + [NAN] * 7 + ["", ""])
            save()
            continue
        res, norms = {}, {}
        runs = {"lnexp": B.Timed([*over, f"precision={precision}"])}
        for label, extra in B.STOCK_SETTINGS[precision].items():
            runs[label] = B.Timed([*over, f"precision={precision}"], stock=extra)
        res = B.interleaved(runs, args.warmup, args.updates, first_update_norms(norms))
        del runs
        if cuda:
            torch.cuda.empty_cache()
        if precision == "fp32":
            ref_norms = dict(norms)
        mine = res.pop("lnexp")
        label, stock = B.fastest_correct(res)
        single[precision] = mine["tok_s"]
        peak = peaks[precision] = B.matmul_peak(n, DTYPES[precision], device)
        rows.append([precision, 1, f"{mine['params'] / 1e6:.1f}M params", mine["tok_s"],
                     stock["tok_s"], mine["tok_s"] / stock["tok_s"],
                     f"{mine['overflows']}/{stock['overflows']}",
                     NAN if mine["loss_scale"] is None else mine["loss_scale"],
                     max_rel_diff(norms, ref_norms) if precision != "fp32" else 0.0,
                     mine["tok_s"] * mine["flops_per_token"] / peak, label,
                     "; ".join(f"{k} {v['tok_s']:,.0f}" + ("" if v["correct"] else " (not correct)")
                               for k, v in res.items())])
        print(f"# {precision}: stock fairseq's fastest correct setting: {label}", flush=True)
        save()
    if world >= 2:
        with tempfile.TemporaryDirectory() as tmp:
            dp = B.data_parallel([*over, "precision=fp32", f"distributed.world_size={world}"],
                                 args.warmup, args.updates, Path(tmp) / "rank0.json")
        rows.append([f"fp32 x {world}", dp["world_size"], "lnexp data-parallel", dp["tok_s"], NAN,
                     NAN, f"{dp['overflows']}/-", NAN, NAN, NAN, "", ""])
        scaling = dp["tok_s"] / (world * single["fp32"]) if single.get("fp32") else NAN
        note = f"; x {world}: scaling {scaling:.2f} of {world} x the 1-process fp32 tok/s"
    else:
        note = "; data-parallel row: needs 2 or more GPUs (or --world-size)"
    print(f"# model {args.model}, Pre-LN, {args.warmup} warm-up + {args.updates} timed updates per "
          f"run; stock = fairseq's transformer, same flags; peak = {n}x{n} matmul{note}")
    print(B.table(headers, rows))
    save()


def write_results(out: Path, headers: list[str], rows: list[list], meta: dict) -> None:
    """The table as gpu_check.csv and, with how it was measured, gpu_check.json."""
    import csv
    import json

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_check.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(headers)
        w.writerows(rows)
    meta["rows"] = [dict(zip(headers, r, strict=True)) for r in rows]
    (out / "gpu_check.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
