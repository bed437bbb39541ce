"""``lnexp figure report``: report/README.md, every figure and a claim-by-claim table.

Everything measured is read from what the figure commands wrote (figures/*_checks.json,
figures/*_summary.csv); nothing measured is written here by hand. A figure whose files are missing
gets "not run yet: make NAME" instead of failing. Checks JSON are read generically: a list under
"checks" (or a top-level list) of objects with a claim, the paper's value, ours and pass/fail.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from lnexp.errors import ArgumentParser
from lnexp.names import SCALES, describe_arch

SECTIONS = [
    ("fig3", "Gradient norms at initialisation (Fig. 3)"),
    ("theory", "Theory at initialisation (lemmas, hidden-state growth)"),
    ("fig2", "Warm-up ablation with Post-LN (Fig. 2)"),
    ("fig4", "Convergence speed: Pre-LN without warm-up vs Post-LN (Fig. 4)"),
    ("atlas", "Stability atlas: placement x peak lr x warm-up x dt (Kim et al. 2025, Kan et al. 2025)"),
]
EXTRA_IMAGES = {"atlas": ("atlas_stability",)}  # figures drawn beside NAME.png
RUN_COLUMNS = ["run", "lr", "warmup", "seed", "status", "diverged_update", "final_epoch",
               "final_valid_loss", "final_valid_loss_nats", "final_valid_bleu"]
SUMMARY_COLUMNS = {"atlas": ["placement", "lr", "warmup", "residual_scale", "seeds", "trained", "plateau",
                             "diverged", "missing", "mean_valid_loss", "spread_valid_loss", "stable"]}
SCALE_TEXT = {
    "mini": (f"mini: {describe_arch('ln_transformer_mini')}, shared embeddings, label smoothing 0.1, "
             "dropout 0.1, 4096 tokens per batch (~130 updates per Multi30k epoch), greedy decoding "
             "for the per-epoch BLEU, CPU."),
    "gpu": (f"gpu: the paper's IWSLT model ({describe_arch('ln_transformer_iwslt_de_en')}), 4096 tokens, "
            "beam 5, on Multi30k (~128 updates per epoch; the paper's warm-ups 500/4000 -> 58/465 "
            "updates, in epochs), one GPU."),
    "paper": ("paper: the paper's architectures and batches (IWSLT14: "
              f"{describe_arch('ln_transformer_iwslt_de_en')}, 4096 tokens, beam 5; WMT14: Transformer "
              f"base, {describe_arch('ln_transformer_wmt_en_de')}, 8192 tokens x 16), GPU."),
}
MINI_MAPPING = """\
How the paper's settings map to the mini scale (configs/experiment/*_mini.yaml):
- Warm-up: the paper's 4000 updates (3.6 IWSLT epochs) become 100 updates (0.77 Multi30k epoch, the
  mini scale's calibrated warm-up); the paper's 500 keep the ratio 1:8 and become 13 updates. Taken
  proportionally in epochs, 4000 would be ~470 updates, longer than a whole 2-epoch mini run.
- "No warm-up" is warmup=0 (lr_max from the first update).
- Fig. 2 holds lr_max constant after the warm-up instead of the paper's inverse-sqrt decay: at this
  scale inverse-sqrt from the first update lowers the lr so fast that Post-LN neither stalls nor
  trains in 2 epochs, whereas lr_max held from the first update stalls it, as in the paper.
