"""A count with its noun as a reader says it, "1 epoch" and "2 epochs": every message that prints
a count of something goes through ``count`` (a new user met "stopped after 1 epochs", issue 49)."""

from __future__ import annotations


def count(n: float, noun: str, many: str | None = None, spec: str = "") -> str:
    """``n`` formatted with ``spec`` (``","``: thousands) and ``noun``, in its plural (``many``,
    else noun + "s") unless ``n`` is 1."""
    return f"{n:{spec}} {noun if n == 1 else many or noun + 's'}"
