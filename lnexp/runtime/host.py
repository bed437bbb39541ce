"""What this host is, in the words a measurement is reported with (the figures' checks, the
report, the benchmarks): one reader of /proc/cpuinfo's model name; and the device a config's
``device`` means here (``resolve_device``)."""

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
