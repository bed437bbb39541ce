"""lnexp's exit statuses, each defined once: what ``lnexp COMMAND`` returns, what a training's
process (a cell of the atlas, a task of a job array) ends with, and how several ends make one.

Below everything but the standard library, so that the CLI, lnexp train, the atlas's driver and
its launchers read the same numbers.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    CRASH = 1  # an error lnexp did not foresee (a run's traceback in its error.log)
    BAD_INPUT = 2  # a mistake the user can fix: one line names the fix, nothing lost
    INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT): work kept; the same command resumes

    @classmethod
    def worst(cls, statuses: Iterable[int]) -> Exit:
        """One status for several ends (a sweep's runs, a round's cells): BAD_INPUT if one was a
        user's mistake (its fix is the one to name), CRASH if one failed otherwise, else OK."""
        got = set(statuses)
        if cls.BAD_INPUT in got:
            return cls.BAD_INPUT
        return cls.CRASH if got - {cls.OK} else cls.OK


def of_process(returncode: int) -> int:
    """A child process's status as a shell gives it: 128 + N for a death by signal N (subprocess's
    returncode is -N then), else its exit code."""
    return 128 - returncode if returncode < 0 else returncode


def describe(statuses: Iterable[int]) -> str:
    """How processes ended, in words: their exit statuses, and a death by signal (128 + N) as such."""
    got = set(statuses)
    codes = sorted(s for s in got if s <= 128)
    words = [f"exit status {', '.join(map(str, codes))}"] if codes else []
    for n in sorted(s - 128 for s in got if s > 128 and s != Exit.INTERRUPTED):
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = "an unknown signal"
        words.append(f"killed by signal {n} ({name})")
    return "; ".join(words)
