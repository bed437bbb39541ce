"""nGPT, the normalised Transformer (Loshchilov, Hsieh, Sun & Ginsburg 2024, arXiv 2410.01131), as
NVIDIA/ngpt builds it (model.py ``Block``, ``GPT``; train.py ``normalize_matrices``), for an
encoder-decoder (``placement.sphere``, configs/placement/ngpt.yaml).

Every hidden state is a unit vector. Each sub-layer F (self-attention, cross-attention, FFN) moves
it along the sphere by a learned step a, one per dimension:

    h <- Norm(h + |a| * (Norm(F(h)) - h)),   Norm(x) = x / |x|

``residual_step`` does this with the scheme's switches (output_norm and sum_norm are ``Unit``) and
``SphereStep`` as its sum. Attention normalises each head's queries and keys and scales them by a
learned s_qk (softmax scale sqrt(d_h)), the FFN scales fc1's output by s_u * sqrt(d), the logits
are cosines times a learned s_z per word, and every matrix's vectors along the model dimension are
renormalised after each update (``renormalise_``). The matrices have no biases (fairseq's are
zeroed and frozen). The learned vectors are stored as nGPT stores them (``Rescaled``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F

# nGPT's initial values (model.py): the steps a 0.05, s_qk 1, s_u 1 (times sqrt(d)), s_z 1
QK_SCALE0 = 1.0
FFN_SCALE0 = 1.0
LOGIT_SCALE0 = 1.0
# the dimension along which each matrix's vectors live on the sphere (train.py normalize_matrices):
# the projections that read the stream have unit rows, those that write into it unit columns
READ = ("q_proj", "k_proj", "v_proj", "fc1")
WRITE = ("out_proj", "fc2")


def unit(x: Tensor, dim: int = -1) -> Tensor:
    """x / |x| (a zero vector, fairseq's padding embedding, stays zero: the smallest positive
    number of x's type bounds |x| from below, so that fp16 does not round the bound to 0)."""
    return F.normalize(x, p=2.0, dim=dim, eps=torch.finfo(x.dtype).tiny)


class Unit(nn.Module):
    """nGPT's norm, x / |x|: no gain, no bias (the scales live elsewhere)."""

    def forward(self, x: Tensor) -> Tensor:
        return unit(x)


class Rescaled(nn.Module):
    """A learned vector as nGPT stores it: the parameter starts at ``scale`` and is read times
    init/scale, so that Adam's steps, of about the learning rate, move it relative to ``scale``
    rather than to its value (model.py: alpha, sqk, suv, sz, each with its init_value and
    init_scaling)."""

    def __init__(self, size: int, init: float, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), float(scale)))
        self.factor = init / scale

    def forward(self) -> Tensor:
        return self.weight * self.factor


class SphereStep(nn.Module):
    """The sum of one sub-layer, h + |a| * (y - h) with y = Norm(F(h)) (dropout applied), h taken at
    unit length as nGPT does; the stream's Norm follows (the scheme's sum_norm)."""

    def __init__(self, dim: int, alpha0: float) -> None:
        super().__init__()
        self.alpha = Rescaled(dim, alpha0, 1 / math.sqrt(dim))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        h = unit(x)
        return h + self.alpha().abs() * (y - h)


class SphereQK(nn.Module):
    """One attention's queries and keys: each head's slice at unit length times s_qk, one learned
    value per dimension shared by q and k, so that a score is s_qk q^ . s_qk k^ * sqrt(d_h). fairseq
    multiplies q by 1/sqrt(d_h) after the query hook, which therefore returns d_h * s_qk * q^."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.scale = Rescaled(heads * head_dim, QK_SCALE0, 1 / math.sqrt(heads * head_dim))

    def forward(self, y: Tensor) -> Tensor:
        shape = y.shape
        heads = unit(y.reshape(*shape[:-1], self.heads, self.head_dim)).reshape(shape)
        return heads * self.scale()

    def query_hook(self, module: nn.Module, inputs, output: Tensor) -> Tensor:
        return self(output) * self.head_dim

    def key_hook(self, module: nn.Module, inputs, output: Tensor) -> Tensor:
        return self(output)


class OutputScale(nn.Module):
    """A learned scale per output of a projection, read on its output through a forward hook: the
    FFN's s_u * sqrt(d) on fc1 and the logits' s_z."""

    def __init__(self, size: int, init: float, scale: float, factor: float = 1.0) -> None:
        super().__init__()
        self.scale = Rescaled(size, init, scale)
        self.factor = factor

    def hook(self, module: nn.Module, inputs, output: Tensor) -> Tensor:
        return output * (self.scale() * self.factor)


def install_attention(attn: nn.Module) -> None:
    """nGPT's queries and keys on one fairseq MultiheadAttention (its unfused path: the fused one
    reads the projections' weights directly)."""
    attn.qk_sphere = SphereQK(attn.num_heads, attn.head_dim)
    attn.q_proj.register_forward_hook(attn.qk_sphere.query_hook)
    attn.k_proj.register_forward_hook(attn.qk_sphere.key_hook)
    attn.skip_embed_dim_check = True


def install_ffn(layer: nn.Module) -> None:
    """s_u on fc1's output, s_u * sqrt(d) at init as nGPT's suv (its SwiGLU's u and v; here
    fairseq's ReLU FFN has one fc1)."""
    dim = layer.fc1.in_features
    layer.ffn_scale = OutputScale(layer.fc1.out_features, FFN_SCALE0, 1.0, math.sqrt(dim))
    layer.fc1.register_forward_hook(layer.ffn_scale.hook)


def install_model(model: nn.Module) -> None:
    """The model-wide parts, after every layer is built: s_z on the logits, the matrices' biases
    zeroed and frozen (nGPT's have none), every matrix and embedding table on the sphere."""
    decoder = model.decoder
    proj = decoder.output_projection
    decoder.logit_scale = OutputScale(proj.out_features, LOGIT_SCALE0, 1 / math.sqrt(proj.in_features))
    proj.register_forward_hook(decoder.logit_scale.hook)
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in READ + WRITE and module.bias is not None:
            with torch.no_grad():
                module.bias.zero_()
            module.bias.requires_grad_(False)
    renormalise_(model)


def sphere_weights(model: nn.Module) -> Iterator[tuple[nn.Parameter, int]]:
    """Each matrix nGPT keeps on the sphere and the dimension its unit vectors run along, once per
    parameter (a shared embedding table is one)."""
    seen: set[int] = set()
    tables = [model.encoder.embed_tokens.weight, model.decoder.embed_tokens.weight,
              model.decoder.output_projection.weight]
    found = [(p, 1) for p in tables]
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in READ + WRITE:
            found.append((module.weight, 1 if leaf in READ else 0))
    for p, dim in found:
        if id(p) not in seen:
            seen.add(id(p))
            yield p, dim


def renormalise_(model: nn.Module, copies: Callable[[nn.Parameter], list[Tensor]] | None = None) -> None:
    """Every sphere matrix back to unit vectors (nGPT's step after each optimizer update);
    ``copies(p)``: further tensors holding p that the optimizer steps (fp32 master copies)."""
    with torch.no_grad():
        for p, dim in sphere_weights(model):
            for t in [p.data, *(copies(p) if copies is not None else [])]:
                t.copy_(unit(t, dim))
