"""A prepared corpus, and the checks every corpus's raw text goes through.

Every corpus is prepared in three cached stages under ``<cache>/<name>/``:
``text/`` (word-level ``{train,valid,test}.{src,tgt}``: the BLEU references), ``subword/`` and
``bin/`` (fairseq-binarised, joined dictionary). ``prepared.json`` describes the result.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from lnexp.data.cache import cached_stage
from lnexp.errors import DataError

SPLITS = ("train", "valid", "test")


def cache_root() -> Path:
    """Where prepared corpora live: $LNEXP_CACHE, else ./cache."""
    return Path(os.environ.get("LNEXP_CACHE", "cache")).resolve()


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
        from lnexp.data.subword import piece_decoder

        return piece_decoder(self.subword, Path(self.subword_model))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(
        path, encoding="utf-8")


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 (optionally gzipped) file, newline stripped; errors name file and line."""
    if not path.is_file():
        raise DataError(f"missing file {path}: check the path or download the corpus first")
    import zlib

    lines: list[str] = []
    with open(path, "rb") as fh:
        raw = gzip.GzipFile(fileobj=fh) if path.suffix == ".gz" else fh
        try:
            for n, line in enumerate(raw, 1):
                try:
                    lines.append(line.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}:{n}: not UTF-8 text ({e.reason}); re-encode the file "
                                    "as UTF-8") from None
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: damaged gzip file ({' '.join(str(e).split())}); download it "
                            "again") from None
    return lines


def read_parallel(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
                        "the two sides must be line-aligned")
    if not src:
        raise DataError(f"{src_path} is empty: a corpus needs at least one sentence pair")
    return src, tgt


def write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def progress(items: list, label: str, every: int = 50_000) -> Iterator:
    """Yield items, logging progress on long stages."""
    from lnexp.data.cache import log

    n = len(items)
    for i, item in enumerate(items):
        if i and i % every == 0:
            log.info("%s: %d/%d (%.0f%%)", label, i, n, 100 * i / n)
        yield item


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
    from lnexp.data.binarize import binarize_stage
    from lnexp.data.subword import subword_stage

    root = (root or cache_root()) / name
    text_dir, _ = cached_stage(f"{name}/text", root / "text", text_inputs, text_settings, make_text)
    counts = {s: sum(1 for _ in open(text_dir / f"{s}.{src}", encoding="utf-8")) for s in SPLITS}
    sub_dir, model = subword_stage(name, root / "subword", text_dir, src, tgt, subword, vocab_size)
    bin_dir = binarize_stage(name, root / "bin", sub_dir, src, tgt)
    data = PreparedData(name, src, tgt, str(bin_dir), str(text_dir), subword, str(model),
                        tokenized, counts)
    data.save(root)
    return data
