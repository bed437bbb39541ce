"""A prepared corpus, and the pipeline every corpus goes through: text -> subword -> binary.

Every preparation lives in its own folder, ``<cache>/<name>-<key>/``: the key is a hash of what
it is made of (the corpus files' bytes, the text settings, src/tgt, the subword kind and
vocabulary size; :class:`Recipe`), so two corpora or two vocabularies never share a folder and a
run that records the key finds its own data again. Inside, three cached stages: ``text/``
(word-level ``{train,valid,test}.{src,tgt}``: the BLEU references; written by the corpus's own
module), ``subword/`` (``subword.py``) and ``bin/`` (fairseq-binarised, joined dictionary:
``binarize.py``); a stage built the same way for another key is linked, not rebuilt.
``prepared.json`` describes the result. Folders of an older lnexp (``<cache>/<name>/``, no key) are
read only where their stages check out (:func:`derived_key`). Each corpus module registers itself
with a :class:`Corpus` (its ``CORPUS``), which :mod:`lnexp.data.registry` finds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from lnexp.data import binarize
from lnexp.data.binarize import binarize_stage
from lnexp.data.cache import cache_root, cached_stage, fingerprint, link_tree, stage_damage, stage_key
from lnexp.data.subword import piece_decoder, subword_stage
from lnexp.data.text import SPLITS, read_lines, split_files, write_atomic

log = logging.getLogger("lnexp.data")
STAGES = ("text", "subword", "bin")
PREPARED = "prepared.json"
LAYOUT = 1  # part of every key: bump when a stage's output would change for the same inputs


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
    key: str = ""  # what it is made of (Recipe.key); "" in an older lnexp's folder
    vocab_size: int | None = None
    command: str = ""  # the `lnexp prepare ...` that builds it again (same files, same settings)

    @property
    def folder(self) -> Path:
        return Path(self.bin_dir).parent

    def save(self, root: Path) -> None:
        """prepared.json, unless the one there says the same of this folder already (its paths may
        be those of where the cache was before it moved: every reader takes them ``in_folder``),
        so that a read-only cache that holds the prepared corpus is used as it is."""
        try:
            same = in_folder(PreparedData.load(root), root) == in_folder(self, root)
        except (OSError, ValueError, TypeError):
            same = False
        if not same:
            write_atomic(root / PREPARED, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, root: Path) -> PreparedData:
        return cls.of(json.loads((root / PREPARED).read_text()))

    @classmethod
    def of(cls, record: dict[str, Any]) -> PreparedData:
        """From prepared.json or a run's run.json `data` (of this lnexp or an older one)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known})

    def damage(self) -> str | None:
        """A file of its stages cut short or gone since the stage made it (``stage_damage``);
        None where every stage has the files it recorded."""
        return next((d for stage in STAGES if (d := stage_damage(self.folder / stage))), None)

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
    ``prepare_dataset(dataset, root)``, after ``check_dataset(dataset)`` before any run starts;
    ``dataset_key(dataset)`` is then the key that would have (the raw files hashed, nothing
    built), by which a run made before keys were recorded finds its data."""

    help: str
    prepare: Callable[..., PreparedData]
    eval_text: Callable[[list[str], str], list[str]]
    options: tuple[Option, ...] = ()
    hint: str | None = None
    check_dataset: Callable[[Any], None] | None = None
    prepare_dataset: Callable[[Any, Path], PreparedData] | None = None
    dataset_key: Callable[[Any], str] | None = None


def preparation_key(name: str, src: str, tgt: str, text_key: str, subword: str, vocab_size: int,
                    tokenized: bool) -> str:
    """The key of a preparation: its text stage's key (the corpus files' bytes and the text
    settings) and everything the later stages add."""
    blob = json.dumps({"layout": LAYOUT, "name": name, "src": src, "tgt": tgt, "text": text_key,
                       "subword": subword, "vocab_size": int(vocab_size), "tokenized": tokenized},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def folders(root: Path, name: str) -> list[Path]:
    """Every preparation of corpus ``name`` in ``root``: the keyed ones (by key), then an older
    lnexp's unkeyed ``<root>/<name>/``."""
    return [*sorted(p.parent for p in root.glob(f"{name}-*/{PREPARED}")
                    if not p.parent.name.endswith((".tmp", ".old"))),
            *([root / name] if (root / name / PREPARED).is_file() else [])]


