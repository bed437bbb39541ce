"""Dataset config -> prepared corpus, for training. The shipped corpus is prepared on first use."""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path

from lnexp.data.cache import cache_root
from lnexp.data.corpus import PreparedData
from lnexp.errors import DataError

PREPARE_HINT = {
    "iwslt14": "lnexp prepare iwslt14 --archive PATH/de-en.tgz",
    "wmt14": "lnexp prepare wmt14 --dir PATH",
}


@contextmanager
def file_lock(path: Path):
    """Serialise preparation between the parallel runs of a sweep."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def check_available(dataset) -> None:
    """Fail before any run starts if the corpus is neither shipped, given, nor prepared."""
    if dataset.corpus == "multi30k":
        from lnexp.data import multi30k

        raw = Path(dataset.get("dir") or multi30k.default_dir())
        missing = [f"{stem}.{lang}.gz" for stem in multi30k.FILES.values()
                   for lang in (dataset.src, dataset.tgt) if not (raw / f"{stem}.{lang}.gz").is_file()]
        if missing:
            raise DataError(f"{raw} lacks {', '.join(missing)}: point dataset.dir at a folder with "
                            "Multi30k's raw *.gz files (or drop it to use the shipped copy)")
        return
    _find_prepared(dataset)


def _find_prepared(dataset) -> PreparedData:
    root = cache_root()
    corpus = dataset.corpus
    if corpus not in PREPARE_HINT:
        raise DataError(f"unknown corpus {corpus!r}: use dataset=multi30k, iwslt14_de_en or wmt14_en_de")
    for f in sorted(root.glob("*/prepared.json")):
        data = PreparedData.load(f.parent)
        if data.name.startswith(corpus) and data.src == dataset.src and data.tgt == dataset.tgt:
            if data.subword != dataset.subword:
                raise DataError(f"{dataset.name} was prepared with {data.subword}: train with "
                                f"dataset.subword={data.subword}, or re-run `{PREPARE_HINT[corpus]} "
                                f"--subword {dataset.subword}`")
            return data
    raise DataError(f"{dataset.name} is not prepared in {root}: run `{PREPARE_HINT[corpus]}` first "
                    "(or set LNEXP_CACHE to where it was prepared)")


def load_for_training(dataset) -> PreparedData:
    root = cache_root()
    corpus = dataset.corpus
    with file_lock(root / ".prepare.lock"):
        if corpus == "multi30k":
            from lnexp.data import multi30k

            raw = dataset.get("dir")
            return multi30k.prepare(Path(raw) if raw else None, src=dataset.src, tgt=dataset.tgt,
                                    subword=dataset.subword, vocab_size=int(dataset.vocab_size),
                                    root=root)
    return _find_prepared(dataset)


def eval_text(corpus: str, lines: list[str], lang: str) -> list[str]:
    """Raw sentences -> the text level the corpus's ``text/`` holds (normalisation, tokenisation,
    lowercasing as its preparation does), so a raw test set is prepared exactly as its own."""
    import importlib

    modules = {"multi30k": "multi30k", "iwslt14": "iwslt14", "wmt14": "wmt14"}
    if corpus not in modules:
        raise DataError(f"unknown corpus {corpus!r}: use dataset=multi30k, iwslt14_de_en or wmt14_en_de")
    return importlib.import_module(f"lnexp.data.{modules[corpus]}").eval_text(lines, lang)
