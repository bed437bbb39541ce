"""The corpora, found rather than listed: every ``configs/dataset/*.yaml`` names its ``corpus:``,
and ``lnexp/data/CORPUS.py`` registers it (its ``CORPUS``, a :class:`lnexp.data.corpus.Corpus`).
``lnexp prepare`` builds its sub-commands from them, training finds or prepares the dataset through
them, and a new corpus is its module and its YAML.
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import logging
from collections.abc import Callable
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from lnexp.data.cache import cache_root, writing
from lnexp.data.corpus import PREPARED, Corpus, PreparedData, adopt, folders, in_folder, legacy_data
from lnexp.data.subword import VocabularySize
from lnexp.errors import ConfigError, DataError
from lnexp.plural import count

log = logging.getLogger("lnexp.data")


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
    """Serialise preparation between the parallel runs of a sweep. In a cache this process cannot
    write there is nothing to serialise: its prepared data is read as it is (a stage it would have
    to build fails as such, naming LNEXP_CACHE)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a")
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def check_available(dataset) -> None:
    """Fail before any run starts if the corpus is neither shipped, given, nor prepared, or if
    LNEXP_CACHE is no folder."""
    cache_root()
    corpus = get(dataset.corpus)
    if corpus.check_dataset is not None:
        corpus.check_dataset(dataset)
        return
    _find_prepared(dataset)


def _describe(data: PreparedData) -> str:
    pairs = count(data.counts.get("train", 0), "pair", spec=",")
    return f"{data.subword} {data.vocab_size} (train {pairs}, {data.folder.name})"


def _find_prepared(dataset) -> PreparedData:
    """The prepared corpus whose src/tgt/subword/vocabulary are the dataset config's. An older
    lnexp's unkeyed folder is taken in (linked as its keyed folder) where its stages check out;
    where several preparations match (other corpus files, --max-train-pairs), the one with the
    most training pairs is used and a warning names it and the others."""
    root = cache_root()
    name, hint = dataset.corpus, get(dataset.corpus).hint
    found: dict[str, PreparedData] = {}
    for f in sorted(root.glob(f"*/{PREPARED}")):
        if f.parent.name.endswith((".tmp", ".old")):
            continue
        data = PreparedData.load(f.parent)
        if not (data.name.startswith(name) and data.src == dataset.src and data.tgt == dataset.tgt):
            continue
        if data.key:
            data = in_folder(data, f.parent)
        else:
            with writing():
                data = adopt(f.parent, root)
            if data is None:
                log.warning("%s: an older lnexp's folder whose stages do not check out: not used "
                            "(prepare it again: %s)", f.parent, hint)
                continue
        found.setdefault(data.key, data)
    vocab = int(dataset.vocab_size)
    match = sorted((d for d in found.values() if d.subword == dataset.subword
                    and d.vocab_size == vocab), key=lambda d: (-d.counts.get("train", 0), d.key))
    if not match and found:
        other = min(found.values(), key=lambda d: d.key)
        have = ", ".join(map(_describe, found.values()))
        raise DataError(f"{dataset.name} is prepared in {root} with {have}, not {dataset.subword} "
                        f"{vocab}: train with dataset.subword={other.subword} "
                        f"dataset.vocab_size={other.vocab_size}, or run `{hint} --subword "
                        f"{dataset.subword} --vocab-size {vocab}`")
    if not match:
        raise DataError(f"{dataset.name} is not prepared in {root}: run `{hint}` first "
                        "(or set LNEXP_CACHE to where it was prepared)")
    if len(match) > 1:
        log.warning("%d preparations of %s match %s %d: using the one with the most training pairs, "
                    "%s; not %s (delete the folders not wanted, or set LNEXP_CACHE)", len(match),
                    dataset.name, dataset.subword, vocab, match[0].folder,
                    ", ".join(str(d.folder) for d in match[1:]))
    if (damage := match[0].damage()) is not None:
        raise DataError(f"{damage}: prepare it again, `{match[0].command or hint}` (its damaged "
                        "stages are rebuilt)")
    return match[0]


