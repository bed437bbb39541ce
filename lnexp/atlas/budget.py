"""The atlas's time: its budget, what is spent (wall time, counted as it passes), the cells' measured
costs by depth and what they hold for, and what remains, kept in runs_root/atlas_state.json so that
a resumed atlas spends only the rest.

FIGURE_RESERVE_S of the budget is kept for ``lnexp figure atlas`` at the end: the cells are planned
to end before it; a cell still running when the whole budget is spent is stopped (lnexp.atlas.rounds).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from lnexp.atlas.resources import NO_LIMIT_S, at_depth
from lnexp.errors import UserError
from lnexp.rundir import write_json

FIGURE_RESERVE_S = 60.0  # kept back for lnexp figure atlas at the end
STATE_FILE = "atlas_state.json"  # in runs_root: time spent so far (a resumed atlas spends the rest)
COST_MARGIN = 1.1  # a cell's estimate once cells of its depth have ended: the slowest, +10%
MEND = ("it holds the budget spent so far: mend it (e.g. {\"spent_s\": 1800, \"costs\": {}} for "
        "30 minutes spent), or delete it to grant the atlas a fresh budget")


def read_doc(path: Path, mend: str) -> dict | None:
    """A JSON object file; None if there is none; UserError naming ``mend`` if it is damaged."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path} cannot be read ({e}): {mend}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UserError(f"{path} is damaged (not JSON: {e}): {mend}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} is damaged (not a JSON object): {mend}")
    return doc


def read_state(runs_root: Path) -> dict:
    """The atlas's budget spent so far and the cells' measured costs (runs_root/atlas_state.json;
    a fresh one if none). A damaged file is refused, never reset: it holds the budget spent."""
    path = runs_root / STATE_FILE
    doc = read_doc(path, MEND)
    if doc is None:
        return {"spent_s": 0.0, "costs": {}}
    spent, costs = doc.get("spent_s", 0.0), doc.get("costs", {})
    ok = (isinstance(spent, int | float) and not isinstance(spent, bool) and math.isfinite(spent)
          and spent >= 0 and isinstance(costs, dict)
          and all(isinstance(v, list) and all(isinstance(x, int | float) for x in v) for v in costs.values()))
    if not ok:
        raise UserError(f"{path} is damaged (spent_s must be seconds >= 0, costs lists of seconds by "
                        f"depth): {MEND}")
    return {**doc, "spent_s": float(spent), "costs": costs}


class Budget:
    """The budget of one atlas on one runs root. ``first_cost``: a cell's seconds by depth until
    cells are measured; ``costs_for``: what the measured costs hold for (length, device, jobs,
    launcher): costs measured for another are set aside, saying so."""

    def __init__(self, runs_root: Path, budget_s: float, first_cost: dict[int, float],
                 costs_for: dict | None = None, log: Callable[[str], None] = print) -> None:
        self.path, self.budget_s, self.first_cost = runs_root / STATE_FILE, budget_s, first_cost
        self.state = state = read_state(runs_root)
        if costs_for is not None and state.get("costs_for", costs_for) != costs_for and state["costs"]:
            log(f"lnexp atlas: the costs measured before were for {state['costs_for']}, not {costs_for}: "
                "set aside")
            state["costs"] = {}
        if costs_for is not None:
            state["costs_for"] = costs_for
        self.clock = time.monotonic()

    @property
    def limited(self) -> bool:
        return self.budget_s < NO_LIMIT_S

    @property
    def spent_s(self) -> float:
        return self.state["spent_s"]

    def cost(self, depth: int) -> float:
        """A cell's estimated seconds at ``depth``: the slowest measured (+10%), else the first cost."""
        measured = self.state["costs"].get(str(depth))
        return COST_MARGIN * max(measured) if measured else at_depth(self.first_cost, depth)

    def remaining(self) -> float:
        """Seconds the cells may still take: the budget less the spent and the figures' reserve."""
        return self.budget_s - FIGURE_RESERVE_S - self.spent_s

    def until_spent(self) -> float:
        """Seconds until the whole budget is spent (the reserve too): where running cells stop."""
        return self.budget_s - self.spent_s

    def left(self) -> str:
        if not self.limited:
            return "no budget limit"
        return f"{max(self.remaining(), 0.0) / 60:.1f} min of the budget left"

    def header(self) -> str:
        """The budget as the atlas's first line gives it."""
        if not self.limited:
            return "no budget limit"
        return (f"budget {self.budget_s / 60:g} min ({FIGURE_RESERVE_S:.0f} s of it kept for the figures; a "
                f"cell still running when it is spent is stopped and kept), {self.spent_s / 60:.1f} spent")

    def start(self) -> None:
        """Count from now: the cells' wall time is spent, not the atlas's own reading between rounds."""
        self.clock = time.monotonic()

    def tick(self) -> None:
        """Count the wall time since the start or the last tick as spent."""
        now = time.monotonic()
        self.state["spent_s"] += now - self.clock
        self.clock = now

    def measured(self, depth: int, seconds: float) -> None:
        self.state["costs"].setdefault(str(depth), []).append(round(seconds, 1))

    def save(self) -> None:
        write_json(self.path, self.state)
