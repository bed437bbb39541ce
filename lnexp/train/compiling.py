"""``compile=true``: every encoder and decoder layer under torch.compile (inductor), with a fallback
to the eager layers that says why when compiling fails; ``speed.buckets``: batches padded to a few
shapes, so that compiled code and CUDA graphs are reused.

torch.compile compiles lazily, at a layer's first call (and again for a new kind of input), so a
failure shows as an exception of torch's compiler stack inside an update; ``CompiledLayers.step``
catches exactly those, restores the eager layers, logs the reason once and redoes the update
(nothing was stepped: the failure is in the forward or backward pass). On 2 CPUs it does not pay
at the mini size (docs/performance.md "Fast paths"), so it is off by default.

``speed.compile_mode=reduce-overhead`` adds CUDA graphs (one recorded graph replayed per batch
shape: the kernel launches of a layer's forward and backward become one replay). It needs fixed
shapes: the layers compile with static shapes, one variant per bucket of ``speed.buckets``; on a
CPU it falls back to ``default``, saying so.
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
    """The model's layers compiled in place; ``step`` is the run's update (``train_step``:
    ``fairseq_adapter.train_step`` as the speed settings make it) with the fallback."""

    def __init__(self, model, mode: str = "default", device: str = "cpu", buckets: int = 0,
                 train_step=fa.train_step) -> None:
        import torch

        self.layers = [*model.encoder.layers, *model.decoder.layers]
        self.failed: str | None = None
        self.train_step = train_step
        if mode == "reduce-overhead" and device != "cuda":
            log.warning("speed.compile_mode=reduce-overhead needs a GPU (CUDA graphs): compiling "
                        "with mode=default")
            mode = "default"
        self.graphs = mode == "reduce-overhead"
        # CUDA graphs want fixed shapes: one static variant per bucket (and per layer instance)
        dynamic = not (self.graphs and buckets)
        limit = max(RECOMPILE_LIMIT, len(self.layers) * (buckets + 2))
        try:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
            for layer in self.layers:
                layer.compile(dynamic=dynamic, mode=None if mode == "default" else mode)
        except Exception as e:  # torch without a working compiler: say so, train eager
            self.fall_back(e)
        else:
            log.info("compile=true: %d layers under torch.compile (inductor, %s shapes%s); the "
                     "first updates include compiling them", len(self.layers),
                     "dynamic" if dynamic else "static", f", mode={mode}" if mode != "default"
                     else "")
            if self.graphs and not buckets:
                log.warning("speed.compile_mode=reduce-overhead without speed.buckets: a CUDA "
                            "graph is recorded for every new batch shape")

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
            return self.train_step(trainer, samples)
        try:
            if self.graphs:  # a new iteration: the graphs' outputs of the last one may be reused
                import torch

                torch.compiler.cudagraph_mark_step_begin()
            return self.train_step(trainer, samples)
        except Exception as e:
            if not is_compile_error(e):
                raise
            self.fall_back(e)
            return self.train_step(trainer, samples)


class Buckets:
    """``speed.buckets``: a batch padded to a few shapes. Its longest sentence L (source or target
    tokens, as fairseq's batching counts them) picks the first bucket length b >= L; source,
    previous-output and target tokens are padded to b columns, and rows are added up to the most a
    batch of that bucket can hold under ``max_tokens`` (max_tokens // (the bucket below + 1)), so
    that each bucket is one shape. An added row has one end-of-sentence source token and no target
    token: it adds nothing to the loss, the sample size or the token count, and the padding is
    masked as any padding is (the loss is the same up to the rounding of differently sized
    matrix products). A batch longer than the last bucket keeps its shape."""

    def __init__(self, lengths: tuple[int, ...], max_tokens: int, task) -> None:
        self.lengths = tuple(sorted(set(lengths)))
        self.max_tokens = int(max_tokens)
        d = task.source_dictionary
        self.pad_index, self.eos = d.pad(), d.eos()
        self.left_source = bool(getattr(task.cfg, "left_pad_source", True))
        self.left_target = bool(getattr(task.cfg, "left_pad_target", False))
        self.too_long = 0  # batches longer than the last bucket (left as they are)

    def shape(self, rows: int, longest: int) -> tuple[int, int] | None:
        """(rows, columns) of a batch of ``rows`` sentences whose longest has ``longest`` tokens;
        None past the last bucket."""
        below = 0
        for b in self.lengths:
            if longest <= b:
                return max(rows, self.max_tokens // (below + 1)), b
            below = b
        return None

    def pad(self, sample: dict[str, Any] | None) -> dict[str, Any] | None:
        """The sample padded to its bucket's shape (a new dict; the sample is left as it is)."""
        if not sample or "net_input" not in sample or sample.get("target") is None:
            return sample
        import torch

        net = sample["net_input"]
        src, prev, tgt = net["src_tokens"], net["prev_output_tokens"], sample["target"]
        rows = src.shape[0]
        shape = self.shape(rows, max(src.shape[1], tgt.shape[1]))
        if shape is None:
            self.too_long += 1
            if self.too_long == 1:
                log.warning("speed.buckets: a batch of %d tokens a sentence is longer than the last "
                            "bucket (%d): such batches keep their shapes", max(src.shape[1],
                                                                               tgt.shape[1]),
                            self.lengths[-1])
            return sample
        n, width = shape
        extra = n - rows
        out = {**sample, "net_input": {
            **net,
            "src_tokens": self._widen(src, n, width, self.left_source, first_token=self.eos),
            "src_lengths": torch.cat([net["src_lengths"], net["src_lengths"].new_ones(extra)]),
            "prev_output_tokens": self._widen(prev, n, width, self.left_target,
                                              first_token=self.eos)},
            "target": self._widen(tgt, n, width, self.left_target)}
        if torch.is_tensor(sample.get("id")):
            out["id"] = torch.cat([sample["id"], sample["id"].new_full((extra,), -1)])
        return out

    def _widen(self, t, rows: int, width: int, left: bool, first_token: int | None = None):
        """``t`` [B, W] in a [rows, width] tensor of padding (on the padded side: the left if
        ``left``); the added rows hold ``first_token`` where a sentence starts, if given."""
        b, w = t.shape
        out = t.new_full((rows, width), self.pad_index)
        if left:
            out[:b, width - w:] = t
        else:
            out[:b, :w] = t
        if first_token is not None and rows > b:
            out[b:, width - 1 if left else 0] = first_token
        return out
