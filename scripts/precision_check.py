#!/usr/bin/env python
"""Does bf16 autocast on CPU change the science? fp32 and bf16 side by side on fig3's gradients at
initialisation and on a few mini atlas cells.

    python scripts/precision_check.py                 # fig3 gradients (2 seeds) + 3 cells x 2 precisions
    python scripts/precision_check.py --cells none    # fig3 gradients only (about a minute)
    python scripts/precision_check.py --no-fig3 --cells post_ln:1e-3:0 --seed 2
    python scripts/precision_check.py --quick         # tiny model and runs (for tests)

1. fig3 at init (lnexp/figures/fig3.py's measurement: the paper's 6+6 d=512 model, fairseq's init
   from seed s, batch s of up to --max-tokens tokens, dropout off, label-smoothed loss per token;
   Post-, Pre-, Peri-LN on the same weights): each FFN weight's gradient norm in fp32 and under
   lnexp's bf16 autocast (lnexp.train.precision.autocast_context), the largest relative difference,
   and the ratios fig3's claims read (Post-LN's last decoder layer W2 gradient over Pre-LN's; the
   decoder's last over first layer per placement) in both.
2. cells: ``lnexp train experiment=atlas_mini ...`` (120 updates, the atlas's own settings and
   state rule) per cell in fp32 and in bf16, one after another: state (trained / plateau /
   diverged), final valid loss and BLEU, wall time. ``--cells`` takes "placement:lr:warmup[:norm]"
   items; the default has a cell that trains, one at the Post-LN boundary and one that fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

DEFAULT_CELLS = "pre_ln:1e-3:0,post_ln:1e-3:0,post_ln:4e-3:0"
PLACEMENTS = ("post_ln", "pre_ln", "peri_ln")


def fig3_grads(args) -> None:
    import torch

    from lnexp import fairseq_adapter as fa
    from lnexp import probes
    from lnexp.figures import measured
    from lnexp.train.precision import autocast_context

    cfg = probes.compose_config(["placement=post_ln", f"threads={args.threads}", *B.data_overrides(args)])
    torch.set_num_threads(args.threads)
    arch = "ln_transformer_mini" if args.quick else cfg.dataset.paper_arch
    layers = 2 if args.quick else 6
    base = probes.cpu_fairseq_config(cfg, arch=arch, encoder_layers=layers, decoder_layers=layers,
                                     **({} if args.quick else measured.model_dims(512)))
    task = fa.setup_task(base, ("train",))
    norms: dict[tuple[str, int, str], dict] = {}
    losses: dict[tuple[str, int, str], float] = {}
    for seed in range(1, args.seeds + 1):
        sample = probes.sample_batch(task, "train", args.max_tokens, seed)
        criterion = fa.build_criterion(base, task)
        ref = fa.build_model(probes.with_model(base, placement="post_ln"), task, seed)
        for p in PLACEMENTS:
            m = fa.build_model(probes.with_model(base, placement=p), task, 0)
            probes.load_init_weights(m, ref.state_dict())
            m.eval()
            for prec in ("fp32", "bf16"):
                with autocast_context() if prec == "bf16" else _nothing():
                    losses[(p, seed, prec)] = probes.loss_and_grads(m, criterion, sample,
                                                                    only=probes.ffn_weights(m))
                norms[(p, seed, prec)] = probes.ffn_grad_norms(m)
        print(f"  fig3 seed {seed} measured", file=sys.stderr, flush=True)
    rows = []
    for p in PLACEMENTS:
        for seed in range(1, args.seeds + 1):
            a, b = norms[(p, seed, "fp32")], norms[(p, seed, "bf16")]
            worst = max(abs(b[k] - a[k]) / a[k] for k in a)
            last_first = {prec: norms[(p, seed, prec)][("decoder", layers, "W2")]
                          / norms[(p, seed, prec)][("decoder", 1, "W2")] for prec in ("fp32", "bf16")}
            rows.append([p, seed, losses[(p, seed, "fp32")], losses[(p, seed, "bf16")], worst,
                         last_first["fp32"], last_first["bf16"]])
    print(f"# fig3 at init: {arch} {layers}+{layers}, batches of <= {args.max_tokens} tokens, "
          f"dropout off, FFN weights' gradient norms in fp32 and in bf16 autocast")
    print(B.table(["placement", "seed", "loss fp32", "loss bf16", "max rel. diff of a grad norm",
                   "dec. W2 last/first fp32", "bf16"], rows))
    post_pre = [[seed, *(norms[("post_ln", seed, prec)][("decoder", layers, "W2")]
                         / norms[("pre_ln", seed, prec)][("decoder", layers, "W2")]
                         for prec in ("fp32", "bf16"))] for seed in range(1, args.seeds + 1)]
    print()
    print(B.table(["seed", "Post/Pre-LN last decoder W2 grad, fp32", "bf16"], post_pre))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def cells(args) -> None:
    items = [c.split(":") for c in args.cells.split(",") if c.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="lnexp-precision-") as tmp:
        for item in items:
            placement, lr, warmup = item[:3]
            norm = item[3] if len(item) > 3 else "layernorm"
            for prec in ("fp32", "bf16"):
                over = ["experiment=atlas_mini", f"placement={placement}", f"lr={lr}",
                        f"warmup={warmup}", f"norm={norm}", f"seed={args.seed}",
                        f"precision={prec}", f"threads={args.threads}",
                        f"runs_root={Path(tmp) / prec}", *B.data_overrides(args)]
                if args.quick:
                    over += [*B.QUICK_OVERRIDES, "max_update=4", "eval.subset=5"]
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "lnexp", "train", *over],
                                      capture_output=True, text=True, cwd=B.REPO)
                wall = time.perf_counter() - t
                if proc.returncode != 0:
                    raise RuntimeError(f"lnexp train {' '.join(over)} failed:\n{proc.stderr[-3000:]}")
                run_dir = next((Path(tmp) / prec).glob("*/status.json")).parent
                rows.append([f"{placement}{'+' + norm if norm != 'layernorm' else ''} lr {lr} "
                             f"warm-up {warmup}", prec, *_outcome(run_dir), wall])
                print(f"  cell {rows[-1][0]} {prec}: {rows[-1][2]} ({wall:.0f} s)",
                      file=sys.stderr, flush=True)
                for d in (Path(tmp) / prec).iterdir():  # next cell's run folder is the only one
                    subprocess.run(["rm", "-rf", str(d)], check=True)
    print(f"# mini atlas cells (experiment=atlas_mini, seed {args.seed}, {args.threads} thread(s)), "
          "fp32 then bf16 autocast")
    print(B.table(["cell", "precision", "state", "updates", "valid loss (bits)", "BLEU", "wall s"],
                  rows))


def _outcome(run_dir: Path) -> list:
    status = json.loads((run_dir / "status.json").read_text())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1]) if lines else {}
    div = status.get("diverged")
    state = "trained" if not div else ("plateau" if div["reason"].startswith("plateau") else "diverged")
    return [state, status.get("updates"), float(last.get("valid_loss", float("nan"))),
            float(last.get("valid_bleu") if last.get("valid_bleu") is not None else float("nan"))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=2, help="fig3: seeds (weights and batch)")
    p.add_argument("--max-tokens", type=int, default=1024, help="fig3: tokens per batch (fig3's mini)")
    p.add_argument("--cells", default=DEFAULT_CELLS,
                   help='comma list of placement:lr:warmup[:norm], or "none"')
    p.add_argument("--seed", type=int, default=1, help="cells: the seed")
    p.add_argument("--no-fig3", action="store_true", help="cells only")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny model and runs (for tests)")
    B.add_data_args(p)
    args = p.parse_args()
    if args.quick:
        args.seeds, args.max_tokens = 1, 256
        args.cells = "pre_ln:1e-3:0" if args.cells == DEFAULT_CELLS else args.cells
    import torch

    torch.set_num_threads(args.threads)
    print(B.machine_line())
    if not args.no_fig3:
        fig3_grads(args)
    if args.cells != "none":
        print()
        cells(args)


if __name__ == "__main__":
    main()
