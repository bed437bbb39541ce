"""``lnexp results``: the table of runs under a runs root, and the Python API figures read runs through.

    lnexp results [RUNS_ROOT] [KEY=VALUE ...] [--group-by KEY[,KEY]] [--csv [PATH|-]] [--lr-sensitivity]

A run is a directory holding ``.hydra/config.yaml`` or ``status.json`` (what ``lnexp train`` writes).
Its configuration comes from ``run.json`` (resolved) or else Hydra's ``.hydra/config.yaml``; its
state from ``status.json``, in the words of ``lnexp.run_status`` (done, stopped, plateau, diverged,
failed, running, interrupted, pending; a folder of an older lnexp is read in today's words), which
the ``note`` column spells out (``stopped at 64 updates, 1/2 epochs``); its curves from
``metrics.jsonl``. The runs root is ``runs`` unless named (a folder, or ``--runs-root``). Filters
match table columns (``placement=post_ln status=stopped experiment=fig2_mini``) or dotted config
keys (``dataset.name=multi30k``); numbers compare as numbers (``lr=1e-3`` matches ``lr=0.001``); a key
that is neither is an error. ``test_bleu`` is the latest ``lnexp evaluate`` of the test split
(``RUN/eval/``), with the checkpoint it used. ``--group-by placement,warmup`` prints one row per
group instead: n, the seeds, and the mean ± half-width of the 95% t-interval of each score
(``lnexp.stats``), plus the config keys other than the seed that vary inside the group; runs of
another length (max_update/max_epoch) or status are never pooled, each gets its own row.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnexp import overrides as override
from lnexp import run_status
from lnexp.errors import ArgumentParser, UserError, cannot_write, output_file
from lnexp.plural import count
from lnexp.rundir import CHECKPOINTS, STATUS, effective_status, read_json, read_metrics, run_paths

COLUMNS = ("run", "experiment", "dataset", "scale", "placement", "norm", "residual_scale", "optimizer",
           "lr", "warmup", "schedule", "depth", "params", "seed", "epochs", "max_epoch", "updates",
           "best_valid_loss", "best_bleu", "test_bleu", "test_checkpoint", "status", "diverged_update",
           "diverged_reason", "note", "error")
# what each means: lnexp.run_status.MEANING. "interrupted": status.json says running (or
# interrupted) but its process is gone (Ctrl-C, SIGKILL, OOM, a dead node:
# rundir.effective_status); re-running the same command resumes it.
STATUSES = run_status.STATUSES


@dataclass
class Run:
    """One run directory: its resolved config, status and per-epoch metrics."""

    dir: Path
    name: str
    config: dict[str, Any]
    status: dict[str, Any]
    metrics: list[dict[str, Any]]
    overrides: list[str] = field(default_factory=list)
    params: int | None = None  # parameters of the model (run.json)
    test: dict[str, Any] | None = None  # the latest `lnexp evaluate` record of the test split
    entropy: float | None = None  # unigram entropy of the training targets, bits (run.json)

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def experiment(self) -> str:
        name = override.value(self.overrides, "experiment")
        return "" if name is None else str(name)

    @property
    def scale(self) -> str | None:
        """mini or paper (older runs: told by the architecture)."""
        name = self.get("scale.name")
        if name is None and self.get("scale.arch") is not None:
            return "mini" if self.get("scale.arch") == "ln_transformer_mini" else "paper"
        return name

    @property
    def final(self) -> dict[str, Any]:
        """status.json as it stands (a dead ``running`` is ``interrupted``), in today's words."""
        status = effective_status(self.status)
        max_epoch = self.get("max_epoch")
        return run_status.normalise(status, int(max_epoch) if max_epoch is not None else None,
                                    self._on_plateau_now())

    def _on_plateau_now(self) -> bool | None:
        """Whether the last validation is on the plateau by the run's own rule (None: unknown), for
        the folders of older lnexp that kept a plateau seen at an earlier epoch."""
        margin = self.get("divergence.plateau_margin")
        nll = self.metrics[-1].get("valid_nll_loss") if self.metrics else None
        if self.entropy is None or margin is None or nll is None:
            return None
        return float(nll) >= float(self.entropy) - float(margin)

    @property
    def state(self) -> str:
        return str(self.final.get("status") or "pending")

    @property
    def diverged(self) -> dict | None:
        """The NaN/inf record of a diverged run (a plateau is not one: ``plateau``)."""
        return self.final.get("diverged") or None

    @property
    def plateau(self) -> dict | None:
        """The plateau rule's record of a run that ended on the plateau."""
        return self.final.get("plateau") or None

    def series(self, key: str) -> list[float]:
        return [float(r[key]) if r.get(key) is not None else math.nan for r in self.metrics]

    def row(self) -> dict[str, Any]:
        valid = [v for v in self.series("valid_loss") if math.isfinite(v)]
        bleu = [v for v in self.series("valid_bleu") if math.isfinite(v)]
        final = self.final
        div, state = final.get("diverged") or {}, str(final.get("status") or "pending")
        enc, dec = self.get("depth.encoder_layers"), self.get("depth.decoder_layers")
        test = self.test or {}
        return {
            "run": self.name, "experiment": self.experiment, "dataset": self.get("dataset.name"),
            "scale": self.scale, "placement": self.get("placement.name"),
            "norm": self.get("norm.name", self.get("norm")),  # a string in runs before the norm group
            "residual_scale": self.get("residual_scale"), "optimizer": self.get("optimizer.name"),
            "lr": self.get("lr"), "warmup": self.get("warmup"), "schedule": self.get("schedule.name"),
            "depth": f"{enc}+{dec}" if enc is not None else None, "params": self.params,
            "seed": self.get("seed"),
            "epochs": len(self.metrics), "max_epoch": self.get("max_epoch"),
            "updates": max(int(self.status.get("updates") or 0),
                           int(self.metrics[-1]["updates"]) if self.metrics else 0),
            "best_valid_loss": min(valid) if valid else None, "best_bleu": max(bleu) if bleu else None,
            "test_bleu": test.get("bleu"), "test_checkpoint": test.get("checkpoint"),
            "status": state, "diverged_update": div.get("update"),
            "diverged_reason": div.get("reason"), "note": run_status.note(final) or None,
            "error": self.status.get("error") if state == "failed" else None,
        }


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(path)
        try:
            return OmegaConf.to_container(cfg, resolve=True)
        except Exception:  # interpolations that only Hydra can resolve
            return OmegaConf.to_container(cfg, resolve=False)
    except Exception:
        return None


