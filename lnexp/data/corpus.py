"""A prepared corpus, and the pipeline every corpus goes through: text -> subword -> binary.

Every corpus is prepared in three cached stages under ``<cache>/<name>/``:
``text/`` (word-level ``{train,valid,test}.{src,tgt}``: the BLEU references; written by the corpus's
own module), ``subword/`` (``subword.py``) and ``bin/`` (fairseq-binarised, joined dictionary:
``binarize.py``). ``prepared.json`` describes the result. Each corpus module registers itself with a
:class:`Corpus` (its ``CORPUS``), which :mod:`lnexp.data.registry` finds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lnexp.data.binarize import binarize_stage
from lnexp.data.cache import cache_root, cached_stage
from lnexp.data.subword import piece_decoder, subword_stage
from lnexp.data.text import SPLITS, read_lines, write_atomic


@dataclass(frozen=True)
class PreparedData:
    """What training and evaluation need to know about a prepared corpus."""

    name: str
    src: str
    tgt: str
    bin_dir: str
    text_dir: str
    subword: str  # "sentencepiece" | "subword_nmt"
    subword_model: str
    tokenized: bool  # text_dir holds Moses-tokenised, lowercased text (IWSLT/WMT convention)
    counts: dict[str, int]

    def save(self, root: Path) -> None:
        write_atomic(root / "prepared.json", json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, root: Path) -> PreparedData:
        return cls(**json.loads((root / "prepared.json").read_text()))

    def references(self, split: str) -> list[str]:
        return read_lines(Path(self.text_dir) / f"{split}.{self.tgt}")

    def decoder(self) -> Callable[[str], str]:
        """Subword pieces -> the text level of ``text_dir``."""
        return piece_decoder(self.subword, Path(self.subword_model))


@dataclass(frozen=True)
class Option:
    """One option of ``lnexp prepare NAME``: its flag fills the keyword ``dest`` of the corpus's
    ``prepare``."""

    flag: str
    dest: str
    help: str
    type: Callable[[str], Any] = Path
    required: bool = False
    metavar: str | None = None


@dataclass(frozen=True)
class Corpus:
    """A corpus's registration. ``prepare(**options, subword=, vocab_size=, root=)`` builds it in
    the cache; ``eval_text(lines, lang)`` brings raw sentences to its ``text/`` level. ``hint``: the
    command that prepares it, named when training finds it missing; a corpus without one (the
    shipped Multi30k) is prepared on first use from the dataset config instead, by
    ``prepare_dataset(dataset, root)``, after ``check_dataset(dataset)`` before any run starts."""

    help: str
    prepare: Callable[..., PreparedData]
    eval_text: Callable[[list[str], str], list[str]]
    options: tuple[Option, ...] = ()
    hint: str | None = None
    check_dataset: Callable[[Any], None] | None = None
    prepare_dataset: Callable[[Any, Path], PreparedData] | None = None


def build_from_text(
    name: str,
    src: str,
    tgt: str,
    make_text: Callable[[Path], None],
    text_inputs: list[Path],
    text_settings: dict,
    subword: str = "sentencepiece",
    vocab_size: int = 8000,
    tokenized: bool = False,
    root: Path | None = None,
) -> PreparedData:
    """The shared pipeline: corpus-specific text stage -> joint subword model -> binarisation."""
    root = (root or cache_root()) / name
    text_dir, _ = cached_stage(f"{name}/text", root / "text", text_inputs, text_settings, make_text)
    counts = {s: sum(1 for _ in open(text_dir / f"{s}.{src}", encoding="utf-8")) for s in SPLITS}
    sub_dir, model = subword_stage(name, root / "subword", text_dir, src, tgt, subword, vocab_size)
    bin_dir = binarize_stage(name, root / "bin", sub_dir, src, tgt)
    data = PreparedData(name, src, tgt, str(bin_dir), str(text_dir), subword, str(model),
                        tokenized, counts)
    data.save(root)
    return data
