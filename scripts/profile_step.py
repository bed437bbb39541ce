#!/usr/bin/env python
"""Where a training update's time goes, and the efficiency ceiling that follows from it.

    python scripts/profile_step.py                      # paper IWSLT model, Post-LN, 3 profiled updates
    python scripts/profile_step.py --model mini --updates 5
    python scripts/profile_step.py --quick              # tiny model, seconds (used by the tests)

Builds lnexp's training path in-process (scripts/_bench.LnexpTrainer), runs ``--warmup`` untimed
updates, times ``--updates`` updates without the profiler, then profiles the same number with
``torch.profiler`` (input shapes recorded). Each aten operator's self time goes to one category
(matrix multiply, attention, dropout RNG, softmax + loss, LayerNorm, optimizer, other). The matrix
multiplies' FLOPs come from their recorded shapes, so the table also gives the rate the matmul
kernels reach *inside the model* against the measured peak (fp32 2048x2048, same threads, before
and after). Achieved efficiency = matmul share of the update x matmul kernel rate / peak, so the
output says which of the two limits the training FLOP/s and by how much.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

OTHER = "other (Python, autograd engine)"
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
CATEGORIES = [  # (label, predicate on the aten op name); first match wins, the rest is "other"
    ("matrix multiply (mm, addmm, bmm)", lambda k: k in MATMUL),
    ("attention kernels (sdpa, softmax)", lambda k: "scaled_dot_product" in k or k in (
        "aten::_softmax", "aten::_softmax_backward_data")),
    ("dropout masks (bernoulli_)", lambda k: "bernoulli" in k),
    ("output log-softmax + loss", lambda k: "log_softmax" in k or k in ("aten::gather",
                                                                        "aten::scatter_add_")),
    ("LayerNorm / RMSNorm", lambda k: "layer_norm" in k or "rms_norm" in k),
    ("copies, fills, casts", lambda k: k in ("aten::copy_", "aten::fill_", "aten::zero_", "aten::clone",
                                             "aten::contiguous", "aten::to", "aten::_to_copy")),
    ("element-wise and reductions", lambda k: k.startswith("aten::")),
]


def matmul_flops(key: str, shapes: list) -> float:
    """FLOPs of one call from its recorded input shapes (addmm/baddbmm: bias first)."""
    a, b = (shapes[1], shapes[2]) if key in ("aten::addmm", "aten::baddbmm") else (shapes[0], shapes[1])
    if len(a) == 3:  # batched: [n, i, k] x [n, k, j]
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    return 2.0 * a[0] * a[1] * b[1]


def profile(trainer: B.LnexpTrainer, updates: int):
    """Per update: self seconds per category, matmul FLOPs, seconds under Optimizer.step, wall
    seconds (profiler overhead included)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        wall = sum(trainer.step()[0] for _ in range(updates))
    per_cat = {label: 0.0 for label, _ in CATEGORIES}
    per_cat[OTHER] = 0.0
    flops = 0.0
    optimizer_s = 0.0
    for ev in prof.key_averages(group_by_input_shape=True):
        s = ev.self_cpu_time_total / 1e6
        if ev.key.startswith("Optimizer.step"):
            optimizer_s += ev.cpu_time_total / 1e6
        label = next((lab for lab, pred in CATEGORIES if pred(ev.key)), OTHER)
        per_cat[label] += s
        if ev.key in MATMUL and ev.input_shapes:
            flops += matmul_flops(ev.key, ev.input_shapes) * ev.count
    return ({k: v / updates for k, v in per_cat.items()}, flops / updates, optimizer_s / updates,
            wall / updates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="iwslt", choices=sorted(B.ARCHS))
    p.add_argument("--placement", default="post_ln")
    p.add_argument("--warmup", type=int, default=2, help="untimed updates first")
    p.add_argument("--updates", type=int, default=3, help="timed updates, then as many profiled")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--stock", action="store_true",
                   help="profile stock fairseq's transformer instead (Post-/Pre-LN only)")
    p.add_argument("--quick", action="store_true", help="tiny 2+2-layer mini model (for tests)")
    B.add_data_args(p)
    args = p.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    over = [f"scale.arch={B.ARCHS[args.model]}", f"placement={args.placement}", B.STOCK_SCHEDULE, "seed=1",
            f"threads={torch.get_num_threads()}", *B.data_overrides(args)]
    if args.quick:
        over += B.QUICK_OVERRIDES
        args.model = "mini (2+2 layers)"
        args.warmup, args.updates = 1, min(args.updates, 2)
    print(B.machine_line())
    peak0 = B.matmul_peak(2048, "float32")
    trainer = B.LnexpTrainer(over, stock=args.stock)
    res = trainer.run(args.warmup, args.updates, count_flops=1)
    cats, mm_flops, optimizer_s, profiled_s = profile(trainer, args.updates)
    peak = max(peak0, B.matmul_peak(2048, "float32"))

    update_s = res["s_per_update"]
    total = sum(cats.values())
    rows = [[label, sec, sec / total] for label, sec in sorted(cats.items(), key=lambda kv: -kv[1])]
    rows.append(["(of which under Optimizer.step)", optimizer_s, optimizer_s / total])
    impl = "stock fairseq transformer" if args.stock else "lnexp ln_transformer"
    print(f"# {impl}, model {args.model} ({trainer.params() / 1e6:.1f}M params), {args.placement}: "
          f"{args.updates} updates timed ({update_s:.3f} s each, {res['tok_s']:.0f} target tok/s), "
          f"then {args.updates} profiled ({profiled_s:.3f} s each)")
    print(B.table(["category of aten ops (self time)", "s/update", "share"], rows))
    mm_s = cats[CATEGORIES[0][0]]
    mm_rate = mm_flops / mm_s if mm_s else float("nan")
    share = mm_s / total if total else float("nan")
    achieved = res["tok_s"] * res["flops_per_token"]
    print()
    print(B.table(["efficiency", "GFLOP/s", "of peak"], [
        ["fp32 matmul peak 2048x2048 (best of before/after)", peak / 1e9, 1.0],
        ["matmul kernels inside the model (shape FLOPs / their self time)", mm_rate / 1e9, mm_rate / peak],
        ["profiled updates: matmul FLOPs / update time", mm_flops / profiled_s / 1e9,
         mm_flops / profiled_s / peak],
        ["timed updates: FlopCounter FLOPs/token x tok/s (bench_train.py)", achieved / 1e9, achieved / peak],
    ]))
    print(f"# matmul share of the update {share:.0%} x matmul kernel rate {mm_rate / peak:.0%} of peak "
          f"= {share * mm_rate / peak:.0%}. With every other op free the update would reach "
          f"{mm_rate / peak:.0%} (the ceiling set by this model's matmul shapes); reaching X% of peak "
          f"needs a matmul share of X / {mm_rate / peak:.0%}.")


if __name__ == "__main__":
    main()
