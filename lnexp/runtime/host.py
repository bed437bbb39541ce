"""What this host is, in the words a measurement is reported with (the figures' checks, the
report, the benchmarks): one reader of /proc/cpuinfo's model name."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """/proc/cpuinfo's model name (e.g. ``Intel(R) Xeon(R) Processor``), else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
