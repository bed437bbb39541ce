"""Normalisation layers selectable by name (``norm=layernorm|rmsnorm|dyt``, configs/norm/)."""

from __future__ import annotations

import torch
from fairseq.modules import LayerNorm
from torch import nn

from lnexp.scheme import Norm


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al. 2025): gamma * tanh(alpha * x) + beta, alpha one learnable scalar."""

    def __init__(self, dim: int, alpha0: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias


def is_fairseq_layernorm(norm: Norm) -> bool:
    """The norm fairseq's layers already build (LayerNorm, eps 1e-5): kept, not rebuilt."""
    return norm.name == "layernorm" and norm.eps == 1e-5


def make_norm(norm: Norm | str, dim: int) -> nn.Module:
    """fairseq's LayerNorm (fused on GPU when apex is there), RMSNorm as in LLaMA, or DyT."""
    norm = Norm(norm) if isinstance(norm, str) else norm
    if norm.name == "layernorm":
        return LayerNorm(dim, eps=norm.eps)
    if norm.name == "rmsnorm":
        return nn.RMSNorm(dim, eps=norm.eps, elementwise_affine=True)
    return DyT(dim, norm.alpha0)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The formula of Zhang & Sennrich (2019), for tests: g * x / sqrt(mean(x^2) + eps)."""
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