def load_run(run_dir: Path, root: Path | None = None) -> Run:
    run_dir = Path(run_dir)
    paths = run_paths(run_dir)
    meta = read_json(paths["run"], {}) or {}
    config = meta.get("config") or _read_yaml(run_dir / ".hydra" / "config.yaml") or {}
    overrides = _read_yaml(run_dir / ".hydra" / "overrides.yaml") or []
    name = str(run_dir.relative_to(root)) if root is not None else run_dir.name
    status = read_json(paths["status"], None)
    if status is None and paths["status"].is_file():  # there, but not JSON: never read as pending
        status = {"status": "damaged"}
    return Run(run_dir, name, config, status if isinstance(status, dict) else {},
               read_metrics(paths["metrics"]), [str(o) for o in overrides],
               meta.get("params"), latest_evaluation(run_dir, "test", meta.get("data")),
               meta.get("unigram_entropy_bits"))


def find_run_dirs(root: Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = set()
    for marker in (STATUS, ".hydra/config.yaml"):
        for p in root.glob(f"**/{marker}"):
            d = p.parent.parent if marker.startswith(".hydra") else p.parent
            if CHECKPOINTS not in d.parts:
                found.add(d)
    return sorted(found)


def _matches(value: Any, wanted: str) -> bool:
    if value is None:
        return wanted.lower() in ("none", "null", "")
    if isinstance(value, bool):
        return str(value).lower() == wanted.lower()
    try:
        return math.isclose(float(value), float(wanted), rel_tol=1e-9, abs_tol=0.0)
    except (TypeError, ValueError):
        return str(value) == wanted


def collect_runs(root: Path | str = "runs", **filters: Any) -> list[Run]:
    """Every run under ``root`` that matches ``filters`` (column or dotted config key -> value)."""
    root = Path(root)
    runs = [load_run(d, root) for d in find_run_dirs(root)]
    check_filter_keys(runs, filters)
    out = []
    for run in runs:
        row = run.row()
        ok = True
        for key, wanted in filters.items():
            key = key.replace("__", ".")
            value = row[key] if key in row else run.get(key, _MISSING)
            if value is _MISSING or not _matches(value, str(wanted)):
                ok = False
                break
        if ok:
            out.append(run)
    return out


_MISSING = object()


def check_filter_keys(runs: list[Run], filters: dict[str, Any]) -> None:
    """A key that is neither a column, a config key of any run, nor a key of the training config
    is a typo, whatever the runs are: say so."""
    import difflib

    from lnexp.config import config_keys

    for key in filters:
        key = key.replace("__", ".")
        if key in COLUMNS or any(r.get(key, _MISSING) is not _MISSING for r in runs):
            continue
        schema = config_keys()
        if key in schema:
            continue
        known = [*COLUMNS, *sorted({*schema, *(k for r in runs for k in dotted_keys(r.config))})]
        near = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        columns = [c for c in COLUMNS[1:] if c not in ("diverged_reason", "note", "error")]
        raise UserError(f"unknown filter key {key!r}: {hint}use a column ({', '.join(columns)}) "
                        "or a dotted config key (e.g. dataset.name)")


def dotted_keys(node: Any, prefix: str = "") -> list[str]:
    """Every key of a nested config as a dotted path: ``dataset``, ``dataset.name``, ..."""
    if not isinstance(node, dict):
        return []
    keys = []
    for k, v in node.items():
        keys.append(prefix + str(k))
        keys += dotted_keys(v, f"{prefix}{k}.")
    return keys


def runs_root_of(items: list[str], given: Path | None) -> tuple[Path, list[str]]:
    """The runs root and the filters among ``items``: without ``--runs-root`` (``given``), the first
    word without ``=`` names the folder (default ``runs``); every other word is a filter."""
    folder = next((i for i in items if "=" not in i), None) if given is None else None
    if folder is None:
        return (given if given is not None else Path("runs")), items
    rest = list(items)
    rest.remove(folder)
    if not Path(folder).is_dir():
        raise UserError(f"no runs root {folder}: name a folder of runs (lnexp results runs) or give "
                        "filters as KEY=VALUE (e.g. placement=post_ln)")
    return Path(folder), rest


def parse_filters(items: list[str]) -> dict[str, str]:
    filters = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"filter {item!r} is not KEY=VALUE: e.g. placement=post_ln status=diverged")
        key, value = item.split("=", 1)
        if not key:
            raise UserError(f"filter {item!r} has no key: e.g. warmup=0")
        if key == "status" and value not in STATUSES:
            raise UserError(f"status={value!r} is not one of {', '.join(STATUSES)}")
        filters[key] = value
    return filters


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}"
    return str(value)