@dataclass
class Recipe:
    """What one preparation is made of; its :attr:`key` names its folder. ``command``: the
    ``lnexp prepare`` line that makes it (named where a run's data is gone)."""

    name: str
    src: str
    tgt: str
    text_inputs: list[Path]
    text_settings: dict
    subword: str = "sentencepiece"
    vocab_size: int = 8000
    tokenized: bool = False
    command: str = ""

    @cached_property
    def text_key(self) -> str:
        """The text stage's key: hashes the corpus files once (WMT14: gigabytes)."""
        return fingerprint(self.text_inputs, self.text_settings)

    @cached_property
    def key(self) -> str:
        return preparation_key(self.name, self.src, self.tgt, self.text_key, self.subword,
                               self.vocab_size, self.tokenized)

    def folder(self, root: Path | None = None) -> Path:
        return Path(root or cache_root()) / f"{self.name}-{self.key}"

    def text_ready(self, root: Path | None = None) -> bool:
        """Whether the text stage is built already (here or for another key: then linked), so
        that a corpus reads and checks its raw files before any stage starts, and only when one
        will."""
        root = Path(root or cache_root())
        return any(stage_key(f / "text") == self.text_key for f in [self.folder(root),
                                                                     *folders(root, self.name)])


def build_from_text(recipe: Recipe, make_text: Callable[[Path], None],
                    root: Path | None = None) -> PreparedData:
    """The shared pipeline: corpus-specific text stage -> joint subword model -> binarisation,
    in the recipe's own folder; a stage another preparation built the same way is linked."""
    r, root = recipe, Path(root or cache_root())
    out = r.folder(root)
    others = folders(root, r.name)
    text_dir, _ = cached_stage(f"{r.name}/text", out / "text", r.text_inputs, r.text_settings,
                               make_text, key=r.text_key, reuse=[f / "text" for f in others])
    counts = {s: sum(1 for _ in open(text_dir / f"{s}.{r.src}", encoding="utf-8")) for s in SPLITS}
    sub_dir, model = subword_stage(r.name, out / "subword", text_dir, r.src, r.tgt, r.subword,
                                   r.vocab_size, reuse=[f / "subword" for f in others])
    bin_dir = binarize_stage(r.name, out / "bin", sub_dir, r.src, r.tgt,
                             reuse=[f / "bin" for f in others])
    data = PreparedData(r.name, r.src, r.tgt, str(bin_dir), str(text_dir), r.subword, str(model),
                        r.tokenized, counts, r.key, int(r.vocab_size), r.command)
    data.save(out)
    return data


def derived_key(folder: Path) -> str | None:
    """The key of a prepared folder: prepared.json's; for an older lnexp's folder (no key), the
    one its stages were built with, where each stage's recorded key is what its input stage holds
    now (recomputed); None where they do not check out (a stage rebuilt from other text without
    the next)."""
    try:
        data = PreparedData.load(folder)
        if data.key:
            return data.key
        stamps = {s: json.loads((folder / s / "stage.json").read_text()) for s in STAGES}
        sub, binary = stamps["subword"]["settings"], stamps["bin"]["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if binary != binarize.settings(data.src, data.tgt) or sub.get("kind") != data.subword:
        return None
    text, sub_dir = folder / "text", folder / "subword"
    if (fingerprint(split_files(text, data.src, data.tgt), sub) != stamps["subword"]["key"]
            or fingerprint(split_files(sub_dir, data.src, data.tgt), binary) != stamps["bin"]["key"]):
        return None
    return preparation_key(data.name, data.src, data.tgt, stamps["text"]["key"], data.subword,
                           int(sub["vocab"]), data.tokenized)


def legacy_data(folder: Path) -> PreparedData | None:
    """An older lnexp's prepared folder with its key filled in, or None where it does not check
    out (:func:`derived_key`)."""
    key = derived_key(folder)
    if key is None:
        return None
    vocab = json.loads((folder / "subword" / "stage.json").read_text())["settings"]["vocab"]
    return in_folder(replace(PreparedData.load(folder), key=key, vocab_size=int(vocab)), folder)


def in_folder(data: PreparedData, folder: Path) -> PreparedData:
    """``data`` with its paths in ``folder`` (where a moved cache holds it now)."""
    return replace(data, bin_dir=str(folder / "bin"), text_dir=str(folder / "text"),
                   subword_model=str(folder / "subword" / Path(data.subword_model).name))


def adopt(folder: Path, root: Path) -> PreparedData | None:
    """An older lnexp's ``<root>/<name>/``, checked, as the keyed folder of its key (its files
    linked, not copied): new runs then read keyed folders only. None where it does not check out."""
    data = legacy_data(folder)
    if data is None:
        return None
    out = root / f"{data.name}-{data.key}"
    if (out / PREPARED).is_file():
        return PreparedData.load(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for stage in STAGES:
            link_tree(folder / stage, tmp / stage)
        data = in_folder(data, out)
        data.save(tmp)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s: an older lnexp's folder, checked: now also %s (linked)", folder, out)
    return data
