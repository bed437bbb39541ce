"""Per-layer gradient and hidden-state norms during training (``track_norms``), and the helpers the
Fig. 3 probes share with it.

- ``ffn_grad_norms``: Frobenius norm of the gradient of every FFN's W1 (fc1) and W2 (fc2), per
  stack and layer (layers numbered from 1 in each stack). ``grad_of`` picks which gradient: the
  model's ``.grad`` by default, or the fp32 gradient the optimizer stepped with
  (``fairseq_adapter.stepped_grads``: under bf16/fp16 fairseq normalises and clips a fp32 master
  copy, and the model's own ``.grad`` keeps the raw, loss-scaled sum).
- ``HiddenStats``: forward hooks collecting per-layer statistics of the hidden states (the residual
  stream after each layer, and the input of each layer's last LayerNorm: Post-LN's x^{post,5}).
- ``NormTracker``: both of the above every N updates of a training run, to a CSV and TensorBoard.

Training owns this module; ``lnexp.probes`` (Fig. 3 measurements) imports it from here.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lnexp.rundir import append_file, atomic_file

GradOf = Callable[[nn.Parameter], Tensor | None]

SIDES = ("encoder", "decoder")
PARAMS = {"W1": "fc1", "W2": "fc2"}


def unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and not hasattr(model, "encoder"):
        model = model.module
    return model


def stack_layers(model: nn.Module | dict[str, Iterable[nn.Module]]) -> dict[str, list[nn.Module]]:
    """{'encoder': [layer 1, ...], 'decoder': [...]} of a fairseq encoder-decoder (or given as is)."""
    if isinstance(model, dict):
        return {side: list(layers) for side, layers in model.items()}
    model = unwrap(model)
    out = {}
    for side in SIDES:
        stack = getattr(model, side, None)
        if stack is not None and hasattr(stack, "layers"):
            out[side] = list(stack.layers)
    return out


def ffn_grad_norms(model, grad_of: GradOf | None = None) -> dict[tuple[str, int, str], float]:
    """{(side, layer, 'W1'|'W2'): ‖∂loss/∂W‖_F} from the gradients now in ``.grad``, or those
    ``grad_of(weight)`` gives (nan if none)."""
    keys, norms = [], []
    for side, layers in stack_layers(model).items():
        for i, layer in enumerate(layers, start=1):
            for name, attr in PARAMS.items():
                weight = getattr(layer, attr).weight
                grad = weight.grad if grad_of is None else grad_of(weight)
                keys.append((side, i, name))
                norms.append(grad.detach().float().norm() if grad is not None
                             else torch.tensor(math.nan))
    values = torch.stack([n.cpu() for n in norms]).tolist() if norms else []
    return dict(zip(keys, values, strict=True))


# --- hidden states ------------------------------------------------------------------------------

POINTS = ("input", "output", "pre_final_ln")


class _Acc:
    __slots__ = ("tokens", "dim", "sq", "abs", "sum", "max_abs")

    def __init__(self) -> None:
        self.tokens, self.dim = 0, 0
        self.sq = self.abs = self.sum = self.max_abs = 0.0

    def add(self, x: Tensor) -> None:  # x: tokens x dim
        x = x.detach().double()
        self.tokens += x.shape[0]
        self.dim = x.shape[1]
        self.sq += float(x.pow(2).sum())
        self.abs += float(x.abs().sum())
        self.sum += float(x.sum())
        self.max_abs = max(self.max_abs, float(x.abs().max())) if x.numel() else self.max_abs

    def summary(self) -> dict[str, float]:
        n = self.tokens * self.dim
        if n == 0:
            return {"sq_norm_per_d": math.nan, "mean_abs": math.nan, "var": math.nan,
                    "max_abs": math.nan, "tokens": 0}
        mean = self.sum / n
        return {"sq_norm_per_d": self.sq / n,  # E‖x‖²/d over tokens
                "mean_abs": self.abs / n,  # mean |x_i| over tokens and coordinates
                "var": self.sq / n - mean * mean,  # variance of the coordinates
                "max_abs": self.max_abs, "tokens": self.tokens}


def _tokens(x: Tensor, pad_mask: Tensor | None) -> Tensor:
    """T x B x C hidden states -> (non-padding tokens) x C."""
    if x.dim() == 2:
        return x
    x = x.transpose(0, 1)  # B x T x C
    if pad_mask is not None and pad_mask.shape == x.shape[:2]:
        return x[~pad_mask.bool()]
    return x.reshape(-1, x.shape[-1])


class HiddenStats:
    """Per-layer statistics of hidden states, collected by hooks while ``enabled``.

    ``input``/``output``: the residual stream before/after each layer;
    ``pre_final_ln``: the input of the layer's last LayerNorm (``final_layer_norm``): for Post-LN
    the FFN output plus residual, Xiong et al.'s x^{post,5}. Padding tokens are left out.
    Statistics add up over forward passes until ``reset()``.
    """

    def __init__(self, model, points: Iterable[str] = ("output",), only_training: bool = False,
                 enabled: bool = True) -> None:
        self.points = tuple(points)
        unknown = set(self.points) - set(POINTS)
        if unknown:
            raise ValueError(f"unknown points {sorted(unknown)}: use {POINTS}")
        self.only_training = only_training
        self.enabled = enabled
        self._acc: dict[tuple[str, int, str], _Acc] = {}
        self._mask: dict[tuple[str, int], Tensor | None] = {}
        self._handles = []
        for side, layers in stack_layers(model).items():
            for i, layer in enumerate(layers, start=1):
                key = (side, i)
                self._handles.append(layer.register_forward_pre_hook(
                    self._pre_hook(key, side, "input" in self.points), with_kwargs=True))
                if "output" in self.points:
                    self._handles.append(layer.register_forward_hook(self._out_hook(key)))
                if "pre_final_ln" in self.points:
                    self._handles.append(layer.final_layer_norm.register_forward_pre_hook(
                        self._ln_hook(key, layer)))

    def _active(self, module: nn.Module) -> bool:
        return self.enabled and (module.training or not self.only_training)

    def _pre_hook(self, key, side, record_input: bool):
        def hook(module, args, kwargs):
            if self._active(module):
                if side == "decoder":
                    mask = kwargs.get("self_attn_padding_mask")
                else:
                    mask = kwargs.get("encoder_padding_mask", args[1] if len(args) > 1 else None)
                self._mask[key] = mask
                if record_input:
                    self._record(key, "input", args[0] if args else kwargs["x"])
        return hook

    def _out_hook(self, key):
        def hook(module, args, output):
            if self._active(module):
                x = output[0] if isinstance(output, tuple) else output
                self._record(key, "output", x)
        return hook

    def _ln_hook(self, key, layer):
        def hook(module, args):
            if self._active(layer):
                self._record(key, "pre_final_ln", args[0])
        return hook

    def _record(self, key: tuple[str, int], point: str, x: Tensor) -> None:
        acc = self._acc.setdefault((*key, point), _Acc())
        acc.add(_tokens(x, self._mask.get(key)))

    def summary(self) -> dict[tuple[str, int, str], dict[str, float]]:
        """{(side, layer, point): {sq_norm_per_d, mean_abs, var, max_abs, tokens}}."""
        return {k: a.summary() for k, a in sorted(self._acc.items())}

    def reset(self) -> None:
        self._acc.clear()
        self._mask.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> HiddenStats:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


# --- tracking during training -------------------------------------------------------------------

TRACK_FIELDS = ("update", "side", "layer", "w1_grad_norm", "w2_grad_norm", "h_sq_norm_per_d",
                "h_mean_abs", "h_var", "h_max_abs")


def _read_rows(path: Path) -> list[dict[str, str]]:
    """Complete rows of a tracker CSV (a line cut short by a kill is dropped)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return []
    good = []
    for r in rows:
        if None in r or any(r.get(k) in (None, "") for k in TRACK_FIELDS):
            continue
        try:
            int(r["update"]), [float(r[k]) for k in TRACK_FIELDS[3:]]
        except ValueError:
            continue
        good.append(r)
    return good


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


