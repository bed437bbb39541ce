"""Normalisation layers selectable by name (``norm=layernorm|rmsnorm``)."""

from __future__ import annotations

import torch
from fairseq.modules import LayerNorm
from torch import nn

from lnexp.names import NORMS  # noqa: E402


def make_norm(kind: str, dim: int) -> nn.Module:
    """fairseq's LayerNorm (fused on GPU when apex is there), or RMSNorm as in LLaMA (eps 1e-6)."""
    if kind == "layernorm":
        return LayerNorm(dim)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=1e-6, elementwise_affine=True)
    raise ValueError(f"unknown norm {kind!r}: use one of {', '.join(NORMS)}")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The formula of Zhang & Sennrich (2019), for tests: g * x / sqrt(mean(x^2) + eps)."""
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
