"""fairseq binarisation of subword text with one joined dictionary, cached by content."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from lnexp.data.cache import cached_stage
from lnexp.data.text import split_files


def binarize_stage(name: str, out: Path, sub_dir: Path, src: str, tgt: str,
                   reuse: Iterable[Path] = ()) -> Path:
    from lnexp import fairseq_adapter

    inputs = split_files(sub_dir, src, tgt)

    def build(tmp: Path) -> None:
        fairseq_adapter.binarize(sub_dir / "train", sub_dir / "valid", sub_dir / "test",
                                 src, tgt, tmp, workers=binarize_workers(inputs))

    out, _ = cached_stage(f"{name}/bin", out, inputs, settings(src, tgt), build, reuse=reuse)
    return out


def settings(src: str, tgt: str) -> dict:
    """The binary stage's settings, as its stage.json records them."""
    return {"src": src, "tgt": tgt}


SMALL_CORPUS_BYTES = 16 * 2**20  # subword text below this (Multi30k: ~4 MB) is binarised by one process


def binarize_workers(inputs: list[Path]) -> int:
    """One worker per core (at most 4) for IWSLT/WMT-sized corpora, where binarisation is the
    slowest stage; one for a small corpus, where fairseq's process pool costs more than it saves
    (600 pairs in a joblib sweep's worker, 2026-12-02: 141 s with a pool of 2, 18 s without)."""
    size = sum(p.stat().st_size for p in inputs if p.is_file())
    return 1 if size < SMALL_CORPUS_BYTES else max(1, min(4, os.cpu_count() or 1))