class NormTracker:
    """Per-layer FFN gradient norms and hidden-state statistics of a training run, every N updates.

    Call ``after_update(n)`` after update n, while its gradients are still there: the ones
    ``grad_of`` gives (for a fairseq Trainer ``fairseq_adapter.stepped_grads(trainer)``: fp32,
    normalised by the sample size, unscaled and clipped, as the optimizer stepped with them under
    every precision), else the model's ``.grad``. Hidden-state statistics come
    from the training forward passes of that same update (hooks armed one update ahead, padding
    excluded, dropout on as in training). Rows are written at update 1 and every ``every``
    updates to ``csv_path`` (one row per stack and layer) and, if ``tb`` (a SummaryWriter) is
    given, to TensorBoard as grad_W1/…, grad_W2/…, hidden_rms/…, hidden_mean_abs/….
    On resume from update ``start_update``, rows written after it are dropped (atomic rewrite).
    """

    def __init__(self, model, csv_path: Path, every: int, start_update: int = 0, tb=None,
                 grad_of: GradOf | None = None) -> None:
        self.model = model
        self.grad_of = grad_of
        self.path = Path(csv_path)
        self.every = max(1, int(every))
        self.tb = tb
        self.last = int(start_update)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in _read_rows(self.path) if int(r["update"]) <= self.last]
        with atomic_file(self.path) as f:
            w = csv.DictWriter(f, fieldnames=TRACK_FIELDS)
            w.writeheader()
            w.writerows(kept)
        self.stats = HiddenStats(model, points=("output",), only_training=True,
                                 enabled=self.due(self.last + 1))

    def due(self, n: int) -> bool:
        return n == 1 or n % self.every == 0

    def after_update(self, n: int) -> list[dict[str, Any]]:
        """Record update ``n`` if it is due; returns the rows written."""
        rows: list[dict[str, Any]] = []
        if n > self.last and self.due(n):
            grads = ffn_grad_norms(self.model, self.grad_of)
            hidden = self.stats.summary()
            for side, layers in stack_layers(self.model).items():
                for i in range(1, len(layers) + 1):
                    h = hidden.get((side, i, "output")) or _Acc().summary()
                    rows.append({"update": n, "side": side, "layer": i,
                                 "w1_grad_norm": grads[(side, i, "W1")],
                                 "w2_grad_norm": grads[(side, i, "W2")],
                                 "h_sq_norm_per_d": h["sq_norm_per_d"], "h_mean_abs": h["mean_abs"],
                                 "h_var": h["var"], "h_max_abs": h["max_abs"]})
            with append_file(self.path) as f:
                csv.DictWriter(f, fieldnames=TRACK_FIELDS).writerows(
                    {k: _fmt(v) for k, v in r.items()} for r in rows)
            if self.tb is not None:
                for r in rows:
                    tag = f"{r['side']}.{r['layer']}"
                    self.tb.add_scalar(f"grad_W1/{tag}", r["w1_grad_norm"], n)
                    self.tb.add_scalar(f"grad_W2/{tag}", r["w2_grad_norm"], n)
                    if math.isfinite(r["h_sq_norm_per_d"]):
                        self.tb.add_scalar(f"hidden_rms/{tag}", math.sqrt(r["h_sq_norm_per_d"]), n)
                        self.tb.add_scalar(f"hidden_mean_abs/{tag}", r["h_mean_abs"], n)
        self.last = max(self.last, n)
        self.stats.reset()
        self.stats.enabled = self.due(n + 1)
        return rows

    def close(self) -> None:
        self.stats.remove()
