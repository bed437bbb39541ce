"""Normalisation layers selectable by name (``norm=layernorm|rmsnorm|dyt|scalenorm|derf|seednorm``,
configs/norm/)."""

from __future__ import annotations

import torch
from fairseq.modules import LayerNorm
from torch import nn

from lnexp.model.sphere import Unit
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


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019): g * x / max(|x|, eps), g one learnable scalar, sqrt(d) at
    init, as tnq177/transformers_without_tears builds it (layers.py ScaleNorm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(dim) ** 0.5))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.scale / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps))


class Derf(nn.Module):
    """Dynamic erf (Chen et al. 2025): gamma * erf(alpha * x + s) + beta, alpha and s one learnable
    scalar each, as zlab-princeton/Derf builds it (Dynamic_erf)."""

    def __init__(self, dim: int, alpha0: float, shift0: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.shift = nn.Parameter(torch.full((1,), float(shift0)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.erf(self.alpha * x + self.shift) + self.bias


class SeeDNorm(nn.Module):
    """SeeDNorm (Cai et al. 2025): [tanh(x . beta) * alpha + gamma] * x / sqrt(mean(x^2) + eps).

    x . beta is one scalar per token, so the token itself rescales RMSNorm's static gain gamma
    (``weight``) along alpha. The authors published no code and the paper's initial alpha and beta
    were not at hand; lnexp's reading: beta = beta0 (0: RMSNorm at init), alpha = alpha0 in every
    entry (1: beta's gradient is proportional to alpha, so with alpha = 0 neither would ever move),
    gamma = 1.
    """

    def __init__(self, dim: int, eps: float, alpha0: float, beta0: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.alpha = nn.Parameter(torch.full((dim,), float(alpha0)))
        self.beta = nn.Parameter(torch.full((dim,), float(beta0)))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = torch.tanh((x @ self.beta).unsqueeze(-1)) * self.alpha + self.weight
        return gain * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def is_fairseq_layernorm(norm: Norm, on_sphere: bool = False) -> bool:
    """The norm fairseq's layers already build (LayerNorm, eps 1e-5): kept, not rebuilt (never on
    nGPT's sphere, whose norms are x/|x|)."""
    return not on_sphere and norm.name == "layernorm" and norm.eps == 1e-5


def scheme_norm(norm: Norm, dim: int, on_sphere: bool = False) -> nn.Module:
    """One of a scheme's norms: nGPT's x/|x| where the scheme keeps its stream on the sphere
    (placement.sphere, whatever the norm group; lnexp.config refuses another group with it), else
    the norm group's."""
    return Unit() if on_sphere else make_norm(norm, dim)


def make_norm(norm: Norm | str, dim: int) -> nn.Module:
    """fairseq's LayerNorm (fused on GPU when apex is there), RMSNorm as in LLaMA, DyT, ScaleNorm,
    Derf or SeeDNorm."""
    norm = Norm(norm) if isinstance(norm, str) else norm
    build = {
        "layernorm": lambda: LayerNorm(dim, eps=norm.eps),
        "rmsnorm": lambda: nn.RMSNorm(dim, eps=norm.eps, elementwise_affine=True),
        "dyt": lambda: DyT(dim, norm.alpha0),
        "scalenorm": lambda: ScaleNorm(dim, norm.eps),
        "derf": lambda: Derf(dim, norm.alpha0, norm.shift0),
        "seednorm": lambda: SeeDNorm(dim, norm.eps, norm.alpha0, norm.beta0),
    }
    return build[norm.name]()


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The formula of Zhang & Sennrich (2019), for tests: g * x / sqrt(mean(x^2) + eps)."""
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