def _count(n: Any) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}M" if n >= 1e5 else str(n)


def table(rows: list[dict[str, Any]]) -> str:
    cols = [c for c in COLUMNS if c not in ("diverged_update", "diverged_reason", "max_epoch",
                                            "test_checkpoint", "error")]
    head = {"best_valid_loss": "best_valid", "residual_scale": "dt",
            "test_bleu": "test_bleu(ckpt)"}
    cells = [[head.get(c, c) for c in cols]]
    for r in rows:
        cell = [_fmt(r[c]) for c in cols]
        cell[cols.index("epochs")] = f"{r['epochs']}/{_fmt(r['max_epoch'])}"
        cell[cols.index("params")] = _count(r["params"])
        cell[cols.index("note")] = r["note"] or ""
        if r["test_bleu"] is not None:
            cell[cols.index("test_bleu")] = f"{r['test_bleu']:.2f}({r['test_checkpoint']})"
        cells.append(cell)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


# --- groups of runs (seeds): ``--group-by`` -----------------------------------------------------

GROUP_VALUES = ("best_valid_loss", "best_bleu", "test_bleu")  # the scores a group is summarised on
STAT_FIELDS = ("mean", "std", "n", "ci_low", "ci_high")


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: json.dumps(node, sort_keys=True, default=str)}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_leaves(v, f"{prefix}{k}."))
    return out


