"""Each exit status is defined once (lnexp.exit_status), and so is how several ends make one."""

from __future__ import annotations

import re

from lnexp.exit_status import Exit, describe, of_process
from tests.conftest import REPO


def test_several_ends_make_one_status_and_a_signals_death_is_named():
    assert Exit.worst([]) == Exit.OK and Exit.worst([0, 0]) == Exit.OK
    assert Exit.worst([0, 1]) == Exit.CRASH and Exit.worst([137]) == Exit.CRASH
    assert Exit.worst([1, 2, 137]) == Exit.BAD_INPUT  # a user's mistake is the one to name
    assert of_process(-9) == 137 and of_process(-6) == 134 and of_process(2) == 2
    assert describe([2, 1, 137, 2]) == "exit status 1, 2; killed by signal 9 (SIGKILL)"
    assert describe([134]) == "killed by signal 6 (SIGABRT)"


def test_no_module_defines_an_exit_status_of_its_own():
    """No `INTERRUPTED = 130`, `CRASH, INTERRUPTED = 1, 130` or a literal 130 outside
    lnexp/exit_status.py (before issue 50: three modules defined INTERRUPTED, two CRASH)."""
    pattern = re.compile(r"\b(INTERRUPTED|CRASH|BAD_INPUT)\b[\w, ]*=\s*\d|(return|[=(,])\s*130\b")
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
            for p in sorted((REPO / "lnexp").rglob("*.py")) if p.name != "exit_status.py"
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == [], hits