- Fig. 4 uses lr 1e-3 for every arm (the mini scale's lr) with the paper's Pre-LN schedule
  (x0.1 at epoch 8), which a 4-epoch run never reaches: every arm holds lr_max after its warm-up.
- Losses are in bits/token (fairseq's base-2 loss); "1 nat" = 1.4427 bits, converted explicitly.
"""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _first(d: dict, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return default


def _cell(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict | list):
        return json.dumps(x, default=str)[:200]
    return str(x).replace("|", "\\|").replace("\n", " ")


def check_items(doc: Any) -> list[dict]:
    """A figure's checks, from either the list form or the {"name": {...}} form."""
    items = doc.get("checks", []) if isinstance(doc, dict) else doc if isinstance(doc, list) else []
    if isinstance(items, dict):
        items = [{"claim": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in items.items()]
    return [c for c in items if isinstance(c, dict)]


def claims_supported(doc: Any) -> str:
    """"k of n" for a figure whose claims are all informational: the figure's own count (it may
    leave rows that are not claims out of it), else the rows that hold."""
    if isinstance(doc, dict) and doc.get("claims_supported"):
        return str(doc["claims_supported"])
    held = [_first(c, "pass", "passed", "holds") for c in check_items(doc)]
    return f"{sum(h is True for h in held)} of {len(held)}"


def check_rows(doc: Any) -> list[dict[str, str]]:
    """Normalise any figure's checks JSON into rows: claim, paper, ours, holds."""
    rows = []
    for c in check_items(doc):
        passed = _first(c, "pass", "passed", "holds", "ok")
        holds = {True: "yes", False: "**no**"}.get(passed, "reported (no threshold)") if isinstance(
            passed, bool | type(None)) else _cell(passed)
        if c.get("required") is False:
            holds += " (informational)"
        rows.append({"claim": _cell(_first(c, "claim", "description", "name", "id", default="")),
                     "paper": _cell(_first(c, "paper", "paper_value", "expected", default="")),
                     "ours": _cell(_first(c, "ours", "measured_text", "measured", "value", default="")),
                     "holds": holds})
    return rows


def _summary_table(path: Path, cols: list[str]) -> list[str]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    cols = [c for c in cols if c in rows[0]]
    if not cols:  # a per-layer summary (fig3, theory): its CSV is linked, not tabulated
        return [f"Summary values: `{path.as_posix()}`.", ""]
    per = "cell (placement, lr, warm-up, dt; over seeds)" if "run" not in cols else "run"
    lines = [f"Final values per {per} (from `{path.as_posix()}`; losses in bits/token):", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] or "" for c in cols) + " |" for r in rows]
    return lines + [""]


def hardware() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import torch

        threads = torch.get_num_threads()
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        tv = torch.__version__
    except Exception:
        threads, gpu, tv = "?", "?", "?"
    return (f"{model}, {cores} cores available, torch {tv} with {threads} threads, GPU: {gpu}; "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def data_line(runs_root: Path, scale: str) -> str:
    from lnexp.results import collect_runs

    for r in collect_runs(runs_root):
        data = (_read_json(r.dir / "run.json") or {}).get("data") or {}
        if data and r.experiment.endswith(scale):
            counts = data.get("counts") or {}
            sizes = ", ".join(f"{k} {v}" for k, v in counts.items())
            return (f"{data.get('name')} {data.get('src')}-{data.get('tgt')} ({data.get('subword')}, "
                    f"{sizes or 'sizes not recorded'})")
    return ("Multi30k de-en (shipped in data/multi30k: 29,000 train / 1,014 valid / 1,000 test pairs)"
            if scale in ("mini", "gpu") else "IWSLT14 de-en and WMT14 en-de (prepared with lnexp prepare)")


def build(figures: Path, report_dir: Path, scale: str, runs_root: Path) -> str:
    rel = os.path.relpath(figures, report_dir)
    out = [f"# lnexp report: LayerNorm placement (Xiong et al. 2020), scale `{scale}`", "",
           f"- **Scale**: {SCALE_TEXT.get(scale, scale)}",
           f"- **Data**: {data_line(runs_root, scale)}",
           f"- **Hardware**: {hardware()}", ""]
    if scale == "mini":
        out += [MINI_MAPPING]
    summary = []
    for name, title in SECTIONS:
        out += [f"## {title}", ""]
        doc = _read_json(figures / f"{name}_checks.json")
        png = figures / f"{name}.png"
        if doc is None and not png.is_file():
            out += [f"not run yet: make {name}" + (f" SCALE={scale}" if scale != "mini" else ""), ""]
            summary.append((name, "not run yet"))
            continue
        if isinstance(doc, dict) and doc.get("scale") not in (None, scale):
            out += [f"(these files were made at scale `{doc.get('scale')}`, not `{scale}`)", ""]
        for img in (name, *EXTRA_IMAGES.get(name, ())):
            if (figures / f"{img}.png").is_file():
                out += [f"![{img}]({rel}/{img}.png)", ""]
        rows = check_rows(doc) if doc is not None else []
        if rows:
            out += ["| claim of the paper | paper's value | our value at this scale | holds? |",
                    "|---|---|---|---|"]
            out += [f"| {r['claim']} | {r['paper']} | {r['ours']} | {r['holds']} |" for r in rows]
            out += ["", "Required rows are what this scale must show; informational rows compare the "
                    "paper's other settings: `yes` where our runs agree with the paper, `no` where they "
                    "do not.", ""]
            req = [c for c in check_items(doc) if c.get("required", True)
                   and _first(c, "pass", "passed", "holds") is not None]
            verdict = "all required checks hold" if req and all(
                _first(c, "pass", "passed", "holds") is True for c in req) else "some checks do not hold"
            if not any(c.get("required", True) for c in check_items(doc)):  # claims to test, none required
                verdict = f"{claims_supported(doc)} claims supported by our runs"
            summary.append((name, verdict))
        else:
            out += [f"no checks file ({name}_checks.json)", ""]
            summary.append((name, "figure only"))
        out += _summary_table(figures / f"{name}_summary.csv", SUMMARY_COLUMNS.get(name, RUN_COLUMNS))
    out += ["## Summary", "", "| figure | result |", "|---|---|"]
    out += [f"| {n} | {v} |" for n, v in summary]
    out += ["", "Numbers above are read from the figures' CSV and JSON files; regenerate with "
            f"`make report SCALE={scale}`.", ""]
    return "\n".join(out)


README_BEGIN = "<!-- claims: written by `make report` (lnexp figure report --readme README.md) -->"
README_END = "<!-- end of claims -->"


def claims_table(figures: Path, scale: str) -> str:
    """The required claims with a threshold of every figure that was run: the paper's value, ours,
    holds or not (report/README.md keeps the reported-only rows)."""
    lines = [README_BEGIN, "",
             f"Scale `{scale}`, read from `{figures.as_posix()}/*_checks.json` by `make report` on "
             f"{time.strftime('%Y-%m-%d')}; `report/README.md` (same command) has every row and figure.",
             "", "| figure | claim of the paper | paper | ours | holds? |", "|---|---|---|---|---|"]
    missing, informational = [], []
    for name, title in SECTIONS:
        doc = _read_json(figures / f"{name}_checks.json")
        if doc is None:
            missing.append(f"`make {name}`")
            continue
        items = check_items(doc)
        required = [c for c in items if c.get("required", True)  # thresholds only
                    and _first(c, "pass", "passed", "holds") is not None]
        for row in check_rows({"checks": required}):
            lines.append(f"| {title.split(' (')[0]} | {row['claim']} | {row['paper']} | {row['ours']} | "
                         f"{row['holds']} |")
        if items and not any(c.get("required", True) for c in items):  # claims tested, none required
            informational.append(f"{title.split(':')[0]}: {claims_supported(doc)} claims supported "
                                 "by our runs")
    if informational:
        lines += ["", "Informational (no threshold at this scale; each claim in `report/README.md`): "
                  + "; ".join(informational) + "."]
    if missing:
        lines += ["", "Not run yet for this table: " + ", ".join(missing) + "."]
    return "\n".join([*lines, "", README_END])


def update_readme(path: Path, table: str) -> None:
    """Replace the claims block of ``path`` (between the markers) with ``table``, atomically."""
    from lnexp.errors import UserError

    text = path.read_text() if path.is_file() else ""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise UserError(f"{path} has no claims block: put the lines {README_BEGIN!r} and "
                        f"{README_END!r} where the table belongs")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text[:start] + table + text[end + len(README_END):])
    tmp.replace(path)


def main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="lnexp figure report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="mini", choices=SCALES)
    ap.add_argument("--figures", default="figures", type=Path, help="where the figures are")
    ap.add_argument("--runs-root", default="runs", type=Path, help="where the runs are (data sizes)")
    ap.add_argument("--out", default="report", type=Path, help="report folder (README.md goes there)")
    ap.add_argument("--readme", type=Path, default=None,
                    help="also rewrite the claims table of this file (between its claims markers)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text = build(args.figures, args.out, args.scale, args.runs_root)
    path = args.out / "README.md"
    tmp = path.with_name(".README.md.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    print(f"wrote {path}")
    if args.readme is not None:
        update_readme(args.readme, claims_table(args.figures, args.scale))
        print(f"updated the claims table of {args.readme}")
    return 0
