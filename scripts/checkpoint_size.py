#!/usr/bin/env python
"""Disk cost of one lnexp checkpoint per model: parameters and bytes of a saved checkpoint.

    python scripts/checkpoint_size.py                  # mini, IWSLT14 and WMT14 models
    python scripts/checkpoint_size.py --archs mini     # only some (mini, iwslt, wmt)

Each model is built by fairseq from lnexp's architecture (Post-LN, 6+6 layers, shared
embeddings) over a joined dictionary of the dataset config's vocabulary size plus fairseq's 4
special symbols (a prepared corpus's real dictionary differs by a few entries). What is saved is
what a training checkpoint holds: the fp32 weights and Adam's two fp32 moments per parameter
(``exp_avg``, ``exp_avg_sq``) written with torch.save; config and loop state add a few kB.
So bytes ~ 12 x parameters. Epoch checkpoints (``checkpoint.keep_last_epochs=N``) cost N of
these on top of checkpoint_last.pt, checkpoint_previous.pt (the one before it) and
checkpoint_best.pt.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARCHS = {  # name: (lnexp arch, dataset config whose vocabulary it uses)
    "mini": ("ln_transformer_mini", "multi30k"),
    "iwslt": ("ln_transformer_iwslt_de_en", "iwslt14_de_en"),
    "wmt": ("ln_transformer_wmt_en_de", "wmt14_en_de"),
}


def vocab_size(dataset: str) -> int:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "dataset" / f"{dataset}.yaml")
    return int(cfg.vocab_size)


def build(arch: str, vocab: int):
    import argparse as ap

    from fairseq import options
    from fairseq.data import Dictionary

    import lnexp.model  # noqa: F401  (registers ln_transformer)

    d = Dictionary()  # 4 special symbols
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    task = ap.Namespace(source_dictionary=d, target_dictionary=d)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "/nonexistent", "--arch", arch, "--share-all-embeddings", "--placement", "post_ln"])
    from lnexp.model import LNTransformerModel

    return LNTransformerModel.build_model(args, task), len(d)


def measure(name: str) -> dict:
    import torch

    arch, dataset = ARCHS[name]
    model, dict_size = build(arch, vocab_size(dataset))
    params = list(model.parameters())  # shared embeddings counted once
    n = sum(p.numel() for p in params)
    adam = {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                          "exp_avg_sq": torch.zeros_like(p)} for i, p in enumerate(params)},
            "param_groups": [{"params": list(range(len(params)))}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.pt"
        torch.save({"model": model.state_dict(), "last_optimizer_state": adam}, path)
        ckpt = os.path.getsize(path)
        torch.save({"model": model.state_dict()}, path)
        weights = os.path.getsize(path)
    return {"model": name, "arch": arch, "dict": dict_size, "params": n, "checkpoint_bytes": ckpt,
            "weights_only_bytes": weights}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", default="mini,iwslt,wmt", help="comma-separated: mini, iwslt, wmt")
    args = ap.parse_args()
    names = [a.strip() for a in args.archs.split(",") if a.strip()]
    bad = [a for a in names if a not in ARCHS]
    if bad:
        print(f"checkpoint_size.py: unknown model {bad[0]!r}; use {', '.join(ARCHS)}", file=sys.stderr)
        return 2
    print(f"{'model':<6} {'arch':<27} {'dict':>6} {'params':>12} {'checkpoint':>11} {'weights':>9}")
    for name in names:
        r = measure(name)
        print(f"{r['model']:<6} {r['arch']:<27} {r['dict']:>6} {r['params']:>12,} "
              f"{r['checkpoint_bytes'] / 2**20:>8.1f} MiB {r['weights_only_bytes'] / 2**20:>6.1f} MiB",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
