"""A figure's claims, in one schema: every figure states each claim as a :class:`Check`, writes
them with :func:`write_checks` (NAME_checks.json) and the report reads them with
:func:`read_checks`, so that a new figure has one way to say what it tested and the report one
shape to read.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnexp.errors import UserError
from lnexp.rundir import read_json, write_json

MARKS = ("holds", "does NOT hold", "not measured")  # the words print_checks uses for True/False/None


@dataclass(frozen=True)
class Check:
    """One claim: what the paper says and its value, ours as text, the numbers behind it, and
    whether it holds (None: not measured, or reported without a threshold). ``required``: this
    scale must show it; the others compare the paper's other settings (informational)."""

    id: str
    claim: str
    paper: str
    measured: dict[str, Any]
    ours: str
    holds: bool | None
    required: bool = True

    @classmethod
    def of_value(cls, cid: str, claim: str, value: Any, holds: bool | None, **measured: Any) -> Check:
        """A claim measured as one number (or short text) with no value of the paper's to quote:
        ``ours`` is that value, ``measured`` keeps it under "value" with the numbers behind it."""
        return cls(cid, claim, "", {"value": value, **measured}, number(value), holds)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "claim": self.claim, "paper": self.paper, "ours": self.ours,
                "measured": self.measured, "pass": self.holds, "required": self.required}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Check:
        return cls(d["id"], d["claim"], d.get("paper") or "", d.get("measured") or {}, d.get("ours") or "",
                   d.get("pass"), d.get("required", True))


def number(v: Any) -> str:
    """A measured value as the report shows it: 4 significant digits, text as it is."""
    if v is None:
        return "n/a"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def thresholded(checks: list[Check]) -> list[Check]:
    """The required checks with a verdict: what "all required checks hold" is about."""
    return [c for c in checks if c.required and c.holds is not None]


def all_required_hold(checks: list[Check]) -> bool:
    req = thresholded(checks)
    return bool(req) and all(c.holds is True for c in req)


def write_checks(out: Path, name: str, scale: str, checks: list[Check], extra: dict[str, Any]) -> Path:
    """out/NAME_checks.json: the checks in order, the verdict over the required ones and the
    figure's own ``extra`` keys (its settings, counts)."""
    doc = {"figure": name, "scale": scale, "all_required_pass": all_required_hold(checks),
           "checks": [c.to_json() for c in checks], **extra, "host": platform.node()}
    path = out / f"{name}_checks.json"
    write_json(path, doc)
    return path


def read_checks(path: Path) -> tuple[dict[str, Any], list[Check]] | None:
    """A checks file and its checks; None when it does not exist (or is not JSON). Files fig3 and
    theory wrote before this schema ({"name": {"value", "pass", "claim", ...}}) are read as their
    checks; any other shape is a UserError naming the figure to rerun."""
    doc = read_json(path)
    if doc is None:
        return None
    try:
        items = doc["checks"]
        if isinstance(items, dict):  # the older dict form: cheap to read, so old figures still report
            return doc, [Check(k, v.get("claim", k), "", v, number(v.get("value")), v.get("pass"))
                         for k, v in items.items()]
        return doc, [Check.from_json(c) for c in items]
    except (KeyError, TypeError, AttributeError) as e:
        name = Path(path).name.removesuffix("_checks.json")
        why = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise UserError(f"{path} is not a figure's checks file ({why}): rerun `make {name}`, or "
                        "remove it") from None


def print_checks(checks: list[Check], marks: tuple[str, str, str] = MARKS) -> None:
    """Each check's verdict on one line; ``marks``: the words for true, false and null."""
    for c in checks:
        mark = {True: marks[0], False: marks[1], None: marks[2]}[c.holds]
        print(f"[{mark}] {c.claim}: {c.ours}")

