"""Where LayerNorm sits around each residual sub-layer: the single mechanism behind every placement.

One residual step, for a sub-layer F (self-attention, cross-attention or FFN):

    post_ln   x <- LN(x + dt * F(x))
    deepnorm  x <- LN(alpha * x + dt * F(x))            (Wang et al. 2022)
    pre_ln    x <- x + dt * F(LN(x))                    (+ final LN on the stack's output)
    peri_ln   x <- x + dt * LN_out(F(LN_in(x)))         (+ final LN; Kim et al. 2025)

``dt`` is the residual step of Kan et al. (2025); it is 1 unless configured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from lnexp.names import PLACEMENTS


def deepnorm_constants(enc_layers: int, dec_layers: int) -> dict[str, tuple[float, float]]:
    """DeepNet's (alpha, beta) for an N-layer encoder and M-layer decoder (Wang et al. 2022, Table 1)."""
    n, m = enc_layers, dec_layers
    return {
        "encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
        "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25),
    }


@dataclass(frozen=True)
class ResidualSpec:
    """How one stack (encoder or decoder) wires its residual sub-layers."""

    placement: str = "post_ln"
    residual_scale: float = 1.0  # dt
    alpha: float = 1.0  # DeepNorm's residual weight (1 for every other placement)
    beta: float = 1.0  # DeepNorm's init gain (1 for every other placement)

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}: use one of {PLACEMENTS}")

    @property
    def norm_first(self) -> bool:
        """Normalise the sub-layer input (pre/peri) rather than the residual sum (post/deepnorm)."""
        return self.placement in ("pre_ln", "peri_ln")

    @property
    def output_norm(self) -> bool:
        """Peri-LN also normalises each sub-layer's output before it joins the residual stream."""
        return self.placement == "peri_ln"

    @property
    def final_norm(self) -> bool:
        """Pre- and Peri-LN end each stack with a LayerNorm; Post-LN and DeepNorm already do."""
        return self.norm_first

    @classmethod
    def for_stack(
        cls, placement: str, residual_scale: float, stack: str, enc_layers: int, dec_layers: int
    ) -> ResidualSpec:
        alpha = beta = 1.0
        if placement == "deepnorm":
            alpha, beta = deepnorm_constants(enc_layers, dec_layers)[stack]
        return cls(placement, residual_scale, alpha, beta)


def residual_step(
    spec: ResidualSpec,
    x: torch.Tensor,
    sublayer: Callable[[torch.Tensor], torch.Tensor],
    norm: nn.Module,
    out_norm: nn.Module | None,
    dropout: nn.Module,
) -> torch.Tensor:
    """Apply one residual sub-layer with LayerNorm where ``spec`` puts it.

    Scalings equal to 1 are skipped so that Post-/Pre-LN run exactly fairseq's arithmetic.
    """
    h = norm(x) if spec.norm_first else x
    y = sublayer(h)
    if out_norm is not None:
        y = out_norm(y)
    y = dropout(y)
    if spec.residual_scale != 1.0:
        y = y * spec.residual_scale
    residual = x * spec.alpha if spec.alpha != 1.0 else x
    x = residual + y
    return x if spec.norm_first else norm(x)


def deepnorm_init_(beta: float, fc1: nn.Linear, fc2: nn.Linear, *attns: nn.Module) -> None:
    """DeepNet's init: Xavier-normal with gain beta for the FFN and each attention's value and output
    projections, gain 1 for its Q/K. Each weight is drawn once, in the order fc1, fc2, then per
    attention v, out, q, k."""
    for lin in (fc1, fc2):
        nn.init.xavier_normal_(lin.weight, gain=beta)
    for attn in attns:
        for lin in (attn.v_proj, attn.out_proj):
            nn.init.xavier_normal_(lin.weight, gain=beta)
        for lin in (attn.q_proj, attn.k_proj):
            nn.init.xavier_normal_(lin.weight, gain=1.0)
