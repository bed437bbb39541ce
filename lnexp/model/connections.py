"""Hyper-connections' learned connections: one module per sub-layer, what the ``hyper_connections``
and ``mhc`` structures (lnexp/scheme.py ``streams_layer``) call to mix n residual streams.

For the streams H (n x d per token; here a tensor ... x n x d) and one sub-layer, with A = [A_m | A_r]
(n x (1+n)) and B (n):

    h = sum_k A_m[k] H_k                         width connection: the branch input
    H <- A_r^T H + B (x) y,  y = F(Norm(h))      depth connection (y: the Pre-LN step's branch)

Hyper-connections (Zhu et al. 2024, arXiv 2409.19606, App. J Alg. 2): static A, B, and in the
dynamic form (DHC) A + s_a tanh(Norm(H) W_a), B + s_b tanh(Norm(H) W_b), per stream and token.
mHC (Xie et al. 2025, arXiv 2512.24880): the same pre-activations without tanh, then A_m through a
sigmoid, A_r onto the doubly-stochastic matrices by 20 Sinkhorn-Knopp iterations, B through
2 sigmoid. Both are written after lucidrains/hyper-connections 0.4.11 (hyper_connections.py,
manifold_constrained_hyper_connections.py; tests/test_hyper_connections.py checks them against it):
its per-stream RMSNorm x/|x| sqrt(d) (1 + g) for Norm (the HC paper has LayerNorm, mHC's paper an
RMSNorm of all n streams flattened), its initial values (A_m: the one-hot of stream (index mod n),
A_r = I, B = 1, W = 0, scales 0.01), and its Sinkhorn (columns, then rows, from exp(A_r - max)).
Nothing here draws a random number, so fairseq's draws stay as they are.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lnexp.scheme import STRUCTURES

SINKHORN_ITERS = 20  # mHC's t_max (Xie et al. 2025, sec. 4.1; the package's default)


def sinkhorn(logits: Tensor, iters: int = SINKHORN_ITERS) -> Tensor:
    """exp(logits) made doubly stochastic over its last two dims: each column, then each row, to
    sum 1, ``iters`` times (the max over each column is taken out first: the same matrices, no
    overflow). The entries are positive, so a division by the sum is the package's L1 normalise,
    in two ops where F.normalize takes four (3.2x faster, fwd+bwd, on a mini batch)."""
    a = (logits - logits.amax(dim=-2, keepdim=True).detach()).exp()
    for _ in range(iters):
        a = a / a.sum(dim=-2, keepdim=True)
        a = a / a.sum(dim=-1, keepdim=True)
    return a


class HyperConnection(nn.Module):
    """One sub-layer's width and depth connections over ``streams`` residual streams (module
    docstring). ``index``: the sub-layer's 0-based place in its stack, whose stream (index mod n)
    feeds the branch at initialisation. Its weights are computed in float32 at least (the package's
    choice: fp16 weights would round A and B)."""

    def __init__(self, dim: int, streams: int, index: int, dynamic: bool, manifold: bool) -> None:
        super().__init__()
        self.streams, self.dynamic, self.manifold = streams, dynamic, manifold
        width = torch.zeros(streams, 1)
        width[index % streams] = 1.0
        self.static_alpha = nn.Parameter(torch.cat((width, torch.eye(streams)), dim=1))  # [A_m | A_r]
        self.static_beta = nn.Parameter(torch.ones(streams))  # B
        if dynamic:
            self.norm_gain = nn.Parameter(torch.zeros(dim))  # g in Norm(H) = H/|H| sqrt(d) (1 + g)
            self.dynamic_alpha = nn.Parameter(torch.zeros(dim, 1 + streams))  # [W_m | W_r]
            self.dynamic_beta = nn.Parameter(torch.zeros(dim))  # W_b
            # s_a: HC one scalar; mHC one for A_m and one for A_r
            self.alpha_scale = nn.Parameter(torch.full((2,) if manifold else (), 1e-2))
            self.beta_scale = nn.Parameter(torch.full((), 1e-2))  # s_b

    def expand(self, x: Tensor) -> Tensor:
        """The first layer's input as n equal streams (... x n x d)."""
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.streams, x.shape[-1])

    def reduce(self, streams: Tensor) -> Tensor:
        """What the layer hands on: the streams' sum."""
        return streams.sum(dim=-2)

    def weights(self, streams: Tensor) -> tuple[Tensor, Tensor]:
        """A (... x n x (1+n)) and B (... x n) for these streams, in float32 at least."""
        work = torch.promote_types(streams.dtype, torch.float32)
        alpha, beta = self.static_alpha.to(work), self.static_beta.to(work)
        if self.dynamic:
            h = streams.to(work)
            # N(H) W = (H W') r, W' = (1 + g) W, r = sqrt(d)/|H| per stream and token: the package's
            # F.normalize(H) sqrt(d) (1 + g) without forming the normalised streams (fewer passes)
            r = math.sqrt(h.shape[-1]) / torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp_min(1e-12)
            gain = 1 + self.norm_gain.to(work)
            wa = (h @ (gain.unsqueeze(-1) * self.dynamic_alpha.to(work))) * r
            wb = (h @ (gain * self.dynamic_beta.to(work))) * r.squeeze(-1)
            if not self.manifold:
                wa, wb = wa.tanh(), wb.tanh()
            scale = self.alpha_scale.to(work)
            if self.manifold:
                scale = torch.cat((scale[:1], scale[1:].expand(self.streams)))
            alpha = alpha + wa * scale
            beta = beta + wb * self.beta_scale.to(work)
        if self.manifold:
            alpha = torch.cat((alpha[..., :1].sigmoid(), sinkhorn(alpha[..., 1:])), dim=-1)
            beta = 2 * beta.sigmoid()
        return alpha, beta

    def width(self, streams: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The branch input h = sum_k A_m[k] H_k, and what the depth connection needs: A_r^T H and B."""
        alpha, beta = self.weights(streams)
        mixed = (alpha.transpose(-1, -2) @ streams.to(alpha.dtype)).to(streams.dtype)  # ... x (1+n) x d
        return mixed[..., 0, :], (mixed[..., 1:, :], beta)

    def depth(self, kept: tuple[Tensor, Tensor], y: Tensor) -> Tensor:
        """H <- A_r^T H + B (x) y."""
        residual, beta = kept
        return residual + (beta.unsqueeze(-1) * y.unsqueeze(-2).to(beta.dtype)).to(residual.dtype)


PARTS = {
    "hyper_connections": lambda dim, streams, index, dynamic: HyperConnection(dim, streams, index,
                                                                               dynamic, manifold=False),
    "mhc": lambda dim, streams, index, dynamic: HyperConnection(dim, streams, index, dynamic,
                                                                 manifold=True),
}


def connect_(layer: nn.Module, layer_index: int) -> None:
    """Give a built layer (1-based ``layer_index`` in its stack) its structure's parts, one per
    sub-layer, as ``layer.connections`` (created after fairseq's parameters, so that those keep
    their order and draws; parameters, so that checkpoints carry them and the optimizer sees them)."""
    scheme = layer.spec.scheme
    kind = STRUCTURES[scheme.structure].parts
    if kind is None:
        return
    names = layer.sublayer_names()
    first = (layer_index - 1) * len(names)
    layer.connections = nn.ModuleDict({
        name: PARTS[kind](layer.embed_dim, scheme.streams, first + i, scheme.dynamic)
        for i, name in enumerate(names)})
