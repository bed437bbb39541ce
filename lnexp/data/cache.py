"""Content-addressed stages: a stage reruns only when its inputs' bytes or its settings change.

Each stage writes into a temporary sibling folder and renames it into place, so an interrupted
stage never leaves a half-written output that a later run would trust. A stage that another
preparation already built from the same inputs and settings (its ``stage.json`` has the same key)
is hard-linked from there instead of rebuilt: a second vocabulary of WMT14 does not tokenise
4.5M lines again. ``stage.json`` also records the size of each file the stage made: a file cut
short or removed since (a full disk, a copy that stopped) makes the stage unfinished, checked by a
stat per file rather than a hash (WMT14's binary stage is gigabytes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("lnexp.data")
STAMP = "stage.json"


def cache_root() -> Path:
    """Where prepared corpora live: $LNEXP_CACHE, else ./cache (``checked_root``)."""
    given = os.environ.get("LNEXP_CACHE")
    return checked_root(Path(given or "cache"), f"LNEXP_CACHE={given}" if given else
                        "the cache ./cache (LNEXP_CACHE unset)", "set LNEXP_CACHE to a folder")


def checked_root(root: Path, name: str, fix: str) -> Path:
    """``root`` resolved; one that is a file, or lies under one, is a DataError naming the setting
    (``name``) and the ``fix``, not a failed mkdir deep in a stage."""
    from lnexp.errors import DataError

    root = root.resolve()
    there = next((p for p in (root, *root.parents) if p.exists()), root)
    if not there.is_dir():
        raise DataError(f"{name}: {there} is a file, not a folder: {fix} (prepared corpora are kept "
                        "there; it is made if missing)")
    return root


@contextmanager
def writing(setting: str = "LNEXP_CACHE") -> Iterator[None]:
    """A preparation's writes into the cache: a full disk or a folder it cannot write is one line
    naming ``setting`` (the cache's, not runs_root=), whatever raised it."""
    from lnexp.rundir import DISK_ERRNOS, DiskError, disk_error

    then = "then run the same command again"
    try:
        yield
    except DiskError as e:  # (an atomic write: prepared.json)
        if e.path is None or e.os_error is None:
            raise
        raise disk_error(e.path, e.os_error, setting, then) from None
    except OSError as e:
        if e.errno not in DISK_ERRNOS:
            raise
        raise disk_error(Path(e.filename or cache_root()), e, setting, then) from None


def fingerprint(files: Iterable[Path], settings: dict) -> str:
    from lnexp.errors import DataError

    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for f in sorted(Path(p) for p in files):
        if not f.is_file():
            raise DataError(f"missing file {f}: check the path or download the corpus first")
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def _stamp(stage_dir: Path) -> dict:
    """The stage's stage.json ({} where there is none, or it is damaged)."""
    try:
        stamp = json.loads((stage_dir / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def file_sizes(folder: Path) -> dict[str, int]:
    """The size of each file of a stage's folder but its stage.json, by path within it."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != STAMP}


def stage_damage(stage_dir: Path) -> str | None:
    """What differs between a stage's files and the sizes its stage.json recorded: a file cut short,
    grown or gone; None where they agree (or where an older lnexp recorded no sizes)."""
    sizes = _stamp(stage_dir).get("files")
    if not isinstance(sizes, dict):
        return None
    for name, size in sizes.items():
        path = stage_dir / name
        try:
            now = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if now != size:
            return f"{path} is {now:,} bytes, not the {size:,} its {STAMP} recorded"
    return None


def stage_key(stage_dir: Path) -> str | None:
    """The key a finished stage was built with (None: no finished stage there, or one whose files
    are not those it made: ``stage_damage``)."""
    key = _stamp(stage_dir).get("key")
    return key if key is not None and stage_damage(stage_dir) is None else None


def same_stage(key: str, candidates: Iterable[Path]) -> Path | None:
    """The first of ``candidates`` (stage folders of other preparations) built with ``key``."""
    return next((c for c in candidates if stage_key(c) == key), None)


def link_tree(src: Path, dst: Path) -> None:
    """``dst``: a copy of ``src`` made of hard links (plain copies where the file system has none);
    stages are never written in place, so the two never change each other."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)


def cached_stage(
    name: str,
    out_dir: Path,
    inputs: Iterable[Path],
    settings: dict,
    build: Callable[[Path], None],
    key: str | None = None,
    reuse: Iterable[Path] = (),
) -> tuple[Path, bool]:
    """Run ``build(tmp_dir)`` unless ``out_dir`` was built from the same inputs and settings, or a
    stage folder of ``reuse`` was (then its files are linked). ``key``: the inputs' and settings'
    fingerprint where the caller has it already.

    Returns (out_dir, rebuilt).
    """
    key = key or fingerprint(inputs, settings)
    if stage_key(out_dir) == key:
        log.info("%s: up to date (%s), nothing to do", name, out_dir)
        return out_dir, False
    if (damage := stage_damage(out_dir)) is not None:
        log.warning("%s: %s: building the stage again", name, damage)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    same = same_stage(key, (c for c in reuse if c.resolve() != out_dir.resolve()))
    try:
        if same is not None:
            log.info("%s: same inputs and settings as %s: linked, not rebuilt", name, same)
            link_tree(same, tmp)
        else:
            log.info("%s: building %s", name, out_dir)
            tmp.mkdir()
            build(tmp)
            (tmp / STAMP).write_text(json.dumps({"stage": name, "key": key, "settings": settings,
                                                 "files": file_sizes(tmp)}, indent=1, default=str))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out_dir.with_name(out_dir.name + ".old")
    if out_dir.exists():
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir, same is None
