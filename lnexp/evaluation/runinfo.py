"""A trained run as evaluation needs it: its folder, config and prepared data; sweeps expanded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnexp.data.corpus import PreparedData
from lnexp.errors import UserError
from lnexp.rundir import RUN, run_paths


@dataclass
class RunInfo:
    dir: Path
    config: dict[str, Any]
    data: PreparedData

    @property
    def corpus(self) -> str:
        return str(self.config["dataset"]["corpus"])

    def setting(self, dataset_key: str, eval_key: str) -> Any:
        """A decoding setting: the dataset's (the paper's) value, else the run's eval value."""
        value = self.config.get("dataset", {}).get(dataset_key)
        return value if value is not None else self.config.get("eval", {}).get(eval_key)


def run_folders(paths: list[Path]) -> list[Path]:
    """Run folders from the arguments: a run folder, or a folder holding runs (a sweep)."""
    from lnexp.results import find_run_dirs

    out: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise UserError(f"no such folder: {path} (pass a run folder that lnexp train wrote)")
        if run_paths(path)["run"].is_file():
            out.append(path)
            continue
        found = [d for d in find_run_dirs(path) if run_paths(d)["run"].is_file()]
        if not found:
            raise UserError(f"{path} is not a run folder (no {RUN}): pass a folder that lnexp "
                            "train wrote, or a sweep folder holding such folders")
        out += found
    return out


def open_run(run_dir: Path) -> RunInfo:
    try:
        meta = json.loads(run_paths(run_dir)["run"].read_text())
        config, data = meta["config"], dict(meta["data"])
        dataset = dict(config["dataset"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{run_paths(run_dir)['run']} is unreadable or incomplete: pass a folder that lnexp "
                        "train wrote") from None
    return RunInfo(run_dir, config, _prepared(run_dir, data, dataset))


def _prepared(run_dir: Path, data: dict[str, Any], dataset: dict[str, Any]) -> PreparedData:
    """The run's own prepared corpus, by the key run.json records (``registry.for_run``); for a run
    from before keys, the data found is checked against what the run recorded."""
    from lnexp.data.registry import for_run

    return for_run(data, dataset, lambda found: mismatch(run_dir, data, found), str(run_dir))


def mismatch(run_dir: Path, recorded: dict[str, Any], found: PreparedData) -> str | None:
    """What tells ``found`` apart from the data the run trained on (None: nothing): the sentence
    counts run.json records, and the validation references the run wrote when it started."""
    counts = recorded.get("counts") or {}
    if counts and {k: found.counts.get(k) for k in counts} != counts:
        show = " / ".join(f"{k} {v:,}" for k, v in counts.items())
        other = " / ".join(f"{k} {found.counts.get(k, 0):,}" for k in counts)
        return f"the run recorded {show} pairs, it holds {other}"
    ref = run_paths(run_dir)["hyps"] / "valid.ref"
    if ref.is_file():
        from lnexp.decoding import detokenizer

        wrote = ref.read_text(encoding="utf-8").splitlines()
        detok = detokenizer(found)
        if [detok(r) for r in found.references("valid")[: len(wrote)]] != wrote:
            return f"its validation sentences are not those of {ref}"
    return None
