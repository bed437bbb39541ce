"""fairseq binarisation of subword text with one joined dictionary, cached by content."""

from __future__ import annotations

import os
from pathlib import Path

from lnexp.data.cache import cached_stage
from lnexp.data.text import SPLITS


def binarize_stage(name: str, out: Path, sub_dir: Path, src: str, tgt: str) -> Path:
    from lnexp import fairseq_adapter

    inputs = [sub_dir / f"{s}.{lang}" for s in SPLITS for lang in (src, tgt)]

    def build(tmp: Path) -> None:
        # one worker per core: binarisation is the slowest stage on IWSLT/WMT-sized corpora
        fairseq_adapter.binarize(sub_dir / "train", sub_dir / "valid", sub_dir / "test",
                                 src, tgt, tmp, workers=max(1, min(4, os.cpu_count() or 1)))

    out, _ = cached_stage(f"{name}/bin", out, inputs, {"src": src, "tgt": tgt}, build)
    return out
