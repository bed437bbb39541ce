"""``lnexp figure report``: report/README.md, every figure and a claim-by-claim table.

Everything measured is read from what the figure commands wrote (figures/*_checks.json,
figures/*_summary.csv); nothing measured is written here by hand. A figure whose files are missing
gets "not run yet: make NAME" in report/README.md instead of failing; in README's claims block
(``--readme``) its rows stay as they were measured, with their scale and date: a command that
only reads results never erases committed ones. Checks files are read as
:class:`lnexp.figures.checks.Check` rows, the one schema every figure writes.
"""

from __future__ import annotations

import csv
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

from lnexp.errors import ArgumentParser, UserError
from lnexp.figures import registry
from lnexp.figures.checks import Check, all_required_hold, read_checks, thresholded
from lnexp.names import SCALES, describe_arch
from lnexp.plural import count
from lnexp.rundir import read_json, run_paths, write_text

RUN_COLUMNS = ["run", "lr", "warmup", "seed", "status", "diverged_update", "final_epoch",
               "final_valid_loss", "final_valid_loss_nats", "final_valid_bleu"]
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
How the paper's settings map to the mini scale (docs/reproduction.md):
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


def _cell(text: str) -> str:
    """A table cell: pipes escaped, on one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def claims_supported(doc: dict[str, Any], checks: list[Check]) -> str:
    """"k of n" for a figure whose claims are all informational: the figure's own count (it may
    leave rows that are not claims out of it), else the rows that hold."""
    if doc.get("claims_supported"):
        return str(doc["claims_supported"])
    return f"{sum(c.holds is True for c in checks)} of {len(checks)}"


def holds_text(c: Check) -> str:
    if "verdict" in c.measured:  # a claim with its own test (the atlas): its verdict as it stands
        return _cell(c.measured["verdict"])
    text = {True: "yes", False: "**no**", None: "reported (no threshold)"}[c.holds]
    return text + ("" if c.required else " (informational)")


def check_rows(checks: list[Check]) -> list[dict[str, str]]:
    """A figure's checks as table rows: claim, paper, ours, holds."""
    return [{"claim": _cell(c.claim), "paper": _cell(c.paper), "ours": _cell(c.ours),
             "holds": holds_text(c)} for c in checks]


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
    from lnexp.runtime.host import cpu_model

    model = cpu_model()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import torch

        threads = torch.get_num_threads()
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        tv = torch.__version__
    except Exception:
        threads, gpu, tv = "?", "?", "?"
    return (f"{model}, {count(cores, 'core')} available, torch {tv} with {count(threads, 'thread')}, "
            f"GPU: {gpu}; "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def data_line(runs_root: Path, scale: str) -> str:
    from lnexp.results import collect_runs

    for r in collect_runs(runs_root):
        data = (read_json(run_paths(r.dir)["run"]) or {}).get("data") or {}
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
    for name, fig in registry.figures().items():
        out += [f"## {fig.title}", ""]
        read = read_checks(figures / f"{name}_checks.json")
        doc, checks = read if read is not None else (None, [])
        png = figures / f"{name}.png"
        if doc is None and not png.is_file():
            out += [f"not run yet: make {name}" + (f" SCALE={scale}" if scale != "mini" else ""), ""]
            summary.append((name, "not run yet"))
            continue
        if doc is not None and doc.get("scale") not in (None, scale):
            out += [f"(these files were made at scale `{doc.get('scale')}`, not `{scale}`)", ""]
        for img in (name, *fig.images):
            if (figures / f"{img}.png").is_file():
                out += [f"![{img}]({rel}/{img}.png)", ""]
        for table in (figures / t for t in fig.tables):
            if table.is_file():
                out += [f"From `{table.as_posix()}`:", "", table.read_text().strip(), ""]
        rows = check_rows(checks)
        if rows:
            out += ["| claim of the paper | paper's value | our value at this scale | holds? |",
                    "|---|---|---|---|"]
            out += [f"| {r['claim']} | {r['paper']} | {r['ours']} | {r['holds']} |" for r in rows]
            out += ["", "Required rows are what this scale must show; informational rows compare the "
                    "paper's other settings: `yes` where our runs agree with the paper, `no` where they "
                    "do not.", ""]
            verdict = "all required checks hold" if all_required_hold(checks) else "some checks do not hold"
            if not any(c.required for c in checks):  # claims to test, none required
                verdict = f"{claims_supported(doc, checks)} claims supported by our runs"
            summary.append((name, verdict))
        else:
            out += [f"no checks file ({name}_checks.json)", ""]
            summary.append((name, "figure only"))
        out += _summary_table(figures / f"{name}_summary.csv", list(fig.summary_columns or RUN_COLUMNS))
    out += ["## Summary", "", "| figure | result |", "|---|---|"]
    out += [f"| {n} | {v} |" for n, v in summary]
    out += ["", "Numbers above are read from the figures' CSV and JSON files; regenerate with "
            f"`make report SCALE={scale}`.", ""]
    return "\n".join(out)


README_BEGIN = "<!-- claims: written by `make report` (lnexp figure report --readme README.md) -->"
README_END = "<!-- end of claims -->"
CLAIMS_INTRO = ("Read from `figures/*_checks.json` by `make report`: a figure's rows are rewritten "
                "only from its checks file, the others are kept as measured (scale and date in the "
                "last column); `report/README.md` (same command) has every row and figure.")
CLAIMS_HEADER = ["| figure | claim of the paper | paper | ours | holds? | measured |",
                 "|---|---|---|---|---|---|"]
INFORMATIONAL = "Informational (no threshold at this scale; each claim in `report/README.md`): "
ATLAS_INTRO = "Stability atlas claims"  # the atlas's own table: each claim with its test and verdict
ATLAS_HEADER = ["| claim (the papers' words) | test | arms (n) | statistic | p (Holm) | verdict |",
                "|---|---|---|---|---|---|"]
NOT_RUN = "Not run yet for this table: "
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
_SCALE = re.compile(r"Scale `(\w+)`")


def _row_title(title: str) -> str:
    return title.split(" (")[0]


def _note_title(title: str) -> str:
    return title.split(":")[0]


def measured_on(path: Path, doc: dict[str, Any], scale: str) -> str:
    """'mini, 2026-12-01': the scale of a checks file and the day it was written."""
    when = time.strftime("%Y-%m-%d", time.localtime(path.stat().st_mtime))
    made_at = doc.get("scale") or scale
    return f"{made_at}, {when}"


def new_claims(figures: Path, scale: str) -> dict[str, tuple[list[str], str | None]]:
    """Per figure with a checks file: its table rows (required claims with a threshold) and its
    informational note (figures whose claims are all informational)."""
    out = {}
    for name, fig in registry.figures().items():
        path = figures / f"{name}_checks.json"
        read = read_checks(path)
        if read is None:
            continue
        doc, checks = read
        when = measured_on(path, doc, scale)
        rows = [f"| {_row_title(fig.title)} | {r['claim']} | {r['paper']} | {r['ours']} | {r['holds']} | "
                f"{when} |" for r in check_rows(thresholded(checks))]
        note = None
        if checks and not any(c.required for c in checks):  # claims tested, none required
            supported = claims_supported(doc, checks)
            note = f"{_note_title(fig.title)}: {supported} claims supported by our runs ({when})"
        out[name] = (rows, note)
    return out


def old_claims(block: str) -> dict[str, tuple[list[str], str | None]]:
    """The rows and notes of a claims block already in README, per figure, each with the scale and
    date it was measured (blocks of older versions: the ones their intro line names)."""
    scale = (_SCALE.findall(block) or ["mini"])[0]
    dates = _DATE.findall(block.split("\n| figure ")[0])
    when = f"{scale}, {dates[0]}" if dates else f"{scale}, date unknown"
    by_row = {_row_title(f.title): n for n, f in registry.figures().items()}
    by_note = {_note_title(f.title): n for n, f in registry.figures().items()}
    out: dict[str, tuple[list[str], str | None]] = {}
    for line in block.splitlines():
        if line.startswith(ATLAS_INTRO):  # the atlas's table: kept whole (atlas_claims)
            break
        if line.startswith("| ") and not line.startswith("| figure |"):
            cells = [c.strip() for c in _CELL_SPLIT.split(line)[1:-1]]
            if len(cells) == 5:  # no "measured" column yet
                cells.append(when)
            name = by_row.get(cells[0], cells[0])
            out.setdefault(name, ([], None))[0].append("| " + " | ".join(cells) + " |")
        elif line.startswith(INFORMATIONAL):
            for entry in line[len(INFORMATIONAL):].rstrip(".").split("; "):
                if not entry.strip():
                    continue
                if not entry.endswith(")") or not _DATE.search(entry.rsplit("(", 1)[-1]):
                    entry = f"{entry} ({when})"
                name = by_note.get(entry.split(":")[0], entry.split(":")[0])
                out[name] = (out.get(name, ([], None))[0], entry)
    return out


def atlas_claims(figures: Path, old_block: str) -> list[str]:
    """The atlas's claims table: per claim the papers' words, the test, the arms with n, the
    statistic, raw and Holm-adjusted p and the verdict, from atlas_checks.json (its date and
    machine in the intro line); without that file, the table ``old_block`` has, as it was."""
    read = read_checks(figures / "atlas_checks.json")
    tested = [c for c in (read[1] if read else []) if "test" in c.measured]
    if not tested:
        start = old_block.find(ATLAS_INTRO)
        return old_block[start:].replace(README_END, "").strip().splitlines() if start >= 0 else []
    doc = read[0]
    lines = [f"{ATLAS_INTRO} (`lnexp figure atlas`, {doc.get('scale')}, measured {doc.get('measured')} on "
             f"{doc.get('machine')}): each test fixed before its runs, Holm's correction across the "
             f"{len(tested)} claims at {doc.get('alpha', 0.05):g}; {doc.get('claims_decided', '?')} decided.",
             "", *ATLAS_HEADER]
    for c in tested:
        m = c.measured
        p = f"{m['p']:.3g} ({m['p_holm']:.3g})"
        if m["verdict"] == "not supported":
            p = f"refuted: {m['p_refute']:.3g} ({m['p_refute_holm']:.3g})"
        cells = [f"{c.claim}. Paper: {c.paper}", m["test"], "; ".join(m["arms"]), "; ".join(m["statistic"]),
                 p, m["verdict"]]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return lines


def claims_table(figures: Path, scale: str, old_block: str = "") -> str:
    """README's claims block: the required claims with a threshold of every figure that has a
    checks file (the paper's value, ours, holds or not, when measured), and the rows of the
    figures without one kept from ``old_block`` as they were (report/README.md keeps the
    reported-only rows)."""
    fresh, kept = new_claims(figures, scale), old_claims(old_block)
    rows: list[str] = []
    notes: list[str] = []
    missing = []
    names = [*registry.figures()] + [n for n in kept if n not in registry.figures()]
    for name in names:
        figure_rows, note = fresh.get(name) or kept.get(name) or ([], None)
        if name not in fresh and name not in kept:
            missing.append(f"`make {name}`")
        rows += figure_rows
        notes += [note] if note else []
    lines = [README_BEGIN, "", CLAIMS_INTRO, "", *CLAIMS_HEADER, *rows]
    if notes:
        lines += ["", INFORMATIONAL + "; ".join(notes) + "."]
    if missing:
        lines += ["", NOT_RUN + ", ".join(missing) + "."]
    atlas = atlas_claims(figures, old_block)
    if atlas:
        lines += ["", *atlas]
    return "\n".join([*lines, "", README_END])


def claims_block(path: Path) -> tuple[str, int, int]:
    """``path``'s text and where its claims block starts and ends; a file without one is a
    UserError (checked before the report is written)."""
    text = path.read_text() if path.is_file() else ""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise UserError(f"{path} has no claims block: put the lines {README_BEGIN!r} and "
                        f"{README_END!r} where the table belongs")
    return text, start, end


def update_readme(path: Path, figures: Path, scale: str) -> bool:
    """Rewrite the claims block of ``path`` (between the markers) atomically, keeping the rows no
    checks file can recompute; False (and the file untouched) when nothing changed."""
    text, start, end = claims_block(path)
    old = text[start:end + len(README_END)]
    table = claims_table(figures, scale, old)
    if table == old:
        return False
    write_text(path, text[:start] + table + text[end + len(README_END):])
    return True


def main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="lnexp figure report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="mini", choices=SCALES)
    ap.add_argument("--figures", default="figures", type=Path, help="where the figures are")
    ap.add_argument("--runs-root", default="runs", type=Path, help="where the runs are (data sizes)")
    ap.add_argument("--out", default="report", type=Path, help="report folder (README.md goes there)")
    ap.add_argument("--readme", type=Path, default=None,
                    help="also rewrite the claims table of this file (between its claims markers)")
    args = ap.parse_args(argv)
    if args.readme is not None:
        claims_block(args.readme)
    if not (args.figures.is_dir() and any(args.figures.glob("*_checks.json"))):
        raise UserError(f"no checks files in {args.figures} (*_checks.json): make the figures first "
                        "(make figures, or lnexp figure NAME), or pass --figures the folder they went to")
    args.out.mkdir(parents=True, exist_ok=True)
    text = build(args.figures, args.out, args.scale, args.runs_root)
    path = args.out / "README.md"
    write_text(path, text)
    print(f"wrote {path}")
    if args.readme is not None:
        changed = update_readme(args.readme, args.figures, args.scale)
        print(f"{'updated' if changed else 'kept'} the claims table of {args.readme}"
              + ("" if changed else " (no checks file changes a row)"))
    return 0
