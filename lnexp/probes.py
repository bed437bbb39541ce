"""Gradient and hidden-state measurements (Xiong et al. Fig. 3, Kan et al.). No plotting here.

- ``ffn_grad_norms``, ``HiddenStats``, ``stack_layers``: per-layer gradient norms and hidden-state
  hooks, owned by training (``lnexp.train.norm_tracking``, which ``track_norms`` uses) and re-exported here.
- ``sample_batch``/``loss_and_grads``: a real batch of a dataset and the gradient of the training
  criterion's mean per-token loss on it (fairseq normalises by the sample size the same way).
- ``simplified_layers``/``ln_jacobian_spectral_norm``: the setting of Xiong et al.'s lemmas.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from lnexp.train.norm_tracking import PARAMS, SIDES, HiddenStats, ffn_grad_norms, stack_layers, unwrap

__all__ = ["HiddenStats", "ffn_grad_norms", "stack_layers"]  # used by lnexp.figures


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
    from types import SimpleNamespace

    from lnexp.model.layers import LNEncoderLayer
    from lnexp.model.placement import ResidualSpec
    from lnexp.model.transformer import LNTransformerConfig
    from lnexp.scheme import placement_of

    cfg = LNTransformerConfig()
    cfg.encoder.embed_dim = cfg.encoder.ffn_embed_dim = d
    cfg.encoder.attention_heads = 1
    cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = 0.0
    cfg.activation_fn = "relu"
    scheme = placement_of(SimpleNamespace(placement=placement))
    torch.manual_seed(seed)
    layers = nn.ModuleList(
        LNEncoderLayer(cfg, ResidualSpec.for_layer(scheme, residual_scale, "encoder", i + 1,
                                                   n_layers, n_layers))
        for i in range(n_layers))
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


def cpu_fairseq_config(cfg, arch: str | None = None, **flags):
    """fairseq's config of a training config on CPU (on its dataset), with the architecture and
    fairseq flags replaced (e.g. ``encoder_embed_dim=32``)."""
    from lnexp.train import settings

    replace = {"arch": arch, **flags} if arch else flags
    return settings.fairseq_setup(cfg, {**settings.resolve(cfg, "cpu").flags, **replace}).config


def with_model(fcfg, **model):
    """A copy of a fairseq config with model fields replaced (placement, residual_scale, layers).

    A placement given by name brings its YAML's structure along (``placement_spec``, which the
    model reads first)."""
    import copy
    from types import SimpleNamespace

    from lnexp.scheme import placement_of

    if "placement" in model and "placement_spec" not in model:
        model["placement_spec"] = placement_of(SimpleNamespace(placement=model["placement"])).to_json()
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
        self.model, self.depth = unwrap(model), int(depth)
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