# config keys that never tell two runs apart (paths, machine settings, logging), besides those that
# do not name a run (configs/train.yaml's exclude_keys: how long to train, how to report)
NOISE = ("runs_root", "threads", "device", "dataset.dir", "eval.max_sentences", "track_norms",
         "track_every", "checkpoint", "scale.keep_last_epochs", "save_interval_updates", "hydra")


def differing_keys(runs: list[Run]) -> list[str]:
    """The config keys that tell the runs apart (a plot's legend, a group's ``varies``): leaf keys
    whose values differ between the runs, without keys that do not name a run (``NOISE``,
    ``names.unnamed_keys``: max_update, eval.subset; a ``linear`` schedule's length does name it),
    text (``*.about.*``, ``*.why``, ``*.recipe.*``, free text), keys that every run derives from
    another key (an interpolation in its ``.hydra/config.yaml``: ``schedule.name`` follows the
    placement's recipe), and a group's other keys where its name differs (they follow from the
    choice) unless a run's overrides set them. Keys that some runs lack (configs of older lnexp
    versions) are left out: their absence is not a difference of the experiment."""
    from lnexp.names import LENGTH_KEYS, unnamed_keys

    aside = {*NOISE, *unnamed_keys()}
    if any(r.get("schedule.name") == "linear" for r in runs):
        aside -= set(LENGTH_KEYS)
    common = set.intersection(*(set(dotted_keys(r.config)) for r in runs)) if runs else set()
    leaves = sorted(k for k in common if not isinstance(runs[0].get(k), dict)
                    and not any(k == a or k.startswith(a + ".") for a in aside))
    differ = [k for k in leaves if len({repr(r.get(k)) for r in runs}) > 1 and not _text(k, runs)]
    if not differ:
        return []
    derived = set.intersection(*(_derived(r) for r in runs))
    typed = {override.key(o) for r in runs for o in r.overrides}
    differ = [k for k in differ if k not in derived or k in typed]
    chosen = {k.removesuffix(".name") for k in differ if k.endswith(".name")}
    return [k for k in differ if k.endswith(".name") or k.split(".")[0] not in chosen or k in typed]


def _text(key: str, runs: list[Run]) -> bool:
    """A key that describes rather than configures: a placement's ``about`` (label, colour, paper),
    a ``why`` or a recipe, or a value of words."""
    parts = key.split(".")
    return parts[-1] == "why" or "recipe" in parts or "about" in parts or any(
        isinstance(r.get(key), str) and " " in r.get(key) for r in runs)


def _derived(run: Run) -> set[str]:
    """Keys of a run whose config-file value is an interpolation (Hydra saves the composed,
    unresolved config in .hydra/config.yaml)."""
    from omegaconf import OmegaConf

    path = run.dir / ".hydra" / "config.yaml"
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # no file (runs of other tools), or one OmegaConf cannot read
        return set()
    return {k for k in dotted_keys(raw) if _raw(raw, k)}


