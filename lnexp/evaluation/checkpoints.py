"""Which checkpoint of a run to decode with (``best``, ``last``, ``avgN``), loaded for inference.

``avgN`` averages the last N epoch checkpoints (``checkpoint.keep_last_epochs``) with fairseq's
``average_checkpoints`` semantics, and writes the average (model only, no optimizer state) to
``RUN/eval/checkpoint_avgN.pt`` so that the printed fairseq command can load it.

Every command that decodes (evaluate, translate, compare) resolves its checkpoints here, so a
damaged file (a copy cut short, a full disk) is found by its zip directory and CRCs before anything
is decoded or written, and named in one line with the run's checkpoints that are whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lnexp import fairseq_adapter as fa
from lnexp.errors import UserError
from lnexp.results import EVAL_DIR
from lnexp.rundir import CHECKPOINTS, checkpoint_damage, checkpoint_name, epoch_checkpoints, write_with

AVG = re.compile(r"avg(\d+)")


@dataclass
class Checkpoint:
    label: str  # best | last | avgN
    path: Path  # the file fairseq loads (for avgN: the written average)
    averaged: list[Path] = field(default_factory=list)  # avgN: the epoch checkpoints, newest first


def _deleted_hint(run_dir: Path) -> str | None:
    """A run that deleted its checkpoints as it ended (an atlas cell) is trained, not untrained."""
    from lnexp.rundir import read_json, run_paths

    status = read_json(run_paths(run_dir)["status"], {}) or {}
    if not (isinstance(status, dict) and status.get("checkpoints_deleted")):
        return None
    return (": its checkpoints were deleted when it ended (checkpoint.at_end=delete, as atlas cells "
            "do); train it again with checkpoint.at_end=keep to evaluate it")


def resolve(run_dir: Path, spec: str) -> Checkpoint:
    """``spec`` -> the checkpoint files, or one line naming the fix."""
    ckpt_dir = run_dir / CHECKPOINTS
    if spec in ("best", "last"):
        path = ckpt_dir / checkpoint_name(spec)
        if not path.is_file():
            other = "last" if spec == "best" else "best"
            hint = (f"; try --checkpoint {other}" if (ckpt_dir / checkpoint_name(other)).is_file()
                    else _deleted_hint(run_dir) or ": train the run first (lnexp train ...)")
            raise UserError(f"{run_dir} has no {path.name}{hint}")
        _check_whole(run_dir, spec, [path])
        return Checkpoint(spec, path)
    m = AVG.fullmatch(spec)
    if not m or int(m.group(1)) < 1:
        raise UserError(f"--checkpoint {spec!r} is not best, last or avgN (e.g. avg5)")
    n = int(m.group(1))
    found = epoch_checkpoints(ckpt_dir)
    if len(found) < n:
        instead = f"avg{len(found)} or fewer, best or last" if found else "best or last"
        raise UserError(f"--checkpoint avg{n} needs {n} epoch checkpoints but {ckpt_dir} has "
                        f"{len(found)}: use {instead}, or train with checkpoint.keep_last_epochs={n}")
    newest = [p for _, p in reversed(found)][:n]
    _check_whole(run_dir, spec, newest)
    return Checkpoint(spec, run_dir / EVAL_DIR / checkpoint_name(spec), newest)


def whole_choices(run_dir: Path) -> list[str]:
    """The --checkpoint values whose files are all whole: best, last, avgN (N up to the run's whole
    epoch checkpoints, newest first)."""
    ckpt_dir = run_dir / CHECKPOINTS
    out = [label for label in ("best", "last") if (ckpt_dir / checkpoint_name(label)).is_file()
           and checkpoint_damage(ckpt_dir / checkpoint_name(label)) is None]
    n = 0
    for _, path in reversed(epoch_checkpoints(ckpt_dir)):
        if checkpoint_damage(path) is not None:
            break
        n += 1
    return out + ([f"avg{n}" if n == 1 else f"avg1 to avg{n}"] if n else [])


def _check_whole(run_dir: Path, spec: str, paths: list[Path]) -> None:
    for path in paths:
        damage = checkpoint_damage(path)
        if damage is None:
            continue
        others = [c for c in whole_choices(run_dir) if c != spec]
        fix = (f"use another of the run's checkpoints ({', '.join(others)}: --checkpoint NAME, or "
               "RUN@NAME in lnexp compare)" if others else
               "the run has no whole checkpoint: train it again (delete its checkpoints folder)")
        raise UserError(f"{path} is damaged ({damage}): {fix}")


def load(ckpt: Checkpoint, data_dir: str | Path, device: str, dataset_impl: str | None = None):
    """(model, task) on ``device``; for avgN the average is computed and written first."""
    state = None
    if ckpt.averaged:
        state = fa.average_checkpoints(ckpt.averaged, {"data": str(data_dir)})
        state.pop("last_optimizer_state", None)
        _save(state, ckpt.path)
    try:
        model, task = fa.load_for_inference(ckpt.path, data_dir, dataset_impl, state)
    except RuntimeError as e:  # a last guard: the run's data is found by its key, then checked
        if "size mismatch" not in str(e):
            raise
        raise UserError(f"{ckpt.path} does not fit the dictionary of {data_dir} (its embeddings "
                        "have another size): that is not the data the run trained on; prepare "
                        "the run's own data again (lnexp prepare, or its dataset config)") from None
    if device == "cuda":
        model = model.cuda()
    return model.eval(), task


def _save(state: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_with(path, lambda tmp: fa.save_checkpoint_file(state, tmp))
