"""The corpora, found rather than listed: every ``configs/dataset/*.yaml`` names its ``corpus:``,
and ``lnexp/data/CORPUS.py`` registers it (its ``CORPUS``, a :class:`lnexp.data.corpus.Corpus`).
``lnexp prepare`` builds its sub-commands from them, training finds or prepares the dataset through
them, and a new corpus is its module and its YAML.
"""

from __future__ import annotations

import fcntl
import importlib
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from lnexp.data.cache import cache_root
from lnexp.data.corpus import Corpus, PreparedData
from lnexp.errors import ConfigError, DataError


@cache
def datasets() -> dict[str, dict[str, Any]]:
    """Each corpus's dataset config (configs/dataset/*.yaml; the first file, by name, naming it)."""
    from omegaconf import OmegaConf

    from lnexp.config import CONFIG_DIR

    out: dict[str, dict[str, Any]] = {}
    for path in sorted((CONFIG_DIR / "dataset").glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        if not isinstance(cfg, dict) or not cfg.get("corpus"):
            raise ConfigError(f"{path} has no `corpus:` key: name the lnexp/data module that prepares it")
        out.setdefault(str(cfg["corpus"]), cfg)
    return out


@cache
def corpora() -> dict[str, Corpus]:
    """The registered corpora, by the name ``lnexp prepare`` and the dataset YAMLs use."""
    out = {}
    for name in datasets():
        try:
            module = importlib.import_module(f"lnexp.data.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"lnexp.data.{name}":
                raise
            module = None
        corpus = getattr(module, "CORPUS", None)
        if not isinstance(corpus, Corpus):
            raise ConfigError(f"configs/dataset names corpus {name!r}, but lnexp/data/{name}.py does "
                              "not register it: give that module a CORPUS = Corpus(...)")
        out[name] = corpus
    return out


def default_vocab(name: str) -> int:
    """The subword vocabulary size of the corpus's dataset config."""
    return int(datasets()[name]["vocab_size"])


def get(name: str) -> Corpus:
    """The corpus a dataset config names; an unknown one is a DataError naming the configs."""
    known = corpora()
    if name not in known:
        from lnexp.config import CONFIG_DIR

        configs = sorted(p.stem for p in (CONFIG_DIR / "dataset").glob("*.yaml"))
        raise DataError(f"unknown corpus {name!r}: use dataset={', '.join(configs[:-1])} or {configs[-1]}")
    return known[name]


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
    corpus = get(dataset.corpus)
    if corpus.check_dataset is not None:
        corpus.check_dataset(dataset)
        return
    _find_prepared(dataset)


def _find_prepared(dataset) -> PreparedData:
    root = cache_root()
    name = dataset.corpus
    hint = get(name).hint
    for f in sorted(root.glob("*/prepared.json")):
        data = PreparedData.load(f.parent)
        if data.name.startswith(name) and data.src == dataset.src and data.tgt == dataset.tgt:
            if data.subword != dataset.subword:
                raise DataError(f"{dataset.name} was prepared with {data.subword}: train with "
                                f"dataset.subword={data.subword}, or re-run `{hint} "
                                f"--subword {dataset.subword}`")
            return data
    raise DataError(f"{dataset.name} is not prepared in {root}: run `{hint}` first "
                    "(or set LNEXP_CACHE to where it was prepared)")


def load_for_training(dataset) -> PreparedData:
    root = cache_root()
    corpus = get(dataset.corpus)
    with file_lock(root / ".prepare.lock"):
        if corpus.prepare_dataset is not None:
            return corpus.prepare_dataset(dataset, root)
    return _find_prepared(dataset)


def eval_text(corpus: str, lines: list[str], lang: str) -> list[str]:
    """Raw sentences -> the text level the corpus's ``text/`` holds (normalisation, tokenisation,
    lowercasing as its preparation does), so a raw test set is prepared exactly as its own."""
    return get(corpus).eval_text(lines, lang)
