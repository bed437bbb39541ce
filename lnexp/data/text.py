"""Plain-text helpers under every data stage: the split names, line-aligned file I/O, progress logs.

Nothing here knows a corpus or a stage; ``subword``, ``binarize`` and ``corpus`` build on it.
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Iterator
from pathlib import Path

from lnexp.errors import DataError
from lnexp.plural import count

SPLITS = ("train", "valid", "test")
log = logging.getLogger("lnexp.data")


def split_files(folder: Path, src: str, tgt: str) -> list[Path]:
    """Each split's two sides in ``folder`` (``train.de``, ...): a stage's inputs or outputs."""
    return [folder / f"{split}.{lang}" for split in SPLITS for lang in (src, tgt)]


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
        raise DataError(f"{src_path} has {count(len(src), 'line')} but {tgt_path} has {len(tgt)}: "
                        "the two sides must be line-aligned")
    if not src:
        raise DataError(f"{src_path} is empty: a corpus needs at least one sentence pair")
    return src, tgt


def write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def write_atomic(path: Path, text: str) -> None:
    from lnexp.rundir import write_text

    write_text(path, text)


def progress(items: list, label: str, every: int = 50_000) -> Iterator:
    """Yield items, logging progress on long stages."""
    n = len(items)
    for i, item in enumerate(items):
        if i and i % every == 0:
            log.info("%s: %d/%d (%.0f%%)", label, i, n, 100 * i / n)
        yield item