def for_run(recorded: dict[str, Any], dataset: dict[str, Any],
            check: Callable[[PreparedData], str | None], run: str) -> PreparedData:
    """The prepared data a run trained on, found by the key its run.json records (where it was,
    else in today's cache), else rebuilt from its dataset config where the corpus is prepared on
    first use and its raw files still give that key; else one line saying how to get it.

    A run from before keys (``recorded`` without one): its key is derived from its dataset config
    and raw files where the corpus has them, and the data found is checked against what the run
    recorded (``check``: None, or what differs), never taken on trust. Raises DataError."""
    from omegaconf import OmegaConf

    root = cache_root()
    want = PreparedData.of(recorded)
    ds = OmegaConf.create(dataset)
    if not ds.get("corpus"):  # a run of an lnexp from before dataset configs named their corpus
        ds.corpus = next((c for c in corpora() if want.name.startswith(c)), want.name)
    corpus = get(str(ds.corpus))
    rebuildable = corpus.prepare_dataset is not None and corpus.dataset_key is not None
    raw = ds.get("dir") or "the shipped copy"
    keep = "or set LNEXP_CACHE to the cache it trained with"
    if want.key:
        damage = None
        for folder in (want.folder, root / f"{want.name}-{want.key}"):
            data = PreparedData.load(folder) if (folder / PREPARED).is_file() else None
            if data is not None and data.key == want.key:
                data = in_folder(data, folder)
                if (damage := data.damage()) is None:
                    return data
        where = (f"{run}'s prepared {want.name} (key {want.key}) is damaged ({damage})" if damage
                 else f"{run} trained on {want.name} (key {want.key}), which is not in {root}")
        if not rebuildable:
            how = want.command or corpus.hint or f"lnexp prepare {ds.corpus}"
            raise DataError(f"{where}: run `{how}` (the same files), {keep}")
        try:
            now = corpus.dataset_key(ds)
        except DataError as e:
            raise DataError(f"{where} and cannot be rebuilt ({e}): put its raw files back in "
                            f"{raw} (dataset.dir), {keep}") from None
        if now != want.key:
            raise DataError(f"{where}, and its raw files in {raw} have changed since (they give key "
                            f"{now}): put the run's own files back, {keep}")
        log.warning("%s: rebuilding it from %s", where if damage else
                    f"{run}: its prepared data is not in {root}", raw)
        with writing(), file_lock(root / ".prepare.lock"):
            return corpus.prepare_dataset(ds, root)
    derived = None
    if rebuildable:
        try:
            derived = corpus.dataset_key(ds)
        except DataError:
            derived = None  # its raw files are gone: the prepared folders found must check out
    tried: list[str] = []
    seen: set[Path] = set()
    extra = [root / f"{want.name}-{derived}"] if derived else []
    for folder in (*extra, want.folder, root / want.name, *folders(root, want.name)):
        if folder.resolve() in seen or not (folder / PREPARED).is_file():
            continue
        seen.add(folder.resolve())
        data = PreparedData.load(folder)
        data = in_folder(data, folder) if data.key else legacy_data(folder)
        if data is None or (derived and data.key != derived):
            continue
        if (data.src, data.tgt, data.subword) != (want.src, want.tgt, want.subword):
            continue
        problem = data.damage() or check(data)
        if problem is None:
            return data
        tried.append(f"{folder}: {problem}")
    if derived:
        log.warning("%s: no prepared %s in %s is its data: rebuilding it from %s", run, want.name,
                    root, raw)
        with writing(), file_lock(root / ".prepare.lock"):
            data = corpus.prepare_dataset(ds, root)
        problem = check(data)
        if problem is None:
            return data
        raise DataError(f"{run}: its raw files in {raw} no longer give the data it trained on "
                        f"({problem}): put the run's own files back, {keep}")
    found = tried[0] if tried else f"none in {root}"
    how = (f"put its raw files back in {raw} (dataset.dir)" if rebuildable
           else f"run `{corpus.hint or 'lnexp prepare ' + str(ds.corpus)}` on the files it trained on")
    raise DataError(f"{run} trained on {want.name} before prepared data had keys, and no prepared "
                    f"{want.name} is its data ({found}): {how}, {keep}")


def load_for_training(dataset) -> PreparedData:
    """The dataset's prepared corpus: prepared (or its damaged stages rebuilt) where the corpus is
    prepared on first use, else found and checked."""
    root = cache_root()
    corpus = get(dataset.corpus)
    if corpus.prepare_dataset is not None:
        with writing(), file_lock(root / ".prepare.lock"):
            try:
                return corpus.prepare_dataset(dataset, root)
            except VocabularySize as e:  # training's setting, not lnexp prepare's --vocab-size
                raise DataError(e.say("train with dataset.vocab_size=")) from None
    return _find_prepared(dataset)


def eval_text(corpus: str, lines: list[str], lang: str) -> list[str]:
    """Raw sentences -> the text level the corpus's ``text/`` holds (normalisation, tokenisation,
    lowercasing as its preparation does), so a raw test set is prepared exactly as its own."""
    return get(corpus).eval_text(lines, lang)
