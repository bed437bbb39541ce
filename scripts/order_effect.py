#!/usr/bin/env python
"""Does the run that meets a batch shape first pay for it? Two identical runs, one after the other.

    python scripts/order_effect.py              # stock fairseq, whole-model bf16 cast, mini 2+2 layers
    python scripts/order_effect.py --fp32       # the same in fp32

Two sessions (lnexp.train.session.Session) of stock fairseq's Pre-LN transformer with the same
seed, so the same batches in the same order, in one process: ``--updates`` updates of the first
under torch's profiler, then the same updates of the second. The second meets only shapes the
first has seen. Printed: each run's self time in ``aten::mm`` and its wall time. On a CPU oneDNN
builds a bf16 matmul primitive per shape; this is how stock fairseq's half precision, measured
first and on the same batches as lnexp's, came out at a quarter of its fp32 on the H200
(docs/performance.md "Stock fairseq's half precision").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

from lnexp.plural import count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=4)
    p.add_argument("--fp32", action="store_true", help="fp32 instead of fairseq's --bf16 cast")
    p.add_argument("--threads", type=int, default=1)
    B.add_data_args(p)
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    over = ["placement=pre_ln", B.STOCK_SCHEDULE, "seed=1", f"threads={args.threads}",
            "device=cpu", *B.QUICK_OVERRIDES, *B.data_overrides(args)]
    extra = {} if args.fp32 else {"bf16": True}
    runs = [B.Timed(over, stock=extra) for _ in range(2)]
    print(B.machine_line())
    rows = []
    for name, run in zip(("first", "second"), runs, strict=True):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            losses = [run.update(run._next())["loss"] for _ in range(args.updates)]
            wall = time.perf_counter() - t
        mm = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == "aten::mm") / 1e3
        rows.append([name, mm, wall * 1e3, f"{losses[-1]:.4f}"])
    print(f"# stock fairseq Pre-LN, 2+2 layers, {'fp32' if args.fp32 else 'bf16 (--bf16 cast)'}, "
          f"{count(args.updates, 'update')} each, the same batches; {args.threads} thread(s), profiler on")
    print(B.table(["run", "aten::mm self ms", "wall ms", "last loss"], rows))


if __name__ == "__main__":
    main()
