"""The files behind every figure: NAME.csv, NAME_summary.csv, NAME_checks.json (written atomically)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def write_csv(path: Path, fields, rows) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: _fmt(v) for k, v in r.items()} for r in rows)
    tmp.replace(path)


def write_tables(out: Path, name: str, fields, rows, summary_fields, summary, checks: dict,
                 meta: dict) -> list[Path]:
    """Per-measurement CSV, summary CSV and the checks JSON that the report reads."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / f"{name}.csv", fields, rows)
    write_csv(out / f"{name}_summary.csv", summary_fields, summary)
    passed = [c["pass"] for c in checks.values() if c["pass"] is not None]
    doc = {"figure": name, "all_pass": all(passed), "checks": checks, "meta": meta}
    tmp = out / f".{name}_checks.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(out / f"{name}_checks.json")
    return [out / f"{name}.csv", out / f"{name}_summary.csv", out / f"{name}_checks.json"]
