"""WMT 2014 English-German, normalised and tokenised as fairseq's ``prepare-wmt14en2de.sh`` does.

Input: one folder (searched recursively, so the unpacked WMT14 archives can sit in it as they
come) holding

* training, plain text per language, in this order: ``europarl-v7.de-en.{de,en}``,
  ``commoncrawl.de-en.{de,en}``, ``news-commentary-v9.de-en.{de,en}``;
* valid: newstest2013, as SGM (``newstest2013-src.en.sgm`` / ``newstest2013-ref.de.sgm``) or
  plain text (``newstest2013.{en,de}``);
* test: newstest2014, as SGM (``newstest2014-deen-src.en.sgm`` / ``newstest2014-deen-ref.de.sgm``,
  the "full" set of 3,003 sentences the reference uses) or plain text (``newstest2014.{en,de}``).

Steps (:mod:`lnexp.data.moses` maps each perl tool to Python):

1. Training text: ``normalize-punctuation.perl -l L | remove-non-printing-char.perl |
   tokenizer.perl -a -l L`` per side, then ``clean-corpus-n.perl -ratio 1.5 ... 1 250``.
   No lowercasing.
2. newstest2013/2014: the ``<seg id>`` lines with their tags and surrounding spaces stripped
   (plain-text files: every line), ``’`` -> ``'``, ``tokenizer.perl -a -l L`` (no punctuation
   normalisation, as the reference does for its test set).
3. Joint subword vocabulary on train (en + de; 37k by default, the paper's size) and fairseq
   binarisation with a joined dictionary.

Deviations from the reference, on purpose:

* valid is newstest2013, not every 100th training pair (the reference names newstest2013 as its
  dev set but never uses it); so train keeps those 1% of pairs.
* clean-corpus-n counts Moses tokens, before subwords: the reference cleans after BPE and counts
  subword tokens (the subword stage here is shared by every corpus and runs after the text
  stage). Fewer long pairs are dropped.
* the reference's BPE has 40,000 merges; here the default is a 37,000-piece sentencepiece BPE
  (``--subword subword_nmt --vocab-size 40000`` gives the reference's).
* ``--max-train-pairs N`` (smoke runs) keeps the first N training pairs in the order above (so
  Europarl only, for N < 1.9M) before cleaning.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from lnexp.data import moses
from lnexp.data.cache import cache_root
from lnexp.data.corpus import Corpus, Option, PreparedData, Recipe, build_from_text
from lnexp.data.iwslt14 import SEG_CLOSE, SEG_OPEN
from lnexp.data.text import write_lines
from lnexp.errors import ConfigError, DataError, at_least
from lnexp.plural import count

log = logging.getLogger("lnexp.data")

NAME = "wmt14_en_de"
SRC, TGT = "en", "de"
LANGS = (SRC, TGT)
CORPORA = ("europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en")
MIN_LEN, MAX_LEN, RATIO = 1, 250, 1.5
TRAIN_STEPS = ("normalize", "nonprint", "tokenize_a")
EVAL_STEPS = ("tokenize_a",)
VERSION = 1


def _role(lang: str) -> str:
    return "src" if lang == SRC else "ref"


def _other(lang: str) -> str:
    return "ref" if lang == SRC else "src"


def eval_candidates(split: str, lang: str) -> list[str]:
    """File names accepted for newstest2013 (valid) and newstest2014 (test), best first."""
    if split == "valid":
        return [f"newstest2013-{_role(lang)}.{lang}.sgm", f"newstest2013-{_other(lang)}.{lang}.sgm",
                f"newstest2013.{lang}"]
    return [f"newstest2014-deen-{_role(lang)}.{lang}.sgm",
            f"newstest2014-deen-{_other(lang)}.{lang}.sgm", f"newstest2014-deen.{lang}",
            f"newstest2014.{lang}"]


class Layout:
    """The files of a WMT14 folder, found by name anywhere below it."""

    def __init__(self, root: Path) -> None:
        root = Path(root)
        if not root.is_dir():
            raise DataError(f"no such folder: {root} (pass --dir, the folder holding the WMT14 "
                            "en-de files)")
        self.root = root
        index: dict[str, list[Path]] = {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in filenames:
                index.setdefault(f, []).append(Path(dirpath) / f)
        self.train = {(c, lang): self._find(index, [f"{c}.{lang}"], f"{c}.{lang}")
                      for c in CORPORA for lang in LANGS}
        self.eval = {(s, lang): self._find(index, eval_candidates(s, lang),
                                           " or ".join(eval_candidates(s, lang)))
                     for s in ("valid", "test") for lang in LANGS}

    def _find(self, index: dict[str, list[Path]], names: list[str], what: str) -> Path:
        for name in names:
            if name in index:
                paths = sorted(index[name], key=lambda p: (len(p.parts), str(p)))
                if len(paths) > 1:
                    log.warning("wmt14: %d files named %s; using %s", len(paths), name, paths[0])
                return paths[0]
        raise DataError(f"missing file {what} under {self.root}: expected the WMT14 en-de files "
                        "(europarl-v7, commoncrawl, news-commentary-v9, newstest2013, newstest2014)")

    @property
    def inputs(self) -> list[Path]:
        return [*self.train.values(), *self.eval.values()]


# --- reading and checking -----------------------------------------------------------------------


def _lines(path: Path) -> Iterator[str]:
    with open(path, "rb") as fh:
        yield from moses.iter_lines(fh, str(path))


def _segments(path: Path) -> list[str]:
    lines = list(_lines(path))
    if path.suffix == ".sgm":
        lines = [SEG_CLOSE.sub("", SEG_OPEN.sub("", line)) for line in lines if "<seg id" in line]
    return [line.replace("’", "'") for line in lines]


def train_sizes(layout: Layout) -> dict[str, int]:
    """Pairs per training corpus; the two sides of each must have the same number of lines."""
    sizes = {}
    for c in CORPORA:
        a, b = layout.train[c, SRC], layout.train[c, TGT]
        na, nb = moses.count_lines(a), moses.count_lines(b)
        if na != nb:
            raise DataError(f"{a} has {count(na, 'line')} but {b} has {nb}: the two sides must be "
                            "line-aligned")
        sizes[c] = na
    if not sum(sizes.values()):
        raise DataError(f"{layout.train[CORPORA[0], SRC]}: the training corpora are empty")
    return sizes


def _train_stream(layout: Layout, lang: str, limit: int | None) -> Iterator[str]:
    lines = (line for c in CORPORA for line in _lines(layout.train[c, lang]))
    return islice(lines, limit) if limit is not None else lines


def eval_segments(layout: Layout) -> dict[str, list[str]]:
    """newstest2013/2014 segments as ``{"valid.en": [...], ...}``; checks emptiness and alignment."""
    evals = {}
    for split in ("valid", "test"):
        a, b = layout.eval[split, SRC], layout.eval[split, TGT]
        sa, sb = _segments(a), _segments(b)
        if not sa:
            raise DataError(f"{a}: no segments (empty, or an SGM file without <seg id> lines)")
        if len(sa) != len(sb):
            raise DataError(f"{a} has {len(sa)} segments but {b} has {len(sb)}: the two sides "
                            "must be aligned")
        evals[f"{split}.{SRC}"], evals[f"{split}.{TGT}"] = sa, sb
    return evals


def check_inputs(layout: Layout, limit: int | None) -> None:
    """Every input problem, before any stage starts: line counts, UTF-8, empty sets."""
    train_sizes(layout)
    for lang in LANGS:
        for _ in _train_stream(layout, lang, limit):
            pass
    eval_segments(layout)


# --- the text stage -----------------------------------------------------------------------------


def make_text(layout: Layout, limit: int | None, out: Path) -> None:
    sizes = train_sizes(layout)
    total = sum(sizes.values()) if limit is None else min(limit, sum(sizes.values()))
    tok = {}
    for lang in LANGS:
        tok[lang] = out / f"_tok.{lang}"
        with open(tok[lang], "w", encoding="utf-8") as fh:
            for line in moses.run(_train_stream(layout, lang, limit), TRAIN_STEPS, lang,
                                  f"wmt14: normalising+tokenising train.{lang}", total=total):
                fh.write(line + "\n")
    kept = 0
    with open(out / f"train.{SRC}", "w", encoding="utf-8") as fa, \
            open(out / f"train.{TGT}", "w", encoding="utf-8") as fb:
        for a, b in moses.clean_corpus(_lines(tok[SRC]), _lines(tok[TGT]), MIN_LEN, MAX_LEN, RATIO):
            fa.write(a + "\n")
            fb.write(b + "\n")
            kept += 1
    for lang in LANGS:
        tok[lang].unlink()
    log.info("wmt14: %d training pairs, %d kept by clean-corpus-n (%d-%d tokens, ratio %s)",
             total, kept, MIN_LEN, MAX_LEN, RATIO)
    if not kept:
        raise DataError(f"{layout.train[CORPORA[0], SRC]}: no training pair is left after cleaning")
    for key, segs in eval_segments(layout).items():
        write_lines(out / key, eval_text(segs, key.split(".")[1], f"wmt14: tokenising {key}"))


def eval_text(lines: list[str], lang: str, label: str = "wmt14: tokenising") -> list[str]:
    """Evaluation segments (tags already stripped) -> the text level of ``text/``: ``’`` -> ``'``,
    ``tokenizer.perl -a`` (no punctuation normalisation, as the reference's test set)."""
    segs = [line.replace("’", "'") for line in lines]
    return list(moses.run(segs, EVAL_STEPS, lang, label, total=len(segs)))


def text_settings(limit: int | None) -> dict:
    import sacremoses

    return {"pipeline": f"wmt14-v{VERSION}", "max_train_pairs": limit, "min_len": MIN_LEN,
            "max_len": MAX_LEN, "ratio": RATIO, "corpora": list(CORPORA),
            "sacremoses": getattr(sacremoses, "__version__", "?")}


def prepare(dir: Path, max_train_pairs: int | None = None, subword: str = "sentencepiece",
            vocab_size: int = 37000, root: Path | None = None) -> PreparedData:
    """Prepare WMT'14 en-de from a folder of the official files (cached per stage)."""
    if max_train_pairs is not None and max_train_pairs < 1:
        raise ConfigError(f"--max-train-pairs must be a positive number, not {max_train_pairs}")
    layout = Layout(Path(dir))
    root = Path(root or cache_root())
    command = ["lnexp", "prepare", "wmt14", "--dir", str(Path(dir).resolve()),
               *(["--max-train-pairs", str(max_train_pairs)] if max_train_pairs else []),
               "--subword", subword, "--vocab-size", str(vocab_size)]
    recipe = Recipe(NAME, SRC, TGT, layout.inputs, text_settings(max_train_pairs), subword,
                    vocab_size, tokenized=True, command=shlex.join(command))
    if not recipe.text_ready(root):
        check_inputs(layout, max_train_pairs)  # input errors surface before any stage starts

    def build(out: Path) -> None:
        make_text(layout, max_train_pairs, out)

    return build_from_text(recipe, build, root)


CORPUS = Corpus(
    help="WMT'14 en-de, as prepare-wmt14en2de.sh", prepare=prepare, eval_text=eval_text,
    options=(Option("--dir", "dir", "folder holding europarl-v7, commoncrawl, news-commentary-v9, "
                    "newstest2013 and newstest2014 (searched recursively)", required=True),
             Option("--max-train-pairs", "max_train_pairs", "use only the first N training pairs "
                    "(smoke runs)", type=at_least(1), metavar="N")),
    hint="lnexp prepare wmt14 --dir PATH")
