"""Where the norms sit around each residual sub-layer: the single mechanism behind every placement.

One residual step, for a sub-layer F (self-attention, cross-attention or FFN), with the switches a
placement's YAML sets (configs/placement/*.yaml, read by lnexp.scheme.Placement):

    h = Norm_in(x) * s          if input_norm   (s = input_norm_scale: 1, or LayerNorm Scaling's 1/sqrt(l))
    y = Norm_out(F(h))          if output_norm
    r = Norm_in(x) if norm_residual else x       (HybridNorm's FFN: the sum starts after the norm)
    x <- a*w*r + dt*g*y [+ skip]  (a = residual_weight, w = Admin's per-dimension gain,
                                   g = ReZero's gate, skip = a structure's extra term;
                                   nGPT's sphere: x <- x + |a|*(y - x), a learned per dimension)
    x <- Norm(x)                if sum_norm

    post_ln   x <- Norm(x + dt*F(x))
    deepnorm  x <- Norm(alpha*x + dt*F(x))            (Wang et al. 2022)
    pre_ln    x <- x + dt*F(Norm(x))                  (+ final norm on the stack's output)
    peri_ln   x <- x + dt*Norm_out(F(Norm_in(x)))     (+ final norm; Kim et al. 2025)

``dt`` is the residual step of Kan et al. (2025); it is 1 unless configured.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from lnexp.names import PLACEMENTS
from lnexp.scheme import Init, Placement, deepnorm_constants, evaluate

__all__ = ["PLACEMENTS", "ResidualGain", "ResidualSpec", "deepnorm_constants", "init_layer_",
           "plain_xavier_factor", "residual_step"]


@dataclass(frozen=True)
class ResidualSpec:
    """One sub-layer kind of one layer: the scheme as its YAML states it (``scheme``, the one
    Placement every layer of the model shares) and what the layer's place decides of it: the
    switches after ``sublayers`` and ``first_layers``, the depth formulas evaluated."""

    scheme: Placement
    residual_scale: float = 1.0  # dt
    alpha: float = 1.0  # residual_weight here (DeepNorm's alpha; 1 for most placements)
    beta: float = 1.0  # init.gain here: the gain of the matrices the placement scales (DeepNorm's beta)
    input_norm_scale: float = 1.0  # here (LayerNorm Scaling's 1/sqrt(l))
    input_norm: bool = False
    output_norm: bool = False
    sum_norm: bool = True
    inner_norm: bool = False
    norm_residual: bool = False  # the residual is Norm_in(x), not x (HybridNorm's FFN)
    head_scale: bool = False
    scaled_init: bool = True  # false: the init's gain skips this sub-layer (torchscale's cross-attention)

    @property
    def norm_first(self) -> bool:
        """Normalise the sub-layer input (pre/peri) rather than the residual sum (post/deepnorm)."""
        return self.input_norm

    @property
    def has_norm(self) -> bool:
        """Whether a sub-layer's main norm (``*_layer_norm``) is used, on its input or on the sum."""
        return self.input_norm or self.sum_norm

    @property
    def init(self) -> Init:
        """The scheme's init as it reaches this sub-layer's matrices (none where scaled_init is off)."""
        init = self.scheme.init
        return init if self.scaled_init else replace(init, scaled=(), unit=(), plain_xavier=())

    @classmethod
    def for_layer(cls, placement: Placement, residual_scale: float, stack: str, layer: int,
                  enc_layers: int, dec_layers: int, sublayer: str = "attention") -> ResidualSpec:
        """``placement`` at the ``sublayer`` kind (attention, cross_attention or ffn) of 1-based
        layer ``layer`` of ``stack`` in an N+M-layer model."""
        n_stack = enc_layers if stack == "encoder" else dec_layers
        at = (stack, layer, enc_layers, dec_layers)
        return cls(
            scheme=placement, residual_scale=float(residual_scale),
            alpha=evaluate(placement.residual_weight, *at), beta=evaluate(placement.init.gain, *at),
            input_norm_scale=evaluate(placement.input_norm_scale, *at),
            **placement.switches(layer, n_stack, sublayer),
        )


