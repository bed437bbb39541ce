"""IWSLT 2014 German-English (TED talks), prepared as fairseq's ``prepare-iwslt14.sh`` does.

Input: the IWSLT 2014 evaluation campaign's ``de-en.tgz`` (WIT3 release ``2014-01/texts/de/en``),
or the folder it unpacks to. Read: ``train.tags.de-en.{de,en}`` and the evaluation sets
``IWSLT14.TED.dev2010``, ``IWSLT14.TEDX.dev2012``, ``IWSLT14.TED.tst2010``, ``IWSLT14.TED.tst2011``,
``IWSLT14.TED.tst2012`` as ``<set>.de-en.{de,en}.xml``; every other file is ignored.

The reference script, step for step (:mod:`lnexp.data.moses` maps each perl tool to Python):

1. Training files: drop every line containing ``<url>``, ``<talkid>`` or ``<keywords>`` (its
   ``grep -v``), delete the ``<title>``, ``</title>``, ``<description>``, ``</description>`` tags
   but keep their text (its ``sed``), Moses-tokenise each side (``tokenizer.perl -l L``: no
   ``-a``, XML escaping on). Other header lines (``<speaker>``, ...) are kept and tokenised, as
   the script keeps them.
2. ``clean-corpus-n.perl -ratio 1.5 ... 1 175``: drop pairs with an empty side, a side longer
   than 175 tokens, or a token-count ratio above 1.5 either way.
3. Lowercase.
4. Evaluation sets: keep the lines containing ``<seg id``, delete ``<seg id="N">`` and
   ``</seg>`` with the whitespace around them, map ``’`` to ``'``, tokenise, lowercase.
5. valid = every 23rd cleaned training pair (pairs 23, 46, ...), train = the rest; test =
   dev2010, TEDX dev2012, tst2010, tst2011, tst2012 in that order.
6. Joint subword vocabulary learned on train (de + en): sentencepiece BPE by default, or
   subword-nmt (``learn_bpe.py -s 10000``: vocab_size is then the number of merges), as the
   reference, for exact comparability; then fairseq binarisation with a joined dictionary.

On the real release this gives 160,239 / 7,283 / 6,750 pairs.

Deviations from the reference, all without effect on the text: the archive's members are read
straight from the tar stream (nothing is unpacked to disk); perl's ``lc`` is Python's
``str.lower``; the tokeniser is sacremoses (the Python port of ``tokenizer.perl``).
The reference stops silently at the shorter side when the two training files disagree in length;
here that is an error.
"""

from __future__ import annotations

import logging
import re
import shlex
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from lnexp.data import moses
from lnexp.data.cache import cache_root
from lnexp.data.corpus import Corpus, Option, PreparedData, Recipe, build_from_text
from lnexp.data.text import write_lines
from lnexp.errors import DataError

log = logging.getLogger("lnexp.data")

NAME = "iwslt14_de_en"
SRC, TGT = "de", "en"
LANGS = (SRC, TGT)
PAIR = "de-en"
EVAL_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
             "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")
VALID_EVERY = 23
MIN_LEN, MAX_LEN, RATIO = 1, 175, 1.5
VERSION = 1  # bump when the text stage's output would change

DROP = ("<url>", "<talkid>", "<keywords>")
STRIP_TAGS = re.compile(r"</?(?:title|description)>")
SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
SEG_CLOSE = re.compile(r"\s*</seg>\s*")


def train_file(lang: str) -> str:
    return f"train.tags.{PAIR}.{lang}"


def eval_file(stem: str, lang: str) -> str:
    return f"{stem}.{PAIR}.{lang}.xml"


REQUIRED = [train_file(lang) for lang in LANGS] + [
    eval_file(stem, lang) for stem in EVAL_SETS for lang in LANGS]


# --- the release: a .tgz or a folder ------------------------------------------------------------


@dataclass
class Release:
    """Where the release's files are, and how to name them in messages."""

    path: Path
    folder: Path | None = None  # unpacked release: the folder holding the files
    members: dict[str, str] = field(default_factory=dict)  # archive: file -> member name

    @property
    def inputs(self) -> list[Path]:
        """The files actually read (the cache key)."""
        if self.folder is None:
            return [self.path]
        return [self.folder / f for f in REQUIRED]

    def label(self, f: str) -> str:
        return str(self.folder / f) if self.folder is not None else f"{self.path}:{self.members[f]}"

    def read_all(self) -> dict[str, bytes]:
        if self.folder is not None:
            return {f: (self.folder / f).read_bytes() for f in REQUIRED}
        wanted = {m: f for f, m in self.members.items()}
        found: dict[str, bytes] = {}
        try:
            with tarfile.open(self.path, "r:*") as tf:
                for m in tf:  # one pass over the stream: no seeking back in the gzip
                    f = wanted.get(_member_name(m.name))
                    if f is not None and m.isfile():
                        fh = tf.extractfile(m)
                        assert fh is not None
                        found[f] = fh.read()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            raise DataError(f"{self.path}: damaged archive ({_one_line(e)}); download {PAIR}.tgz "
                            "again") from None
        return found


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _member_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


