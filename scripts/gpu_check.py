#!/usr/bin/env python
"""One-shot readiness check for a GPU session: matmul peak, tokens/s and efficiency at paper scale.

    python scripts/gpu_check.py                 # paper IWSLT model (6+6, d=512), fp32 and bf16
    python scripts/gpu_check.py --max-tokens 8192 --updates 50
    python scripts/gpu_check.py --tiny          # CPU: 2+2-layer mini model, fp32 (used by tests)

For each precision it builds lnexp's training path in-process (config -> fairseq flags with
--bf16/--fp16 -> Trainer; the adapter calls of lnexp.train.loop), runs ``--warmup`` untimed
updates (the first under torch's FlopCounterMode: model FLOPs of one training step), then
``--updates`` timed ones (device synchronised), and divides achieved FLOP/s by the measured
matrix-multiply peak of the same precision. bf16/fp16 need a GPU and are skipped on CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="iwslt", choices=sorted(B.ARCHS))
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per batch (default: config's)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny model, few updates")
    B.add_data_args(p)
    args = p.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    print(B.machine_line())
    if cuda:
        print(f"# GPU: {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}, "
              f"TF32 matmul {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
    over = [f"scale.arch={B.ARCHS[args.model]}", "placement=pre_ln", f"device={device}", "seed=1",
            f"threads={torch.get_num_threads()}"]
    if args.tiny:
        over += B.QUICK_OVERRIDES
        args.model = "mini (2+2 layers)"
        args.warmup, args.updates = 1, min(args.updates, 3)
    if args.max_tokens:
        over.append(f"scale.max_tokens={args.max_tokens}")
    over += B.data_overrides(args)
    n = 8192 if cuda else 2048
    rows = []
    for precision in [x.strip() for x in args.precisions.split(",") if x.strip()]:
        if precision != "fp32" and not cuda:
            rows.append([precision, "skipped: needs a GPU"] + [float("nan")] * 6)
            continue
        peak = B.matmul_peak(n, DTYPES[precision], device)
        run = B.LnexpTrainer([*over, f"precision={precision}"])
        res = run.run(args.warmup, args.updates, count_flops=1)
        achieved = res["tok_s"] * res["flops_per_token"]
        rows.append([precision, f"{run.params() / 1e6:.1f}M params", res["tok_s"],
                     res["s_per_update"], res["flops_per_token"] / 1e6, achieved / 1e12,
                     peak / 1e12, achieved / peak])
        del run
        if cuda:
            torch.cuda.empty_cache()
    print(f"# lnexp training path, model {args.model}, Pre-LN, {args.warmup} warm-up + "
          f"{args.updates} timed updates per precision; peak = {n}x{n} matmul, same precision")
    print(B.table(["precision", "model", "tok/s", "s/update", "MFLOP/tok", "TFLOP/s", "peak TFLOP/s",
                   "of peak"], rows))


if __name__ == "__main__":
    main()
