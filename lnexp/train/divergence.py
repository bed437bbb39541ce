"""How a run's end is judged: diverged, or on the unigram plateau (lnexp.run_status has the words).

1. Diverged: the training loss or gradient norm becomes NaN or inf (fairseq raises
   FloatingPointError), or a validation loss does. Recorded at that update; the run stops.
2. Plateau: the validation NLL is still within ``plateau_margin`` bits of the unigram entropy of
   the training targets, i.e. the model predicts no better than word frequencies: the stall that
   Post-LN without warm-up shows (Xiong et al., Fig. 2). The rule applies at the end of an epoch
   from epoch ``plateau_epoch`` and update ``min_updates`` on (before that no model has left the
   plateau: being on it says nothing yet). Each epoch's verdict replaces the one before, so a run
   that leaves the plateau later ends off it; a run ends ``plateau`` when its last verdict is, or
   when ``divergence.stop`` ends it at the first one, to save the rest of its budget.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from lnexp.plural import count
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
    min_updates: int = 0

    @classmethod
    def of_targets(cls, target_dataset, cache_file: Path | None, plateau_epoch: int,
                   margin_bits: float, min_updates: int = 0) -> PlateauRule:
        """The rule for a training set, its unigram entropy computed once (``cache_file``)."""
        return cls(unigram_entropy_bits(target_dataset, cache_file), plateau_epoch, margin_bits,
                   min_updates)

    def applies(self, epoch: int, updates: int) -> bool:
        """Whether the rule judges an epoch that ends at ``updates``."""
        return epoch >= self.plateau_epoch and updates >= self.min_updates

    def not_applied(self, epoch: int, updates: int) -> str | None:
        """Why the rule has not judged a run that ended there (None if it has)."""
        if epoch < self.plateau_epoch:
            return (f"not applied: {count(epoch, 'epoch')} < divergence.plateau_epoch="
                    f"{self.plateau_epoch}")
        if updates < self.min_updates:
            return (f"not applied: {count(updates, 'update')} < divergence.plateau_min_updates="
                    f"{self.min_updates}")
        return None

    def stuck(self, valid_nll_bits: float) -> bool:
        """On the plateau: a (finite) validation NLL within the margin of the unigram entropy."""
        return valid_nll_bits >= self.entropy_bits - self.margin_bits

    def verdict(self, record: dict) -> dict | None:
        """The plateau record of an epoch's validation (None: off the plateau)."""
        nll = record["valid_nll_loss"]
        if not self.stuck(nll):
            return None
        return {"reason": f"valid nll {nll:.2f} bits >= unigram entropy {self.entropy_bits:.2f} - "
                          f"{self.margin_bits}", "update": record["updates"], "epoch": record["epoch"]}


def non_finite(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)
