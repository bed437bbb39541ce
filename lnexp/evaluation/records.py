"""Where ``lnexp evaluate`` writes into a run folder, and how ``lnexp results`` reads it back.

    RUN/eval/SET.CHECKPOINT.beamB.lenpenL/  hyps.txt, refs.txt, [hyps.tok], record.json

No torch or fairseq here: ``lnexp results`` imports this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EVAL_DIR = "eval"
RECORD = "record.json"


def record_dir(run_dir: Path, set_name: str, checkpoint: str, beam: int, lenpen: float) -> Path:
    return Path(run_dir) / EVAL_DIR / f"{set_name}.{checkpoint}.beam{beam}.lenpen{lenpen:g}"


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every evaluation record of a run, oldest first."""
    records = []
    for path in sorted((Path(run_dir) / EVAL_DIR).glob(f"*/{RECORD}")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: str(r.get("time", "")))


def latest(run_dir: Path, set_name: str = "test") -> dict[str, Any] | None:
    """The most recent evaluation of ``set_name`` (``test``: the dataset's test split)."""
    found = [r for r in read_records(run_dir) if r.get("set") == set_name]
    return found[-1] if found else None