def _raw(tree: Any, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return isinstance(tree, str) and "${" in tree


# Never pooled into one row, whatever ``--group-by`` names: a 5-update trial and a 256-update run, or
# a diverged seed and a finished one, are different measurements (their mean describes neither).
SPLIT_BY = ("length", "status")


def group_keys(keys: list[str]) -> list[str]:
    """What a group's rows are told apart by: the keys asked for, then ``SPLIT_BY``."""
    return [*keys, *(k for k in SPLIT_BY if k not in keys)]


def run_length(run: Run) -> str:
    """How long the run was set to train: its max_update where one is set, else its max_epoch."""
    updates, epochs = run.get("max_update"), run.get("max_epoch")
    if updates:
        return count(updates, "update")
    return count(epochs, "epoch") if epochs is not None else "?"


def group_rows(runs: list[Run], keys: list[str]) -> list[dict[str, Any]]:
    """One row per distinct value of ``keys`` and of ``SPLIT_BY`` (the run's length and status):
    n, seeds and each score's seed statistics."""
    from lnexp.stats import summarise

    split = group_keys(keys)
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        row = {**run.row(), "length": run_length(run)}
        value = tuple(_fmt(row[k] if k in row else run.get(k)) for k in split)
        groups.setdefault(value, []).append(run)
    out = []
    for value, members in sorted(groups.items(), key=lambda kv: [_order(v) for v in kv[0]]):
        rows = [m.row() for m in members]
        g: dict[str, Any] = {**dict(zip(split, value, strict=True)), "n": len(members),
                             "seeds": ",".join(sorted({_fmt(r["seed"]) for r in rows}, key=str)),
                             "varies": ",".join(k for k in differing_keys(members)
                                                if k != "seed" and k not in keys)}
        for col in GROUP_VALUES:
            s = summarise([r[col] for r in rows])
            g.update({f"{col}_{f}": x for f, x in zip(STAT_FIELDS, (s.mean, s.std, s.n, s.low, s.high),
                                                      strict=True)})
        out.append(g)
    return out


def _order(text: str) -> tuple[int, float, str]:
    """Numbers sort as numbers (5e-4 before 1e-3), before text."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def group_table(groups: list[dict[str, Any]], keys: list[str]) -> str:
    from lnexp.stats import SeedSummary

    keys = group_keys(keys)
    head = [*keys, "n", "seeds", *GROUP_VALUES, "varies"]
    cells = [head]
    for g in groups:
        stats = [SeedSummary(*(g[f"{c}_{f}"] for f in STAT_FIELDS)).text(3 if "loss" in c else 2)
                 for c in GROUP_VALUES]
        varies = g["varies"] if len(g["varies"]) <= 40 else g["varies"][:37] + "..."
        cells.append([*(g[k] for k in keys), str(g["n"]), g["seeds"], *stats, varies or "-"])
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="lnexp results", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="losses in bits/token; best_bleu: sacreBLEU on the validation set; "
                                        "test_bleu: lnexp evaluate's latest on the test split")
    ap.add_argument("filters", nargs="*", metavar="[RUNS_ROOT] KEY=VALUE",
                    help="the folder of the runs (default: runs), then filters, e.g. placement=post_ln "
                         "warmup=0 status=stopped")
    ap.add_argument("--runs-root", type=Path, help="the folder of the runs, as RUNS_ROOT")
    ap.add_argument("--group-by", metavar="KEY[,KEY]",
                    help="one row per group (e.g. placement,warmup): n, seeds, mean ± 95%% t-interval")
    ap.add_argument("--csv", nargs="?", const="-", default=None, metavar="PATH",
                    help="write CSV to PATH (or stdout with - or no value) instead of the table")
    ap.add_argument("--lr-sensitivity", action="store_true",
                    help="Wortsman et al.'s LR sensitivity of each arm and seed of an lr sweep "
                         "(lnexp.lr_sensitivity), with the lrs each lacks")
    args = ap.parse_args(argv)
    args.runs_root, args.filters = runs_root_of(args.filters, args.runs_root)
    if args.csv not in (None, "-"):
        output_file(args.csv, "--csv", "runs.csv")
    filters = parse_filters(args.filters)
    if not args.runs_root.is_dir():
        raise UserError(f"no runs root {args.runs_root}: train first (lnexp train ...) or pass --runs-root")
    runs = collect_runs(args.runs_root, **filters)
    if args.lr_sensitivity:
        from lnexp.lr_sensitivity import report

        print(report(runs))
        return 0
    if args.group_by is not None:
        return print_groups(runs, args)
    rows = [r.row() for r in runs]
    if args.csv is not None:
        text = to_csv(rows)
        if args.csv == "-":
            sys.stdout.write(text)
        else:
            try:
                Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
                Path(args.csv).write_text(text)
            except OSError as e:
                raise cannot_write(e, "pass --csv a path in a folder you can write, or --csv - "
                                      "for stdout") from None
            print(f"{count(len(rows), 'run')} -> {args.csv}")
        return 0
    if not rows:
        print(f"no runs under {args.runs_root}" + (" match " + " ".join(args.filters) if filters else ""))
        return 0
    print(table(rows))
    for r in rows:
        if r["error"]:
            print(f"{r['run']} failed: {r['error']}")
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    print(f"{count(len(rows), 'run')}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
          + "  (losses in bits/token)")
    return 0


def print_groups(runs: list[Run], args: argparse.Namespace) -> int:
    keys = [k.strip().replace("__", ".") for k in args.group_by.split(",") if k.strip()]
    if not keys:
        raise UserError("--group-by takes KEY[,KEY], e.g. --group-by placement,warmup")
    check_filter_keys(runs, dict.fromkeys(keys, ""))
    groups = group_rows(runs, keys)
    if args.csv is not None:
        fields = [*group_keys(keys), "n", "seeds", "varies",
                  *(f"{c}_{f}" for c in GROUP_VALUES for f in STAT_FIELDS)]
        buf = io.StringIO()
        csv.DictWriter(buf, fieldnames=fields, lineterminator="\n").writeheader()
        csv.DictWriter(buf, fieldnames=fields, lineterminator="\n").writerows(groups)
        if args.csv == "-":
            sys.stdout.write(buf.getvalue())
        else:
            Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
            Path(args.csv).write_text(buf.getvalue())
            print(f"{count(len(groups), 'group')} -> {args.csv}")
        return 0
    if not groups:
        match = " match " + " ".join(args.filters) if args.filters else ""
        print(f"no runs under {args.runs_root}{match}")
        return 0
    print(group_table(groups, keys))
    print(f"{count(len(groups), 'group')} of {count(len(runs), 'run')}; mean ± half-width of the 95% "
          "t-interval over the group's runs (losses in bits/token); runs of another length or "
          "status are never pooled: each has its own row")
    return 0


# --- evaluation records: where ``lnexp evaluate`` writes into a run folder, read back here ---------
#     RUN/eval/SET.CHECKPOINT.beamB.lenpenL/  hyps.txt, refs.txt, [hyps.tok], record.json

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


def latest_evaluation(run_dir: Path, set_name: str = "test",
                      data: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The most recent evaluation of ``set_name`` (``test``: the dataset's test split). Given the
    run's ``data`` (run.json), a split's record that scored other data than the run trained on
    is left out: another key, or (records of an older lnexp, without one) another sentence count,
    as when a rebuilt cache folder held a foreign test set."""
    found = [r for r in read_records(run_dir) if r.get("set") == set_name]
    if data and set_name in ("test", "valid"):
        key, n = data.get("key"), (data.get("counts") or {}).get(set_name)
        found = [r for r in found if r.get("src") or (
            (not (key and r.get("data_key")) or r["data_key"] == key) and n in (None, r.get("n")))]
    return found[-1] if found else None
