"""Gradient and hidden-state measurements (Xiong et al. Fig. 3, Kan et al.). No plotting here.

- ``ffn_grad_norms``: Frobenius norm of the gradient of every FFN's W1 (fc1) and W2 (fc2), per
  stack and layer (layers numbered from 1 in each stack).
- ``HiddenStats``: forward hooks collecting per-layer statistics of the hidden states (the residual
  stream after each layer, and the input of each layer's last LayerNorm: Post-LN's x^{post,5}).
- ``NormTracker``: both of the above every N updates of a training run, to a CSV and TensorBoard.
- ``sample_batch``/``loss_and_grads``: a real batch of a dataset and the gradient of the training
  criterion's mean per-token loss on it (fairseq normalises by the sample size the same way).
- ``simplified_layers``/``ln_jacobian_spectral_norm``: the setting of Xiong et al.'s lemmas.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

SIDES = ("encoder", "decoder")
PARAMS = {"W1": "fc1", "W2": "fc2"}


def _unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and not hasattr(model, "encoder"):
        model = model.module
    return model


def stack_layers(model: nn.Module | dict[str, Iterable[nn.Module]]) -> dict[str, list[nn.Module]]:
    """{'encoder': [layer 1, ...], 'decoder': [...]} of a fairseq encoder-decoder (or given as is)."""
    if isinstance(model, dict):
        return {side: list(layers) for side, layers in model.items()}
    model = _unwrap(model)
    out = {}
    for side in SIDES:
        stack = getattr(model, side, None)
        if stack is not None and hasattr(stack, "layers"):
            out[side] = list(stack.layers)
    return out


def ffn_grad_norms(model) -> dict[tuple[str, int, str], float]:
    """{(side, layer, 'W1'|'W2'): ‖∂loss/∂W‖_F} from the gradients now in ``.grad`` (nan if none)."""
    keys, norms = [], []
    for side, layers in stack_layers(model).items():
        for i, layer in enumerate(layers, start=1):
            for name, attr in PARAMS.items():
                grad = getattr(layer, attr).weight.grad
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

    Call ``after_update(n)`` after update n (its gradients still in ``.grad``, normalised by the
    sample size as fairseq does; after clipping when clip_norm > 0). Hidden-state statistics come
    from the training forward passes of that same update (hooks armed one update ahead, padding
    excluded, dropout on as in training). Rows are written at update 1 and every ``every``
    updates to ``csv_path`` (one row per stack and layer) and, if ``tb`` (a SummaryWriter) is
    given, to TensorBoard as grad_W1/…, grad_W2/…, hidden_rms/…, hidden_mean_abs/….
    On resume from update ``start_update``, rows written after it are dropped (atomic rewrite).
    """

    def __init__(self, model, csv_path: Path, every: int, start_update: int = 0, tb=None) -> None:
        self.model = model
        self.path = Path(csv_path)
        self.every = max(1, int(every))
        self.tb = tb
        self.last = int(start_update)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in _read_rows(self.path) if int(r["update"]) <= self.last]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=TRACK_FIELDS)
            w.writeheader()
            w.writerows(kept)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        self.stats = HiddenStats(model, points=("output",), only_training=True,
                                 enabled=self.due(self.last + 1))

    def due(self, n: int) -> bool:
        return n == 1 or n % self.every == 0

    def after_update(self, n: int) -> list[dict[str, Any]]:
        """Record update ``n`` if it is due; returns the rows written."""
        rows: list[dict[str, Any]] = []
        if n > self.last and self.due(n):
            grads = ffn_grad_norms(self.model)
            hidden = self.stats.summary()
            for side, layers in stack_layers(self.model).items():
                for i in range(1, len(layers) + 1):
                    h = hidden.get((side, i, "output")) or _Acc().summary()
                    rows.append({"update": n, "side": side, "layer": i,
                                 "w1_grad_norm": grads[(side, i, "W1")],
                                 "w2_grad_norm": grads[(side, i, "W2")],
                                 "h_sq_norm_per_d": h["sq_norm_per_d"], "h_mean_abs": h["mean_abs"],
                                 "h_var": h["var"], "h_max_abs": h["max_abs"]})
            with open(self.path, "a", newline="", encoding="utf-8") as f:
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


# --- real batches and gradients -----------------------------------------------------------------


def sample_batch(task, split: str, max_tokens: int, seed: int):
    """A batch of random sentences of ``split`` (chosen by ``seed``) of at most ``max_tokens``
    padded tokens (longest sentence x sentences, as fairseq's batching counts them)."""
    import numpy as np

    ds = task.dataset(split)
    order = np.random.RandomState(seed).permutation(len(ds))
    ids: list[int] = []
    longest = 0
    for i in order:
        n = int(ds.num_tokens(int(i)))
        if ids and max(longest, n) * (len(ids) + 1) > max_tokens:
            break
        ids.append(int(i))
        longest = max(longest, n)
    return ds.collater([ds[j] for j in sorted(ids)])


