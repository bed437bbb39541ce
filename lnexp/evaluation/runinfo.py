"""A trained run as evaluation needs it: its folder, config and prepared data; sweeps expanded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnexp.data.cache import cache_root
from lnexp.data.corpus import PreparedData
from lnexp.errors import DataError, UserError
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
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{run_paths(run_dir)['run']} is unreadable or incomplete: pass a folder that lnexp "
                        "train wrote") from None
    return RunInfo(run_dir, config, _prepared(data))


def _prepared(data: dict[str, Any]) -> PreparedData:
    """The run's prepared corpus: where it was at training time, else in today's cache."""
    if Path(data["bin_dir"]).is_dir():
        return PreparedData(**data)
    moved = cache_root() / data["name"] / "prepared.json"
    if moved.is_file():
        return PreparedData.load(moved.parent)
    raise DataError(f"the run's prepared data {data['bin_dir']} is gone: set LNEXP_CACHE to where "
                    f"{data['name']} was prepared, or prepare it again (lnexp prepare)")
