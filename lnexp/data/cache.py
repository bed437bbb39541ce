"""Content-addressed stages: a stage reruns only when its inputs' bytes or its settings change.

Each stage writes into a temporary sibling folder and renames it into place, so an interrupted
stage never leaves a half-written output that a later run would trust. A stage that another
preparation already built from the same inputs and settings (its ``stage.json`` has the same key)
is hard-linked from there instead of rebuilt: a second vocabulary of WMT14 does not tokenise
4.5M lines again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("lnexp.data")
STAMP = "stage.json"


def cache_root() -> Path:
    """Where prepared corpora live: $LNEXP_CACHE, else ./cache."""
    return Path(os.environ.get("LNEXP_CACHE", "cache")).resolve()


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


def stage_key(stage_dir: Path) -> str | None:
    """The key a finished stage was built with (None: no finished stage there)."""
    try:
        return json.loads((stage_dir / STAMP).read_text()).get("key")
    except (OSError, ValueError, AttributeError):
        return None


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
            (tmp / STAMP).write_text(json.dumps({"stage": name, "key": key, "settings": settings},
                                                indent=1, default=str))
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
