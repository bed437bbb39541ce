"""What this host is: in the words a measurement is reported with (the figures' checks, the
report, the benchmarks): the one reader of /proc/cpuinfo (``cpuinfo``: its model name, and the CPU
flags that lnexp.train.precision reads); what it has to run jobs on (its usable cores, its GPUs as
the jobs will number them, its memory: the one place each is found); and the device a config's
``device`` means here (``resolve_device``)."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
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
    and the figures' measurements all ask here); ConfigError for cuda where torch sees no GPU. A
    CPU build of torch (as :func:`gpus` reads it) sees none without importing torch: a command
    with nothing to compute (``lnexp compare`` of scored runs) starts without it."""
    from lnexp.errors import ConfigError

    if cfg.device in ("auto", "cuda"):
        if cpu_torch():
            cuda = False
        else:
            import torch

            cuda = torch.cuda.is_available()
        if cfg.device == "cuda" and not cuda:
            raise ConfigError("device=cuda but torch sees no GPU: use device=cpu or install a CUDA torch")
        return "cuda" if cuda else "cpu"
    return cfg.device


def cpu_torch() -> str | None:
    """The installed torch's version where it is a CPU build (its version ends in +cpu, read from
    its metadata, without importing torch), else None."""
    try:
        from importlib.metadata import version

        v = version("torch")
    except Exception:  # noqa: BLE001 - no torch metadata: torch itself decides
        return None
    return v if v.endswith("+cpu") else None


def cores() -> int:
    """The cores this process may run on (a container's or taskset's limit included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def memory_gib() -> float | None:
    """The host's memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class Gpu:
    id: str  # its CUDA id as a process started from here sees it (CUDA_VISIBLE_DEVICES renumbers)
    name: str
    memory_gib: float


def gpus() -> tuple[list[Gpu], str]:
    """(the GPUs a process started from here can use, how they were found), without CUDA (its
    start-up takes seconds, and the caller may have no use for a CUDA context): ``nvidia-smi``
    lists them with their names and memory, CUDA_VISIBLE_DEVICES narrows them, and a CPU build of
    torch (its version ends in +cpu, read from its metadata) means none."""
    if build := cpu_torch():
        return [], f"torch {build} is a CPU build"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return [], "no nvidia-smi"
    found = gpus_of(out.stdout if out.returncode == 0 else "", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return found, "nvidia-smi" if found else "nvidia-smi lists no GPU"


def gpus_of(listing: str, visible: str | None) -> list[Gpu]:
    """The GPUs of ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits``
    output, narrowed to ``visible`` (CUDA_VISIBLE_DEVICES: indices, or UUIDs counted; None: every
    GPU), each with the CUDA id a process sees it as."""
    listed = []
    for line in listing.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3:
            try:
                listed.append(Gpu(parts[0], parts[1], float(parts[2]) / 1024))
            except ValueError:
                continue
    if visible is None:
        return listed
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    wanted = wanted[:wanted.index("-1")] if "-1" in wanted else wanted  # CUDA stops at an invalid id
    if all(v.isdigit() for v in wanted):  # renumbered from 0 in CUDA_VISIBLE_DEVICES's order
        by_index = {g.id: g for g in listed}
        return [Gpu(str(k), by_index[v].name, by_index[v].memory_gib) for k, v in enumerate(wanted)
                if v in by_index]
    return [Gpu(str(k), g.name, g.memory_gib) for k, g in enumerate(listed[:len(wanted)])]  # UUIDs
