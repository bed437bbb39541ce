"""Log lines on stderr for the commands, also when a caller runs them in-process.

A plain ``StreamHandler(sys.stderr)`` keeps the stream it was made with: a test, a notebook or any
caller that swaps ``sys.stderr`` between two commands leaves the second writing to the first's,
closed since ("I/O operation on closed file").
"""

from __future__ import annotations

import logging
import sys


class CurrentStderr(logging.StreamHandler):
    """A handler that writes to ``sys.stderr`` as it is when each line is logged."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def to_stderr(level: int, fmt: str, datefmt: str | None = None) -> None:
    """Lines at ``level`` and above on the current stderr, unless the root logger has handlers
    already (as ``logging.basicConfig``: a caller's own logging, pytest's, stays as it is)."""
    logging.basicConfig(level=level, format=fmt, datefmt=datefmt, handlers=[CurrentStderr()])


def loggers_state() -> dict[str, tuple]:
    """Each logger's handlers, level and switches: what a command run in-process (a test's, the
    atlas worker's next cell) must find as a fresh process has it, :func:`restore_loggers`."""
    return {name: (lg.handlers[:], lg.level, lg.propagate, lg.disabled) for name, lg in _loggers()}


def restore_loggers(saved: dict[str, tuple]) -> None:
    """Back to ``saved``; a handler added since (Hydra's file handler in a run folder) is closed."""
    for name, lg in _loggers():
        handlers, level, propagate, disabled = saved.get(name, ([], logging.NOTSET, True, False))
        for h in lg.handlers[:]:
            if h not in handlers:
                lg.removeHandler(h)
                h.close()
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled


def _loggers() -> list[tuple[str, logging.Logger]]:
    return [("", logging.getLogger()), *((n, lg) for n, lg in logging.Logger.manager.loggerDict.items()
                                         if isinstance(lg, logging.Logger))]

