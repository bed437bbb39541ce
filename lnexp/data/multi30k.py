"""Multi30k de-en (Elliott et al., 2016), shipped in ``data/multi30k`` as the offline default.

Raw text goes straight to a joint sentencepiece model: BLEU is then sacreBLEU on detokenised
output against the untouched references.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from lnexp.data.cache import cache_root
from lnexp.data.corpus import Corpus, Option, PreparedData, Recipe, build_from_text
from lnexp.data.text import read_parallel, write_lines
from lnexp.errors import ConfigError, DataError

FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def default_dir() -> Path:
    """The shipped copy: a link to the top-level data/multi30k in a checkout, the files themselves
    in an installed wheel."""
    return (Path(__file__).parent / "multi30k_corpus").resolve()


def eval_text(lines: list[str], lang: str) -> list[str]:
    """Raw sentences -> the text level of ``text/`` (every split, so any raw test set too)."""
    return [x.strip() for x in lines]


def prepare(raw_dir: Path | None = None, src: str = "de", tgt: str = "en",
            subword: str = "sentencepiece", vocab_size: int = 8000,
            root: Path | None = None) -> PreparedData:
    raw_dir = Path(raw_dir or default_dir())
    if not raw_dir.is_dir():
        raise ConfigError(f"no such folder: {raw_dir} (--dir or dataset.dir: the folder holding the "
                          "Multi30k {train,val,test_2016_flickr}.{de,en}.gz files)")
    recipe = plan(raw_dir, src, tgt, subword, vocab_size)
    pairs = None
    if not recipe.text_ready(root):
        pairs = read_pairs(raw_dir, src, tgt)  # input errors surface before any stage starts

    def make_text(out: Path) -> None:
        for split, (s, t) in (pairs or read_pairs(raw_dir, src, tgt)).items():
            write_lines(out / f"{split}.{src}", eval_text(s, src))
            write_lines(out / f"{split}.{tgt}", eval_text(t, tgt))

    return build_from_text(recipe, make_text, root=root or cache_root())


def plan(raw_dir: Path, src: str = "de", tgt: str = "en", subword: str = "sentencepiece",
         vocab_size: int = 8000) -> Recipe:
    """What preparing ``raw_dir`` makes (its key), without making it."""
    inputs = [raw_dir / f"{stem}.{lang}.gz" for stem in FILES.values() for lang in (src, tgt)]
    command = ["lnexp", "prepare", "multi30k"]
    if raw_dir.resolve() != default_dir():
        command += ["--dir", str(raw_dir)]
    command += ["--subword", subword, "--vocab-size", str(vocab_size)]
    return Recipe(f"multi30k_{src}_{tgt}", src, tgt, inputs, {"raw": "strip"}, subword,
                  int(vocab_size), tokenized=False, command=shlex.join(command))


def read_pairs(raw_dir: Path, src: str, tgt: str) -> dict[str, tuple[list[str], list[str]]]:
    """Each split's source and target lines (line-aligned, or a DataError)."""
    return {split: read_parallel(raw_dir / f"{stem}.{src}.gz", raw_dir / f"{stem}.{tgt}.gz")
            for split, stem in FILES.items()}


def check_dataset(dataset) -> None:
    """Before any run starts: the raw files of ``dataset.dir`` (or the shipped copy) are there."""
    raw = Path(dataset.get("dir") or default_dir())
    missing = [f"{stem}.{lang}.gz" for stem in FILES.values()
               for lang in (dataset.src, dataset.tgt) if not (raw / f"{stem}.{lang}.gz").is_file()]
    if missing:
        raise DataError(f"{raw} lacks {', '.join(missing)}: point dataset.dir at a folder with "
                        "Multi30k's raw *.gz files (or drop it to use the shipped copy)")


def prepare_dataset(dataset, root: Path) -> PreparedData:
    """Prepared on first use, from the dataset config (training needs no `lnexp prepare`)."""
    raw = dataset.get("dir")
    return prepare(Path(raw) if raw else None, src=dataset.src, tgt=dataset.tgt,
                   subword=dataset.subword, vocab_size=int(dataset.vocab_size), root=root)


def dataset_key(dataset) -> str:
    """The key ``prepare_dataset`` would give (the raw files hashed, nothing built)."""
    raw = dataset.get("dir")
    return plan(Path(raw) if raw else default_dir(), dataset.get("src"), dataset.get("tgt"),
                dataset.get("subword"), int(dataset.get("vocab_size"))).key


CORPUS = Corpus(
    help="Multi30k de-en (shipped with lnexp)", prepare=prepare, eval_text=eval_text,
    options=(Option("--dir", "raw_dir", "folder with {train,val,test_2016_flickr}.{de,en}.gz "
                    "(default: the shipped data/multi30k)", metavar="DIR"),),
    check_dataset=check_dataset, prepare_dataset=prepare_dataset, dataset_key=dataset_key)
