"""Per-epoch validation loss (label-smoothed, bits/token, fairseq's unit); its BLEU is
lnexp.decoding's ``BleuScorer``, shared with ``lnexp evaluate``."""

from __future__ import annotations

import math

import torch

from lnexp import fairseq_adapter as fa
from lnexp.decoding import Validation


def validation_loss(task, trainer, split: str = "valid", max_tokens: int = 8192) -> Validation:
    model, criterion = trainer.get_model(), trainer.criterion  # unwrapped: no DDP collectives
    model.eval()
    loss = nll = ntokens = sample_size = 0.0
    with torch.no_grad():
        for sample in fa.batch_iterator(task, split, max_tokens=max_tokens):
            sample = fa.move_to(sample, trainer.device.type)
            _, size, out = task.valid_step(sample, model, criterion)
            loss += float(out["loss"])
            nll += float(out["nll_loss"])
            ntokens += out["ntokens"]
            sample_size += size
    ln2 = math.log(2)
    return Validation(loss / sample_size / ln2, nll / ntokens / ln2)