def open_release(path: Path) -> Release:
    """Check the layout (``de-en/<file>`` or ``<file>`` at the top) and say where each file is."""
    path = Path(path)
    expect = f"expected the IWSLT 2014 {PAIR} release layout ({PAIR}/{REQUIRED[0]}, ...)"
    if path.is_dir():
        folder = path / PAIR if (path / PAIR).is_dir() and not (path / REQUIRED[0]).exists() else path
        for f in REQUIRED:
            if not (folder / f).is_file():
                raise DataError(f"missing file {folder / f}: {expect}")
        return Release(path, folder=folder)
    if not path.exists():
        raise DataError(f"no such file or folder: {path} (pass the downloaded {PAIR}.tgz or the "
                        "folder it unpacks to)")
    try:
        with tarfile.open(path, "r:*") as tf:
            names = {_member_name(m.name) for m in tf.getmembers() if m.isfile()}
    except tarfile.ReadError:
        raise DataError(f"{path}: not a readable .tgz archive; pass {PAIR}.tgz or the folder it "
                        "unpacks to") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise DataError(f"{path}: not a readable .tgz archive ({_one_line(e)}); pass {PAIR}.tgz "
                        "or the folder it unpacks to") from None
    prefix = f"{PAIR}/" if any(n.startswith(f"{PAIR}/") for n in names) else ""
    members = {}
    for f in REQUIRED:
        if prefix + f not in names:
            raise DataError(f"{path}: missing {prefix}{f}: {expect}")
        members[f] = prefix + f
    return Release(path, members=members)


# --- reading and checking the raw text ----------------------------------------------------------


def _decode(data: bytes, label: str) -> list[str]:
    import io

    return list(moses.iter_lines(io.BytesIO(data), label))


def _train_lines(lines: list[str]) -> list[str]:
    """``grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' | sed`` (the title tags)."""
    return [STRIP_TAGS.sub("", line) for line in lines if not any(tag in line for tag in DROP)]


def _segments(lines: list[str]) -> list[str]:
    """``grep '<seg id' | sed`` (strip the tags and the spaces around them) ``| sed "s/’/'/g"``."""
    return [SEG_CLOSE.sub("", SEG_OPEN.sub("", line)).replace("’", "'")
            for line in lines if "<seg id" in line]


@dataclass
class RawText:
    train: dict[str, list[str]]  # lang -> lines, header lines dropped
    evals: dict[str, dict[str, list[str]]]  # set -> lang -> segments


def read_text(release: Release) -> RawText:
    """Decode and check every file: any problem of the input shows up here, before any stage."""
    data = release.read_all()
    for f in REQUIRED:  # a member that vanished between listing and reading
        if f not in data:
            raise DataError(f"{release.path}: missing {release.members.get(f, f)}")
    text = {f: _decode(data.pop(f), release.label(f)) for f in REQUIRED}
    train = {lang: _train_lines(text[train_file(lang)]) for lang in LANGS}
    a, b = (train_file(lang) for lang in LANGS)
    if not train[SRC] or not train[TGT]:
        empty = a if not train[SRC] else b
        raise DataError(f"{release.label(empty)}: no sentence lines (empty file, or only "
                        "<url>/<talkid>/<keywords> lines)")
    _check_aligned(release, a, b, train, "sentence lines", "line-aligned")
    evals: dict[str, dict[str, list[str]]] = {}
    for stem in EVAL_SETS:
        segs = {lang: _segments(text[eval_file(stem, lang)]) for lang in LANGS}
        a, b = (eval_file(stem, lang) for lang in LANGS)
        for f, lang in ((a, SRC), (b, TGT)):
            if not segs[lang]:
                raise DataError(f"{release.label(f)}: no <seg id=\"N\"> lines: not an IWSLT "
                                "evaluation set")
        _check_aligned(release, a, b, segs, "<seg> lines", "aligned")
        evals[stem] = segs
    return RawText(train, evals)


