"""The precision a run trains in, and lnexp's own bf16 path on CPUs with bf16 matrix units.

``precision=bf16`` or ``fp16`` on a GPU is fairseq's ``--bf16``/``--fp16`` (the whole model cast,
fp32 master weights in fairseq's FP16Optimizer) by default; with ``speed.half=autocast`` it is
``torch.autocast("cuda")`` with fp32 weights instead: bf16 around the forward pass and the loss as
below (no loss scale), fp16 as fairseq's ``--amp`` (its autocast, and torch's GradScaler). On a CPU
``precision=bf16`` is
``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward pass and the loss only
(``fairseq_adapter.autocast_forward``): weights, gradients and Adam's state stay fp32, the matrix
multiplies run in bf16 (oneDNN's AMX / AVX512-BF16 kernels, several times fp32 there), while
``keep_fp32_under_autocast`` keeps attention (its softmax) and every norm's statistics in fp32. The residual
stream stays fp32 by type promotion (embeddings are fp32, a bf16 branch added to it gives fp32).

``precision=auto`` takes that path only where /proc/cpuinfo reports ``amx_bf16`` or
``avx512_bf16`` and a short self-check on this machine passes; else fp32. On a GPU auto is fp32.
The tests fake either CPU kind on any machine: $LNEXP_CPUINFO (lnexp.runtime.host) names a file
read instead of /proc/cpuinfo, $LNEXP_BF16_SELF_CHECK=pass or fail decides the self-check.
Why attention stays fp32: besides the softmax it would compute in bf16, torch's CPU flash-attention
backward in bf16 at the mini model's head size (32) took many times the fp32 one's time in a
profile of plain autocast (2026-12-03), more than the bf16 matmuls saved.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any

from lnexp.errors import ConfigError
from lnexp.runtime.host import cpuinfo as read_cpuinfo

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of bf16 matrix / dot-product units


@dataclass(frozen=True)
class Precision:
    """What a run computes in: ``name`` (fp32, bf16, fp16), whether it is lnexp's CPU autocast
    path, and ``why`` in words (the run's first log line)."""

    name: str
    autocast: bool
    why: str
    device: str = "cpu"

    @property
    def fairseq_bf16(self) -> bool:
        return self.name == "bf16" and not self.autocast

    @property
    def fairseq_amp(self) -> bool:
        """fp16 autocast on a GPU: fairseq's --amp (its autocast and loss scaler)."""
        return self.name == "fp16" and self.autocast


def cpu_bf16_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The bf16 flags (BF16_FLAGS) the CPU reports, from /proc/cpuinfo's text (``cpuinfo``: given
    text instead, for tests); () where there is no such file."""
    if cpuinfo is None:
        cpuinfo = read_cpuinfo() or ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return tuple(f for f in BF16_FLAGS if f in flags)


SELF_CHECK_ENV = "LNEXP_BF16_SELF_CHECK"  # pass | fail: the tests' fake CPU (tests/conftest.py)


def self_check() -> str | None:
    """None if bf16 autocast works here, else why not (``measured_self_check``); where
    $LNEXP_BF16_SELF_CHECK is set, what it says instead: ``pass``, or any other word a failure
    naming it (the tests fake a CPU kind, in their subprocesses too)."""
    forced = os.environ.get(SELF_CHECK_ENV, "")
    if forced == "pass":
        return None
    if forced:
        return f"forced by {SELF_CHECK_ENV}={forced}"
    return measured_self_check()


@functools.cache
def measured_self_check() -> str | None:
    """None if bf16 autocast works here, else why not: oneDNN's bf16 support, then a small
    linear + LayerNorm + attention forward and backward under ``autocast_context`` against fp32
    (bf16 has 8 bits of mantissa: relative error well under 5e-2 on these sizes)."""
    import torch
    import torch.nn.functional as F

    try:
        if not torch.backends.mkldnn.is_available():
            return "torch has no oneDNN (mkldnn)"
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return "oneDNN reports no bf16 support"
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 128, generator=g)
        w = (torch.randn(128, 128, generator=g) / 128 ** 0.5).requires_grad_()
        r = torch.randn(1, 4, 16, 32, generator=g)  # a fixed random projection of the output

        def run(cast: bool) -> tuple[torch.Tensor, torch.Tensor]:
            w.grad = None
            with autocast_context() if cast else contextlib.nullcontext():
                h = F.layer_norm(F.linear(x, w), (128,))  # 16 tokens x 4 heads of 32
                q = h.view(16, 4, 4, 32)[:, 0].reshape(1, 16, 4, 32).transpose(1, 2)
                y = (F.linear(F.scaled_dot_product_attention(q, q, q), w[:32, :32]) * r).sum()
            y.backward()
            return y.detach().float(), w.grad.clone()

        y32, g32 = run(False)
        y16, g16 = run(True)
        if w.grad.dtype != torch.float32:
            return f"the weight's gradient came back {w.grad.dtype}"
        err = (g16 - g32).norm() / g32.norm()
        if not (torch.isfinite(y16) and torch.isfinite(err) and err < 5e-2):
            return f"bf16 gradients differ from fp32 by {float(err):.2g} (relative)"
    except Exception as e:  # any failure of the bf16 path is a reason not to take it
        return f"{type(e).__name__}: {e}"
    return None


def resolve(requested: str, device: str, cpuinfo: str | None = None,
            half: str = "cast") -> Precision:
    """The precision a run asked for (``cfg.precision``) as it runs on ``device``, half precision
    on a GPU the way ``half`` (``speed.half``) says; ConfigError where it cannot (fp16 on CPU, bf16
    whose self-check fails)."""
    if requested == "fp32":
        return Precision("fp32", False, "fp32", device)
    if device == "cuda":
        if requested == "auto":
            return Precision("fp32", False, "fp32 (precision=auto on a GPU is fp32)", device)
        if half == "autocast":
            how = ("fairseq's --amp: its autocast and loss scaler" if requested == "fp16"
                   else "no loss scale")
            return Precision(requested, True, f"{requested} autocast on the GPU (speed.half="
                             f"autocast; {how}): weights, gradients and Adam fp32", device)
        return Precision(requested, False, f"{requested} (fairseq's --{requested}: the whole model)",
                         device)
    if requested == "fp16":
        raise ConfigError("precision=fp16 needs a GPU: use precision=fp32 or bf16 on CPU")
    flags = cpu_bf16_flags(cpuinfo)
    if requested == "auto" and not flags:
        return Precision("fp32", False, "fp32 (precision=auto: the CPU reports neither "
                         f"{' nor '.join(BF16_FLAGS)})")
    failed = self_check()
    if failed is not None:
        if requested == "auto":
            return Precision("fp32", False, f"fp32 (precision=auto: the bf16 self-check failed: "
                             f"{failed})")
        raise ConfigError(f"precision=bf16 failed its self-check on this CPU ({failed}): "
                          "use precision=fp32")
    units = ", ".join(flags) if flags else "no bf16 units reported: emulated, likely slower than fp32"
    how = "precision=auto" if requested == "auto" else "precision=bf16"
    return Precision("bf16", True, f"bf16 autocast on CPU ({how}; {units}; self-check passed): "
                     "matmuls bf16, weights, optimizer, norms and attention fp32")


_FP32_OPS = ("scaled_dot_product_attention", "layer_norm", "rms_norm")
_LIBRARY: list[Any] = []  # the registration, kept alive for the process


def keep_fp32_under_autocast() -> None:
    """Make CPU autocast run attention and the norms in fp32: a kernel for autocast's CPU dispatch
    key of each op in _FP32_OPS that casts its floating-point inputs to fp32 and runs it with
    autocast off (so autograd records, and the backward runs, the fp32 op). torch's own CPU
    autocast runs attention in bf16 and lets a norm take a bf16 input. Affects nothing outside a
    CPU autocast region; once per process. (A TorchFunctionMode cannot do it: fairseq's attention
    calls torch's multi_head_attention_forward, whose inner attention call a mode does not see.)"""
    if _LIBRARY:
        return
    import warnings

    import torch

    lib = torch.library.Library("aten", "IMPL")
    for op in _FP32_OPS:
        if not hasattr(torch.ops.aten, op):
            continue
        packet = getattr(torch.ops.aten, op)

        def fp32(*args, _op=packet.default, **kwargs):
            with torch.autocast("cpu", enabled=False):
                return _op(*_up(args), **_up(kwargs))

        with warnings.catch_warnings():  # "overriding a previously registered kernel" (attention)
            warnings.simplefilter("ignore")
            lib.impl(op, fp32, "AutocastCPU")
    _LIBRARY.append(lib)


def _up(x: Any) -> Any:
    """Floating-point tensors in ``x`` (nested tuples, lists, dicts) as fp32."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.float() if x.is_floating_point() and x.dtype != torch.float32 else x
    if isinstance(x, tuple | list):
        return type(x)(_up(v) for v in x)
    if isinstance(x, dict):
        return {k: _up(v) for k, v in x.items()}
    return x


def forward_context(p: Precision):
    """What the forward pass and the loss run under (``fairseq_adapter.autocast_forward``), or
    None: CPU bf16 autocast (``autocast_context``), GPU bf16 autocast (``cuda_bf16_context``);
    fp16 autocast is fairseq's --amp, which wraps them itself."""
    if not p.autocast or p.fairseq_amp:
        return None
    return cuda_bf16_context if p.device == "cuda" else autocast_context


@contextlib.contextmanager
def cuda_bf16_context():
    """bf16 autocast on a GPU: torch's own op lists (its softmax, norms and losses run fp32)."""
    import torch

    with torch.autocast("cuda", dtype=torch.bfloat16):
        yield


@contextlib.contextmanager
def autocast_context():
    """bf16 autocast on CPU with attention and norms kept fp32 (see the module's docstring)."""
    import torch

    keep_fp32_under_autocast()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield
