"""Content-addressed stages: a stage reruns only when its inputs' bytes or its settings change.

Each stage writes into a temporary sibling folder and renames it into place, so an interrupted
stage never leaves a half-written output that a later run would trust.
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


def is_fresh(out_dir: Path, inputs: Iterable[Path], settings: dict) -> bool:
    """Whether ``cached_stage`` would find ``out_dir`` up to date (so callers can validate their
    inputs before any stage starts, and only when one will)."""
    stamp = out_dir / STAMP
    return stamp.is_file() and json.loads(stamp.read_text()).get("key") == fingerprint(inputs,
                                                                                        settings)


def cached_stage(
    name: str,
    out_dir: Path,
    inputs: Iterable[Path],
    settings: dict,
    build: Callable[[Path], None],
) -> tuple[Path, bool]:
    """Run ``build(tmp_dir)`` unless ``out_dir`` was built from the same inputs and settings.

    Returns (out_dir, rebuilt).
    """
    key = fingerprint(inputs, settings)
    stamp = out_dir / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        log.info("%s: up to date (%s), nothing to do", name, out_dir)
        return out_dir, False
    log.info("%s: building %s", name, out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
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
    return out_dir, True
