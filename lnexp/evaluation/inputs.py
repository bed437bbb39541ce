"""Raw sentences -> what the run's model reads, prepared exactly as the run's training data.

The corpus's own text step (normalisation, Moses tokenisation, lowercasing where the corpus does
it: :func:`lnexp.data.registry.eval_text`), then the run's subword model, then the run's
dictionary. A raw test set becomes a folder fairseq reads with ``--dataset-impl raw``.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from lnexp.data.corpus import PreparedData
from lnexp.data.registry import eval_text
from lnexp.data.subword import piece_encoder
from lnexp.data.text import read_lines, write_lines
from lnexp.errors import DataError, UserError
from lnexp.evaluation.runinfo import RunInfo
from lnexp.plural import count

NOT_LANG = {"gz", "txt", "sgm", "xml", "raw", "tok"}


def file_lang(path: Path) -> str | None:
    """The language a file's name declares (``newstest2014.en``, ``test.de.gz``), if any."""
    for suffix in reversed(Path(path).suffixes):
        s = suffix[1:].lower()
        if s in NOT_LANG:
            continue
        return s if s.isalpha() and 2 <= len(s) <= 3 else None
    return None


def check_pair(src: Path, ref: Path, data: PreparedData) -> None:
    """Names that declare a language must match the run's pair (src -> tgt)."""
    for path, want, flag in ((src, data.src, "--src"), (ref, data.tgt, "--ref")):
        lang = file_lang(path)
        if lang is not None and lang != want:
            raise UserError(f"{flag} {path} is {lang} text by its name, but the run translates "
                            f"{data.src}->{data.tgt}: pass the {want} side as {flag}")


def read_raw(path: Path) -> list[str]:
    """A plain-text file, one sentence a line; SGM/XML test sets: their ``<seg>`` lines."""
    from lnexp.data.iwslt14 import SEG_CLOSE, SEG_OPEN

    lines = read_lines(Path(path))
    if Path(path).suffix in (".sgm", ".xml"):
        lines = [SEG_CLOSE.sub("", SEG_OPEN.sub("", x)) for x in lines if "<seg id" in x]
    return lines


def text_level(run: RunInfo, lines: list[str], lang: str) -> list[str]:
    return eval_text(run.corpus, lines, lang)


def encoder(data: PreparedData):
    return piece_encoder(data.subword, Path(data.subword_model))


def prepare_test_set(run: RunInfo, src: Path, ref: Path, out: Path) -> PreparedData:
    """Write ``out/text`` (text level: the references) and ``out/data`` (subword text + the run's
    dictionaries, split ``test``); returns the run's data pointed at them."""
    data = run.data
    check_pair(src, ref, data)
    sides = {data.src: read_raw(src), data.tgt: read_raw(ref)}
    if len(sides[data.src]) != len(sides[data.tgt]):
        raise DataError(f"{src} has {count(len(sides[data.src]), 'sentence')} but {ref} has "
                        f"{len(sides[data.tgt])}: --src and --ref must be line-aligned")
    if not sides[data.src]:
        raise DataError(f"{src} is empty: pass a test set with at least one sentence")
    text_dir, data_dir = out / "text", out / "data"
    for d in (text_dir, data_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    encode = encoder(data)
    pair = f"{data.src}-{data.tgt}"
    for lang, lines in sides.items():
        text = text_level(run, lines, lang)
        write_lines(text_dir / f"test.{lang}", text)
        write_lines(data_dir / f"test.{pair}.{lang}", [encode(x) for x in text])
        shutil.copyfile(Path(data.bin_dir) / f"dict.{lang}.txt", data_dir / f"dict.{lang}.txt")
    return replace(data, bin_dir=str(data_dir), text_dir=str(text_dir),
                   counts={"test": len(sides[data.src])})
