"""``compile=true``: every encoder and decoder layer under torch.compile (inductor, dynamic shapes),
with a fallback to the eager layers that says why when compiling fails.

torch.compile compiles lazily, at a layer's first call (and again for a new kind of input), so a
failure shows as an exception of torch's compiler stack inside an update; ``CompiledLayers.step``
catches exactly those, restores the eager layers, logs the reason once and redoes the update
(nothing was stepped: the failure is in the forward or backward pass). On 2 CPUs it does not pay
at the mini size (docs/performance.md "Fast paths"), so it is off by default.
"""

from __future__ import annotations

import logging
from typing import Any

from lnexp import fairseq_adapter as fa

log = logging.getLogger("lnexp.train")
RECOMPILE_LIMIT = 64  # one code object shared by the layer instances of both stacks


def is_compile_error(e: BaseException) -> bool:
    """An exception raised by torch's compiler stack (dynamo, inductor, their backends)."""
    return any(type(x).__module__.startswith(("torch._dynamo", "torch._inductor"))
               for x in (e, e.__cause__, e.__context__) if x is not None)


class CompiledLayers:
    """The model's layers compiled in place; ``step`` is ``fa.train_step`` with the fallback."""

    def __init__(self, model) -> None:
        import torch

        self.layers = [*model.encoder.layers, *model.decoder.layers]
        self.failed: str | None = None
        try:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                       RECOMPILE_LIMIT)
            for layer in self.layers:
                layer.compile(dynamic=True)
        except Exception as e:  # torch without a working compiler: say so, train eager
            self.fall_back(e)
        else:
            log.info("compile=true: %d layers under torch.compile (inductor, dynamic shapes); the "
                     "first updates include compiling them", len(self.layers))

    def fall_back(self, e: BaseException) -> None:
        for layer in self.layers:
            layer._compiled_call_impl = None  # nn.Module.compile's hook: back to the eager call
        root = e
        while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
            root = inner  # the compiler's own error, under dynamo's wrapper
        text = str(root).strip()
        self.failed = f"{type(root).__name__}: {text.splitlines()[0] if text else ''}" + (
            f", in {type(e).__name__}" if root is not e else "")
        log.warning("compile=true failed (%s): training with the eager layers", self.failed)

    def step(self, trainer, samples) -> dict[str, Any] | None:
        if self.failed is not None:
            return fa.train_step(trainer, samples)
        try:
            return fa.train_step(trainer, samples)
        except Exception as e:
            if not is_compile_error(e):
                raise
            self.fall_back(e)
            return fa.train_step(trainer, samples)
