"""What this host is, in the words a measurement is reported with (the figures' checks, the
report, the benchmarks): the one reader of /proc/cpuinfo (``cpuinfo``: its model name, and the
CPU flags that lnexp.train.precision reads); and the device a config's ``device`` means here
(``resolve_device``)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# a file read instead of /proc/cpuinfo: the tests fake the other CPU kind with it
# (tests/conftest.py's --fake-cpu; docs/development.md#tests)
CPUINFO_ENV = "LNEXP_CPUINFO"


def cpuinfo() -> str | None:
    """The text of /proc/cpuinfo (or of the file $LNEXP_CPUINFO names); None where it cannot be
    read (another OS)."""
    try:
        return Path(os.environ.get(CPUINFO_ENV) or CPUINFO).read_text()
    except OSError:
        return None


def cpu_model() -> str:
    """/proc/cpuinfo's model name (e.g. ``Intel(R) Xeon(R) Processor``), else what Python knows."""
    for line in (cpuinfo() or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def resolve_device(cfg) -> str:
    """The device a config's ``device`` (auto | cpu | cuda) means on this host (training, evaluation
    and the figures' measurements all ask here); ConfigError for cuda where torch sees no GPU."""
    import torch

    from lnexp.errors import ConfigError

    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no GPU: use device=cpu or install a CUDA torch")
    return cfg.device