def loss_and_grads(model, criterion, sample, only: Iterable[nn.Parameter] | None = None) -> float:
    """Gradient of the criterion's mean loss per sample-size unit (per target token), left in
    ``.grad``; returns that loss (nats). ``only``: compute weight gradients for these alone."""
    if only is not None:
        keep = {id(p) for p in only}
        for p in model.parameters():
            p.requires_grad_(id(p) in keep)
    model.zero_grad(set_to_none=True)
    loss, sample_size, _ = criterion(model, sample)
    (loss / sample_size).backward()
    return float(loss.detach()) / float(sample_size)


def ffn_weights(model) -> list[nn.Parameter]:
    return [getattr(layer, attr).weight for layers in stack_layers(model).values()
            for layer in layers for attr in PARAMS.values()]


# --- the setting of Xiong et al.'s lemmas -------------------------------------------------------


def simplified_layers(placement: str, d: int, n_layers: int, seed: int = 0,
                      residual_scale: float = 1.0) -> nn.ModuleList:
    """lnexp's real encoder layers in Xiong et al.'s setting: one head, W_Q = W_K = 0 (uniform
    attention), FFN width d with ReLU, Xavier-normal weights (variance 1/d), zero biases, unit LN
    gains, no dropout."""
    from lnexp.model.layers import LNEncoderLayer
    from lnexp.model.placement import ResidualSpec
    from lnexp.model.transformer import LNTransformerConfig

    cfg = LNTransformerConfig()
    cfg.encoder.embed_dim = cfg.encoder.ffn_embed_dim = d
    cfg.encoder.attention_heads = 1
    cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = 0.0
    cfg.activation_fn = "relu"
    spec = ResidualSpec(placement, residual_scale)
    torch.manual_seed(seed)
    layers = nn.ModuleList(LNEncoderLayer(cfg, spec) for _ in range(n_layers))
    for layer in layers:
        attn = layer.self_attn
        for lin in (attn.v_proj, attn.out_proj, layer.fc1, layer.fc2):
            nn.init.xavier_normal_(lin.weight)
        for lin in (attn.q_proj, attn.k_proj):
            nn.init.zeros_(lin.weight)
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, layer.fc1, layer.fc2):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
    return layers.eval()


@torch.no_grad()
def run_layers(layers: Iterable[nn.Module], x: Tensor) -> Tensor:
    """Encoder layers applied in turn to T x B x C hidden states (no padding)."""
    for layer in layers:
        x = layer(x, None)
    return x


def ln_jacobian_spectral_norm(x: Tensor, eps: float = 1e-5) -> float:
    """‖J_LN(x)‖₂, the exact spectral norm of LayerNorm's Jacobian (unit gain, zero bias) at x."""
    from torch.autograd.functional import jacobian

    d = x.numel()

    def ln(v: Tensor) -> Tensor:
        return torch.nn.functional.layer_norm(v, (d,), eps=eps)

    jac = jacobian(ln, x.double(), vectorize=True)
    return float(torch.linalg.matrix_norm(jac, ord=2))


# --- models of a Hydra config, for measurements -------------------------------------------------


def compose_config(overrides: list[str]):
    """lnexp's training config (configs/train.yaml) with Hydra overrides, checked."""
    from lnexp import config

    return config.compose(overrides)


def fairseq_config(cfg, data, arch: str | None = None, **flags):
    """fairseq's config of a training config, with the architecture and fairseq flags replaced
    (e.g. ``encoder_embed_dim=32``)."""
    from lnexp import fairseq_adapter as fa
    from lnexp.train import settings

    f = settings.fairseq_flags(cfg, 1, "cpu")
    if arch:
        f["arch"] = arch
    f.update(flags)
    return fa.to_fairseq_config(fa.training_args(data.bin_dir, f))


def with_model(fcfg, **model):
    """A copy of a fairseq config with model fields replaced (placement, residual_scale, layers)."""
    import copy

    out = copy.deepcopy(fcfg)
    for k, v in model.items():
        setattr(out.model, k, v)
    return out


class truncated:
    """Context manager: an encoder-decoder's first ``depth`` layers per stack (then restored).

    With Post-/Pre-/Peri-LN, layers are initialised independently and identically whatever the
    depth, so the first L layers of a freshly initialised deeper model are an L-layer model at init.
    """

    def __init__(self, model, depth: int) -> None:
        self.model, self.depth = _unwrap(model), int(depth)
        self.saved: dict[str, nn.ModuleList] = {}

    def __enter__(self):
        for side in SIDES:
            stack = getattr(self.model, side)
            if self.depth > len(stack.layers):
                raise ValueError(f"{side} has {len(stack.layers)} layers, fewer than {self.depth}")
            self.saved[side] = stack.layers
            stack.layers = nn.ModuleList(list(stack.layers)[: self.depth])
            stack.num_layers = self.depth
        return self.model

    def __exit__(self, *exc) -> None:
        for side, layers in self.saved.items():
            stack = getattr(self.model, side)
            stack.layers, stack.num_layers = layers, len(layers)


def load_init_weights(model, state: dict[str, Tensor]) -> None:
    """Copy another placement's initial weights in; only parameter-free-at-init norms may differ
    (Peri-LN's output norms, Pre-/Peri-LN's final norms: gain 1, bias 0 at init)."""
    result = model.load_state_dict(state, strict=False)
    bad = [k for k in result.missing_keys if "norm" not in k] + list(result.unexpected_keys)
    if bad:
        raise ValueError(f"weights do not match the model: {bad[:5]}")