class ResidualGain(nn.Module):
    """Admin's residual sum w * x + y, w one learnable weight per dimension (Liu et al. 2020). It is
    1 when built; lnexp.model.admin's profiling pass sets it (a module, so that the pass sees the
    sum's two terms, and a parameter, so that checkpoints carry it)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * self.weight + y


def residual_step(
    spec: ResidualSpec,
    x: torch.Tensor,
    sublayer: Callable[[torch.Tensor], torch.Tensor],
    norm: nn.Module | None,
    out_norm: nn.Module | None,
    dropout: nn.Module,
    gate: torch.Tensor | None = None,
    skip: torch.Tensor | None = None,
    gain: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply one residual sub-layer with its norms where ``spec`` puts them; returns the new x and
    the branch it added (ResiDual's dual stream sums the branches). ``gain``, if any, makes the sum
    of the residual and the branch: Admin's ``ResidualGain`` w*x + y, nGPT's ``SphereStep``
    x + |a|*(y - x) (lnexp/model/sphere.py).

    Scalings equal to 1 are skipped so that Post-/Pre-LN run exactly fairseq's arithmetic.
    """
    normed = norm(x) if spec.input_norm else x
    h = normed * spec.input_norm_scale if spec.input_norm_scale != 1.0 else normed
    y = sublayer(h)
    if out_norm is not None:
        y = out_norm(y)
    y = dropout(y)
    if spec.residual_scale != 1.0:
        y = y * spec.residual_scale
    if gate is not None:
        y = gate * y
    base = normed if spec.norm_residual else x
    residual = base * spec.alpha if spec.alpha != 1.0 else base
    x = gain(residual, y) if gain is not None else residual + y
    if skip is not None:
        x = x + skip
    return (norm(x) if spec.sum_norm else x), y


FFN_MATRICES = ("fc1", "fc2")


def plain_xavier_factor(name: str, lin: nn.Linear) -> float:
    """What turns fairseq's draw of matrix ``name`` into a plain Xavier-uniform draw (gain 1), the
    bound of both being uniform: q/k/v are drawn with gain 1/sqrt(2) (MultiheadAttention
    .reset_parameters), out_proj with gain 1, fc1/fc2 by torch's nn.Linear default, bound
    1/sqrt(fan_in)."""
    fan_out, fan_in = lin.weight.shape
    if name in FFN_MATRICES:
        return math.sqrt(6.0 / (fan_in + fan_out)) * math.sqrt(fan_in)
    return math.sqrt(2.0) if name in ("q_proj", "k_proj", "v_proj") else 1.0


def init_layer_(spec: ResidualSpec, matrices: dict[str, nn.Linear]) -> None:
    """The placement's initialisation of one sub-layer's matrices (its YAML's ``init``; a layer
    calls it for its FFN, then for each attention, in that order).

    draw=xavier_normal (DeepNet): the ``scaled`` matrices are redrawn Xavier-normal with gain beta,
    the ``unit`` ones with gain 1, in the order listed. draw=fairseq (T-Fixup, Sub-LN, B2T):
    fairseq's draws are kept, those in ``plain_xavier`` first brought to a plain Xavier-uniform
    draw (FFN biases 0), and the ``scaled`` matrices multiplied by beta (their biases too with
    ``init.bias``).
    """
    init = spec.init
    if init.draw == "xavier_normal":
        for n in init.scaled + init.unit:
            if n in matrices:
                nn.init.xavier_normal_(matrices[n].weight, gain=spec.beta if n in init.scaled else 1.0)
        return
    with torch.no_grad():
        for n in init.plain_xavier:
            if n in matrices:
                lin = matrices[n]
                lin.weight.mul_(plain_xavier_factor(n, lin))
                if n in FFN_MATRICES and lin.bias is not None:
                    lin.bias.zero_()
        for n in init.scaled:
            if n in matrices:
                matrices[n].weight.mul_(spec.beta)
                if init.bias and matrices[n].bias is not None:
                    matrices[n].bias.mul_(spec.beta)