def _check_aligned(release, a: str, b: str, sides: dict[str, list[str]], what: str, how: str) -> None:
    if len(sides[SRC]) != len(sides[TGT]):
        raise DataError(f"{release.label(a)} has {len(sides[SRC])} {what} but {release.label(b)} has "
                        f"{len(sides[TGT])}: the two sides must be {how}")


# --- the text stage -----------------------------------------------------------------------------


def eval_text(lines: list[str], lang: str, label: str = "iwslt14: tokenising") -> list[str]:
    """Evaluation segments (tags already stripped) -> the text level of ``text/``: ``’`` -> ``'``,
    tokenise, lowercase. Used for the test sets here and for any raw test set (lnexp evaluate)."""
    segs = [line.replace("’", "'") for line in lines]
    return [t.lower() for t in moses.run(segs, ("tokenize",), lang, label, total=len(segs))]


def split_valid(pairs: list[tuple[str, str]]) -> tuple[list, list]:
    """awk 'NR%23 == 0' -> valid, the rest -> train."""
    valid = [p for i, p in enumerate(pairs, 1) if i % VALID_EVERY == 0]
    train = [p for i, p in enumerate(pairs, 1) if i % VALID_EVERY != 0]
    return train, valid


def make_text(raw: RawText, out: Path, label: str = "") -> None:
    tok = {}
    for lang in LANGS:
        lines = raw.train[lang]
        tok[lang] = list(moses.run(lines, ("tokenize",), lang, f"iwslt14: tokenising train.{lang}",
                                   total=len(lines)))
    pairs = [(a.lower(), b.lower()) for a, b in moses.clean_corpus(tok[SRC], tok[TGT], MIN_LEN,
                                                                   MAX_LEN, RATIO)]
    log.info("iwslt14: %d training pairs, %d kept by clean-corpus-n (%d-%d tokens, ratio %s)",
             len(tok[SRC]), len(pairs), MIN_LEN, MAX_LEN, RATIO)
    if not pairs:
        raise DataError(f"{label or 'train.tags'}: no sentence pair is left after cleaning "
                        f"({MIN_LEN}-{MAX_LEN} tokens, length ratio at most {RATIO})")
    train, valid = split_valid(pairs)
    test: dict[str, list[str]] = {lang: [] for lang in LANGS}
    for stem in EVAL_SETS:
        for lang in LANGS:
            test[lang] += eval_text(raw.evals[stem][lang], lang, f"iwslt14: tokenising {stem}.{lang}")
    for split, rows in (("train", train), ("valid", valid)):
        for i, lang in enumerate(LANGS):
            write_lines(out / f"{split}.{lang}", [row[i] for row in rows])
    for lang in LANGS:
        write_lines(out / f"test.{lang}", test[lang])


def text_settings() -> dict:
    import sacremoses

    return {"pipeline": f"iwslt14-v{VERSION}", "valid_every": VALID_EVERY, "min_len": MIN_LEN,
            "max_len": MAX_LEN, "ratio": RATIO, "eval_sets": list(EVAL_SETS),
            "sacremoses": getattr(sacremoses, "__version__", "?")}


def prepare(archive: Path, subword: str = "sentencepiece", vocab_size: int = 10000,
            root: Path | None = None) -> PreparedData:
    """Prepare IWSLT'14 de-en from ``de-en.tgz`` or its unpacked folder (cached per stage)."""
    release = open_release(Path(archive))
    root = Path(root or cache_root())
    command = ["lnexp", "prepare", "iwslt14", "--archive", str(Path(archive).resolve()),
               "--subword", subword, "--vocab-size", str(vocab_size)]
    recipe = Recipe(NAME, SRC, TGT, release.inputs, text_settings(), subword, vocab_size,
                    tokenized=True, command=shlex.join(command))
    raw = None
    if not recipe.text_ready(root):
        raw = read_text(release)  # input errors surface before any stage starts

    def build(out: Path) -> None:
        make_text(raw if raw is not None else read_text(release), out, str(release.path))

    return build_from_text(recipe, build, root)


CORPUS = Corpus(
    help="IWSLT'14 de-en, as prepare-iwslt14.sh", prepare=prepare, eval_text=eval_text,
    options=(Option("--archive", "archive", "the IWSLT 2014 de-en release: de-en.tgz, or the folder it "
                    "unpacks to", required=True, metavar="PATH"),),
    hint="lnexp prepare iwslt14 --archive PATH/de-en.tgz")
