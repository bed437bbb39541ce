"""What a checkpoint carries of lnexp's own progress beside fairseq's: the per-epoch history, the
training sums of the epoch so far, divergence, the plateau rule's last verdict, and the time
already spent.

It travels in the checkpoint's ``extra_state["lnexp"]`` as a plain dict (``torch.load`` with
``weights_only`` reads plain containers only); checkpoints written before this type existed hold
the same keys, some of them missing, and resume as well (their ``diverged`` held a plateau too:
it is read as the plateau verdict).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


def zero_sums() -> dict[str, float]:
    return {"loss": 0.0, "nll_loss": 0.0, "sample_size": 0.0, "ntokens": 0.0}


@dataclass
class RunState:
    history: list[dict[str, Any]] = field(default_factory=list)  # the metrics.jsonl rows
    wall_s: float = 0.0  # seconds of training and validation up to the checkpoint
    acc: dict[str, float] = field(default_factory=zero_sums)  # sums over the epoch's updates so far
    diverged: dict[str, Any] | None = None  # NaN/inf: reason, update, epoch
    plateau: dict[str, Any] | None = None  # the plateau rule's last verdict (None: off it, or not judged)
    left_plateau: dict[str, Any] | None = None  # the update and epoch of the verdict that left it
    overflows: int = 0  # fp16 updates skipped by fairseq's loss scaler
    saved_update: int | None = None  # the update of the last checkpoint
    signature: str | None = None  # sacreBLEU's signature of the last validation
    profiled_init: dict[str, Any] | None = None  # the gains a fresh run's profiling pass set (Admin)

    @classmethod
    def from_checkpoint(cls, extra_state: dict[str, Any] | None) -> RunState:
        """The state of a checkpoint's extra_state (a fresh one for a fresh start)."""
        saved = (extra_state or {}).get("lnexp") or {}
        known = {f.name for f in fields(cls)}
        state = cls(**{k: v for k, v in saved.items() if k in known})
        if state.diverged and str(state.diverged.get("reason", "")).startswith("plateau"):
            state.plateau = {**state.diverged, "reason": state.diverged["reason"].removeprefix("plateau: ")}
            state.diverged = None  # (older lnexp called a plateau diverged)
        return state

    def to_checkpoint(self) -> dict[str, Any]:
        """The plain dict stored as extra_state["lnexp"]."""
        return asdict(self)

    def add_update(self, step: dict[str, float]) -> None:
        """Add one update's statistics to the epoch's training sums."""
        for key in ("loss", "nll_loss"):
            self.acc[key] += step[key] * step["sample_size" if key == "loss" else "ntokens"]
        self.acc["sample_size"] += step["sample_size"]
        self.acc["ntokens"] += step["ntokens"]

    def train_losses(self) -> dict[str, float]:
        """The epoch's mean training losses (bits/token)."""
        return {"train_loss": self.acc["loss"] / max(self.acc["sample_size"], 1),
                "train_nll_loss": self.acc["nll_loss"] / max(self.acc["ntokens"], 1)}

    def record(self, record: dict[str, Any]) -> None:
        """Keep an epoch's record (replacing that of the same epoch: a max_update stop inside it)."""
        if self.history and self.history[-1]["epoch"] == record["epoch"]:
            self.history[-1] = record
        else:
            self.history.append(record)

    def checkpoint_update(self) -> int:
        """The update the last checkpoint holds."""
        if self.saved_update is not None:
            return int(self.saved_update)
        return int(self.history[-1]["updates"]) if self.history else 0
