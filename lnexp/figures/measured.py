"""What the figures that measure models themselves (fig3, theory) share, as ``runs.py`` is what the
figures drawn from finished runs (fig2, fig4) share: their common options, a quiet start, the
``--d-model`` widths, the summary over seeds, the three output files (NAME.csv, NAME_summary.csv,
NAME_checks.json, written atomically) and the PASS/FAIL lines.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnexp.errors import ArgumentParser
from lnexp.figures.checks import Check, print_checks, write_checks
from lnexp.names import PLACEMENTS, SCALES
from lnexp.rundir import atomic_file


def parser(name: str, description: str, runs_root_help: str) -> ArgumentParser:
    """The options both figures take: scale, output folder and stem, runs folder, config overrides."""
    p = ArgumentParser(prog=f"lnexp figure {name}", description=description)
    p.add_argument("--scale", choices=SCALES, default="mini")
    p.add_argument("--out", type=Path, default=Path("figures"))
    p.add_argument("--name", default=name, help="output file stem")
    p.add_argument("--runs-root", type=Path, default=Path("runs"), help=runs_root_help)
    p.add_argument("--override", action="append", default=[],
                   help="Hydra override of the training config, e.g. dataset=iwslt14_de_en or "
                   "dataset.dir=PATH (repeatable)")
    return p


def placements(text: str) -> tuple[str, ...]:
    """An argparse type for ``--placements``: a comma list of placement names, or ``all`` (every
    configs/placement/*.yaml, in lnexp.names.PLACEMENTS' order)."""
    if text.strip() == "all":
        return PLACEMENTS
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in PLACEMENTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown placement {', '.join(bad) or '(none given)'}: choose from all or a comma list of "
            + ",".join(PLACEMENTS))
    return tuple(dict.fromkeys(names))


def start(parse_args: Callable[[list[str]], argparse.Namespace], argv: list[str]) -> argparse.Namespace:
    """Parse the options with fairseq's and torch's warnings and INFO logs silenced for the run."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    return parse_args(argv)


def model_dims(d_model: int | None) -> dict[str, Any]:
    """fairseq options for a ``--d-model`` wide model shaped like the paper's IWSLT one (FFN 2d,
    4 heads); none when ``d_model`` is unset (the architecture's own size)."""
    if not d_model:
        return {}
    return {f"{side}_{k}": v for side in ("encoder", "decoder") for k, v in
            (("embed_dim", d_model), ("ffn_embed_dim", 2 * d_model), ("attention_heads", 4))}


def summarise(rows: list[dict[str, Any]], keys: tuple[str, ...], value: str) -> list[dict[str, Any]]:
    """Mean, sample std and count of ``row[value]`` over the rows sharing ``keys`` (i.e. over seeds)."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(float(r[value]))
    out = []
    for key, values in groups.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append({**dict(zip(keys, key, strict=True)), "mean": statistics.fmean(values),
                    "std": std, "n": len(values)})
    return out


def short(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


MARKS = ("PASS", "FAIL", "info")  # a verdict, a failed one, a value reported without a threshold


def finish(prog: str, args: argparse.Namespace, fields, rows, summary_fields, summary,
           checks: list[Check], meta: dict, plot: Callable[[], list[Path]]) -> int:
    """Write the tables, draw the figure, print the checks and what was written."""
    files = write_tables(args, fields, rows, summary_fields, summary, checks, meta)
    files += plot()
    print_checks(checks, MARKS)
    print(f"{prog}: wrote {', '.join(str(p) for p in files)} in {meta['wall_s']:.0f}s")
    return 0


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def write_csv(path: Path, fields, rows) -> None:
    with atomic_file(path) as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: _fmt(v) for k, v in r.items()} for r in rows)


def write_tables(args: argparse.Namespace, fields, rows, summary_fields, summary, checks: list[Check],
                 meta: dict) -> list[Path]:
    """Per-measurement CSV, summary CSV and the checks JSON that the report reads."""
    out, name = args.out, args.name
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / f"{name}.csv", fields, rows)
    write_csv(out / f"{name}_summary.csv", summary_fields, summary)
    return [out / f"{name}.csv", out / f"{name}_summary.csv",
            write_checks(out, name, args.scale, checks, {"meta": meta})]
