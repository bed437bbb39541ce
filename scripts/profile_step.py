#!/usr/bin/env python
"""Where a training update's time goes, and the efficiency ceiling that follows from it.

    python scripts/profile_step.py                      # paper IWSLT model, Post-LN, 3 profiled updates
    python scripts/profile_step.py --model mini --updates 5
    python scripts/profile_step.py --quick              # tiny model, seconds (used by the tests)
    python scripts/profile_step.py --cell --updates 10  # a mini atlas cell's phases (start-up ... BLEU)
    python scripts/profile_step.py --cell --precision bf16
    python scripts/profile_step.py --syncs --model mini --override speed.syncs=every
                                                        # host syncs and aten calls per update

``--syncs``: what an update would cost a GPU beyond its arithmetic, counted on any device: the
device-to-host reads per update (``aten::_local_scalar_dense``: ``.item()``, ``float(t)``, ``if t``),
each with the line of fairseq or lnexp that asks for it, and the aten operator calls per update
(on a GPU, about one kernel launch each) in the forward + loss, backward and optimizer phases.
Reads of CPU tensors (fairseq's positional embedding reads its input's shape) are marked: on a
GPU they are no sync.

``--cell``: where a mini 6+6 atlas cell's time goes (configs/experiment/atlas_mini.yaml: 120 updates
of 2048 tokens, 1 thread, norm tracking every 10 updates, one validation loss + BLEU on 100
sentences at the end). Start-up is measured from this script's first line (interpreter start not
included) to the trainer ready; ``--updates`` updates are split by wall clock into batch fetch
(data), forward + loss, backward, optimizer (clipping + Adam), norm tracking and the rest of
fairseq's update, then extrapolated to the cell's max_update; last, the cell's evaluation. No
profiler runs in this mode, so the phases add up to the update's wall time.

Builds lnexp's training path in-process (scripts/_bench.Timed over lnexp.train.session.Session),
runs ``--warmup`` untimed updates, times ``--updates`` updates without the profiler, then
profiles the same number with ``torch.profiler`` (input shapes recorded). Each aten operator's
self time goes to one category
(matrix multiply, attention, dropout RNG, softmax + loss, LayerNorm, optimizer, other). The matrix
multiplies' FLOPs come from their recorded shapes, so the table also gives the rate the matmul
kernels reach *inside the model* against the measured peak (fp32 2048x2048, same threads, before
and after). Achieved efficiency = matmul share of the update x matmul kernel rate / peak, so the
output says which of the two limits the training FLOP/s and by how much.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # --cell: start-up is measured from here

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

from lnexp.plural import count  # noqa: E402

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


def profile(trainer: B.Timed, updates: int):
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


def host_syncs(trainer: B.Timed, updates: int) -> None:
    """The --syncs tables (see the module's docstring)."""
    import collections
    import traceback

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    where: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    phase = ["rest of the update"]
    read = torch.ops.aten._local_scalar_dense.default

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls[phase[0]] += 1
            if func is read:
                frames = [f for f in traceback.extract_stack()[:-1]
                          if "/torch/" not in f.filename]
                f = frames[-1]
                path = f.filename.split("site-packages/")[-1].replace(str(B.REPO) + "/", "")
                # fairseq's positional embedding reads its input's shape, a CPU tensor on any device
                device = ("CPU tensor (no sync)" if args[0].device.type == "cpu" and (
                    trainer.device == "cuda" or "positional_embedding" in path) else "GPU sync")
                where[(f"{path}:{f.lineno}", (f.line or "").strip()[:70], device)] += 1
            return func(*args, **(kwargs or {}))

    def mark(obj, name: str, label: str) -> None:
        f = getattr(obj, name)

        def run(*a, **k):
            before, phase[0] = phase[0], label
            try:
                return f(*a, **k)
            finally:
                phase[0] = before
        setattr(obj, name, run)

    mark(trainer.trainer.criterion, "forward", "forward + loss")
    mark(trainer.trainer.optimizer, "backward", "backward")
    mark(trainer.trainer.optimizer, "step", "optimizer step")
    with Count():
        for _ in range(updates):
            samples = trainer._next()
            trainer.update(samples)
    rows = [[f"{n / updates:.1f}", loc, kind, line] for (loc, line, kind), n in where.most_common()]
    print(f"# host reads per update ({sum(where.values()) / updates:.1f} in all), by the line "
          "that asks")
    print(B.table(["per update", "where", "kind", "code"], rows))
    print()
    print(B.table(["phase", "aten calls per update"],
                  [[k, v / updates] for k, v in calls.most_common()]))


def cell(args) -> None:
    """The --cell table: a mini atlas cell's seconds by phase (see the module's docstring)."""
    import torch

    from lnexp import fairseq_adapter as fa
    from lnexp.decoding import BleuScorer
    from lnexp.train.norm_tracking import NormTracker
    from lnexp.train.validation import validation_loss

    over = ["experiment=atlas_mini", f"placement={args.placement}", f"precision={args.precision}",
            "seed=1", *B.data_overrides(args)]
    if args.quick:
        over += B.QUICK_OVERRIDES + ["eval.subset=5"]
        args.warmup, args.updates = 1, min(args.updates, 2)
    run = B.Timed(over)
    startup = time.perf_counter() - T0
    cfg = run.cfg
    print(B.machine_line())
    print(f"# precision: {run.precision.why}")
    for _ in range(args.warmup):
        run.step()
    clock = time.perf_counter
    spent = fa.phase_clock(run.trainer, clock)
    data = track = wall = 0.0
    with tempfile.TemporaryDirectory() as d:
        tracker = NormTracker(run.model, Path(d) / "norms.csv", int(cfg.track_every),
                              grad_of=fa.stepped_grads(run.trainer)) if cfg.track_norms else None
        for i in range(args.updates):
            t = clock()
            samples = run._next()
            data += clock() - t
            run.update(samples)
            t1 = clock()
            if tracker is not None:
                tracker.after_update(args.warmup + i + 1)
            track += clock() - t1
            wall += clock() - t
        if tracker is not None:
            tracker.close()
    n = args.updates
    per = {"data (batch fetch)": data / n, "forward + loss": spent["forward"] / n,
           "backward": spent["backward"] / n, "optimizer (clip + step)": spent["optimizer"] / n,
           f"norm tracking (every {count(cfg.track_every, 'update')})": track / n}
    per["rest of fairseq's update"] = wall / n - sum(per.values())
    cell_updates = int(cfg.max_update)
    t = clock()
    valid = validation_loss(run.task, run.trainer)
    loss_s = clock() - t
    scorer = BleuScorer(run.task, run.data, beam=int(cfg.eval.beam), lenpen=float(cfg.eval.lenpen),
                        max_sentences=int(cfg.eval.max_sentences), subset=int(cfg.eval.subset))
    t = clock()
    scorer.score(run.trainer.get_model(), run.device)
    bleu_s = clock() - t
    rows = [["start-up (imports, config, data, model, trainer)", startup, startup]]
    rows += [[k, v, v * cell_updates] for k, v in per.items()]
    rows += [["validation loss (whole valid set)", float("nan"), loss_s],
             [f"BLEU (beam {cfg.eval.beam}, {scorer.n} sentences)", float("nan"), bleu_s]]
    total = sum(r[2] for r in rows)
    rows = [[*r, r[2] / total] for r in rows]
    rows.append(["cell (extrapolated)", wall / n, total, 1.0])
    print(f"# mini atlas cell ({cfg.placement.name}, {cfg.depth.encoder_layers}+"
          f"{cfg.depth.decoder_layers} layers, {cfg.scale.max_tokens} tokens/batch, "
          f"{torch.get_num_threads()} thread(s)): {count(n, 'update')} timed after {args.warmup} untimed, "
          f"x {count(cell_updates, 'update')}; evaluation once (valid loss {valid.loss:.2f} bits)")
    print(B.table(["phase", "s/update", "s/cell", "share of the cell"], rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="iwslt", choices=sorted(B.ARCHS))
    p.add_argument("--placement", default="post_ln")
    p.add_argument("--warmup", type=int, default=2, help="untimed updates first")
    p.add_argument("--updates", type=int, default=3, help="timed updates, then as many profiled")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--stock", action="store_true",
                   help="profile stock fairseq's transformer instead (Post-/Pre-LN only)")
    p.add_argument("--quick", action="store_true",
                   help="tiny 2+2-layer mini model, a 512x512 matmul peak (for tests)")
    p.add_argument("--cell", action="store_true",
                   help="a mini atlas cell's time by phase (start-up, data, forward, backward, "
                        "optimizer, norm tracking, evaluation) instead of the operator profile")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "auto"))
    p.add_argument("--syncs", action="store_true",
                   help="host reads (GPU syncs) and aten calls per update instead of the profile")
    p.add_argument("--override", action="append", default=[],
                   help="an lnexp override (repeatable), e.g. speed.adam=fused")
    B.add_data_args(p)
    args = p.parse_args()
    if args.cell:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        cell(args)
        return

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:  # the mini model (d=128), cut to 2+2 layers below
        args.model = "mini"
    over = [f"scale.arch={B.ARCHS[args.model]}", f"placement={args.placement}", B.STOCK_SCHEDULE, "seed=1",
            f"threads={torch.get_num_threads()}", f"precision={args.precision}", *B.data_overrides(args),
            *args.override]
    if args.quick:
        over += B.QUICK_OVERRIDES
        args.model = "mini (2+2 layers)"
        args.warmup, args.updates = 1, min(args.updates, 2)
    print(B.machine_line())
    if args.syncs:
        trainer = B.Timed(over, stock=args.stock)
        for _ in range(args.warmup):
            trainer.step()
        print(f"# {'stock fairseq' if args.stock else 'lnexp'}, model {args.model}, {args.placement}, "
              f"{count(args.updates, 'update')} after {args.warmup}; overrides: "
              f"{' '.join(args.override) or '-'}")
        host_syncs(trainer, args.updates)
        return
    # the peak's best-of and size: --quick's figure is only read by the tests
    reps, n = (1, B.QUICK_PEAK_N) if args.quick else (10, 2048)
    peak0 = B.matmul_peak(n, "float32", reps=reps)
    trainer = B.Timed(over, stock=args.stock)
    res = trainer.run(args.warmup, args.updates, count_flops=1)
    cats, mm_flops, optimizer_s, profiled_s = profile(trainer, args.updates)
    peak = max(peak0, B.matmul_peak(n, "float32", reps=reps))
    if trainer.precision.autocast:
        print(f"# precision: {trainer.precision.why}; bf16 matmul peak {n}x{n}: "
              f"{B.matmul_peak(n, 'bfloat16', reps=reps) / 1e9:.0f} GFLOP/s (the table's peak "
              "stays fp32's)")

    update_s = res["s_per_update"]
    total = sum(cats.values())
    rows = [[label, sec, sec / total] for label, sec in sorted(cats.items(), key=lambda kv: -kv[1])]
    rows.append(["(of which under Optimizer.step)", optimizer_s, optimizer_s / total])
    impl = "stock fairseq transformer" if args.stock else "lnexp ln_transformer"
    print(f"# {impl}, model {args.model} ({trainer.params() / 1e6:.1f}M params), {args.placement}: "
          f"{count(args.updates, 'update')} timed ({update_s:.3f} s each, {res['tok_s']:.0f} target tok/s), "
          f"then {args.updates} profiled ({profiled_s:.3f} s each)")
    print(B.table(["category of aten ops (self time)", "s/update", "share"], rows))
    mm_s = cats[CATEGORIES[0][0]]
    mm_rate = mm_flops / mm_s if mm_s else float("nan")
    share = mm_s / total if total else float("nan")
    achieved = res["tok_s"] * res["flops_per_token"]
    print()
    print(B.table(["efficiency", "GFLOP/s", "of peak"], [
        [f"fp32 matmul peak {n}x{n} (best of before/after)", peak / 1e9, 1.0],
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
