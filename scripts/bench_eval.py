#!/usr/bin/env python
"""Cost of lnexp's per-epoch validation (loss + BLEU) as a share of an epoch, at mini scale.

    python scripts/bench_eval.py                      # mini scale, Multi30k, the settings below
    python scripts/bench_eval.py --settings 1:256:0,5:256:0,5:256:500
    python scripts/bench_eval.py --checkpoint runs/<run>/checkpoints/checkpoint_last.pt
    python scripts/bench_eval.py --quick              # tiny model and data (used by the tests)

One process: lnexp's training path (the adapter calls of lnexp.train.loop) trains ``--warmup``
untimed then ``--updates`` timed updates; one epoch of training = seconds per update x updates
per epoch (extrapolated, not a full epoch). Then the validation loss (lnexp.train.validation.
validation_loss) and the BLEU pass (BleuScorer.score, exactly what the loop runs) are timed for
each setting ``beam:max_sentences:subset`` (subset 0 = the whole validation set). The share is
validation / (training + validation) of one epoch. Generation time depends on how long the
hypotheses are, so the table gives hypothesis / reference length: a barely trained model that
runs to the 1.2 x source + 10 cap costs more than a trained one (``--checkpoint`` for a real one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench as B  # noqa: E402

from lnexp.plural import count

DEFAULT_SETTINGS = "1:256:0,1:64:0,1:1024:0,5:256:0,5:256:500"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default=None,
                   help=f"comma list of beam:max_sentences:subset (default {DEFAULT_SETTINGS})")
    p.add_argument("--placement", default="post_ln")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--updates", type=int, default=20, help="timed training updates")
    p.add_argument("--checkpoint", default=None, help="evaluate these weights (a trained model)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny model and few updates (for tests)")
    B.add_data_args(p)
    args = p.parse_args()

    import torch

    from lnexp.decoding import BleuScorer
    from lnexp.train.validation import validation_loss

    if args.threads:
        torch.set_num_threads(args.threads)
    over = [f"placement={args.placement}", B.STOCK_SCHEDULE, f"threads={torch.get_num_threads()}", "seed=1"]
    over += B.data_overrides(args)
    if args.quick:
        over += B.QUICK_OVERRIDES
        args.warmup, args.updates = 1, min(args.updates, 3)
    settings = args.settings or ("1:256:0,5:64:20" if args.quick else DEFAULT_SETTINGS)
    print(B.machine_line())
    run = B.Timed(over)
    cfg = run.cfg
    train = run.run(args.warmup, args.updates, count_flops=0)
    if args.checkpoint:
        from lnexp import fairseq_adapter as fa

        run.model.load_state_dict(fa.load_checkpoint_state(Path(args.checkpoint))["model"])
    per_epoch = run.updates_per_epoch
    train_s = train["s_per_update"] * per_epoch
    t = time.perf_counter()
    val = validation_loss(run.task, run.trainer)
    val_s = time.perf_counter() - t
    n_valid = len(run.data.references("valid"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in settings.split(","):
            beam, max_sent, subset = (int(x) for x in spec.split(":"))
            load0 = B.load_now()
            t = time.perf_counter()
            scorer = BleuScorer(run.task, run.data, beam, float(cfg.eval.lenpen), max_sent, subset)
            hyps_path = Path(tmp) / "hyps.txt"
            bleu = scorer.score(run.model, run.device, hyps_path)
            bleu_s = time.perf_counter() - t
            hyps = hyps_path.read_text().splitlines()
            hyp_words = sum(len(h.split()) for h in hyps)
            ref_words = sum(len(r.split()) for r in scorer.refs)
            valid = val_s + bleu_s
            current = (beam == int(cfg.eval.beam) and max_sent == int(cfg.eval.max_sentences)
                       and subset == int(cfg.eval.subset))
            rows.append([f"beam {beam}, batch {max_sent}, " + (f"first {subset}" if subset else
                                                                 f"all {n_valid}")
                         + (" (current)" if current else ""), bleu_s, val_s, valid,
                         valid / (train_s + valid), hyp_words / max(ref_words, 1), bleu.bleu,
                         (load0 + B.load_now()) / 2])
            print(f"  {rows[-1][0]}: BLEU pass {bleu_s:.1f} s", file=sys.stderr, flush=True)
    print(f"# mini scale ({cfg.scale.arch}, {cfg.placement.name}, max_tokens {cfg.scale.max_tokens}), "
          f"{per_epoch} updates/epoch; training {train['s_per_update']:.2f} s/update over "
          f"{args.updates} timed updates ({train['tok_s']:.0f} target tok/s) -> one epoch of "
          f"training = {train_s:.0f} s (extrapolated)")
    print(f"# validation loss over all {n_valid} sentences: {val_s:.1f} s "
          f"(valid loss {val.loss:.2f} bits/token)"
          + (f"; weights from {args.checkpoint}" if args.checkpoint else
             f"; model after {count(args.warmup + args.updates, 'update')} (no --checkpoint)"))
    print()
    print("Per-epoch validation cost (share = validation / (training + validation) of one epoch; "
          "target <= 10%)")
    print(B.table(["BLEU setting", "BLEU s", "loss s", "valid s", "share", "hyp/ref len", "BLEU",
                   "load"], rows))


if __name__ == "__main__":
    main()
