"""When a run counts as diverged.

1. Non-finite: the training loss or gradient norm becomes NaN or inf (fairseq raises
   FloatingPointError). Recorded at that update; the run stops.
2. Plateau: from epoch ``plateau_epoch`` on, the validation NLL is still within ``plateau_margin``
   bits of the unigram entropy of the training targets, i.e. the model predicts no better than
   word frequencies: the stall that Post-LN without warm-up shows (Xiong et al., Fig. 2). Recorded
   at the last update of the epoch where it is first seen; the run goes on unless ``stop`` is set,
   so that its curve can still be drawn.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from lnexp.rundir import write_text


def unigram_entropy_bits(target_dataset, cache_file: Path | None = None) -> float:
    """Entropy (bits/token) of the training targets' unigram distribution, end-of-sentence included.

    This is the loss of a model that has learnt word frequencies and nothing else.
    """
    if cache_file is not None and cache_file.is_file():
        return float(json.loads(cache_file.read_text())["unigram_entropy_bits"])
    import torch

    counts = torch.zeros(0, dtype=torch.long)
    for i in range(len(target_dataset)):
        c = torch.bincount(target_dataset[i].long())
        if len(c) > len(counts):
            counts = torch.cat([counts, counts.new_zeros(len(c) - len(counts))])
        counts[: len(c)] += c
    p = counts[counts > 0].double() / counts.sum()
    h = float(-(p * p.log2()).sum())
    if cache_file is not None:
        try:
            write_text(cache_file, json.dumps({"unigram_entropy_bits": h}))
        except OSError:
            pass  # a read-only cache only costs recomputing it
    return h


@dataclass(frozen=True)
class PlateauRule:
    entropy_bits: float
    plateau_epoch: int = 2
    margin_bits: float = 0.5

    @classmethod
    def of_targets(cls, target_dataset, cache_file: Path | None, plateau_epoch: int,
                   margin_bits: float) -> PlateauRule:
        """The rule for a training set, its unigram entropy computed once (``cache_file``)."""
        return cls(unigram_entropy_bits(target_dataset, cache_file), plateau_epoch, margin_bits)

    def stuck(self, epoch: int, valid_nll_bits: float) -> bool:
        if not math.isfinite(valid_nll_bits):
            return True
        return epoch >= self.plateau_epoch and valid_nll_bits >= self.entropy_bits - self.margin_bits


def non_finite(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)
