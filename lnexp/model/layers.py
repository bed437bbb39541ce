"""Encoder and decoder layers whose norms sit where a ``ResidualSpec`` says.

They subclass fairseq's layers so that parameters are created in the same order, with the same
names and the same random draws: with Post-/Pre-LN a checkpoint of fairseq's stock ``transformer``
loads unchanged and computes the same numbers. Whatever a placement adds (output norms, ReZero's
gates, QK-norms) is created after fairseq's draws and draws nothing random itself.
"""

from __future__ import annotations

from functools import partial

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from lnexp.model import sphere
from lnexp.model.norms import is_fairseq_layernorm, make_norm, scheme_norm
from lnexp.model.placement import ResidualGain, ResidualSpec, init_layer_, residual_step
from lnexp.scheme import MATRICES, STRUCTURES, Norm, Step


def _install_norms(layer: nn.Module, names: tuple[str, ...], norm: Norm) -> None:
    """For each sub-layer: its main norm (input or sum), its output norm and its gate, as its spec
    says; fairseq's own LayerNorm module is kept where it is the configured norm."""
    dim = layer.embed_dim
    scheme = layer.spec.scheme
    build = partial(scheme_norm, norm, dim, scheme.sphere)
    # ReZero's code (majumderb/rezero rztx.py RZTXEncoderLayer/RZTXDecoderLayer): one resweight per
    # layer, read by each of its sub-layers
    layer.layer_gate = nn.Parameter(torch.zeros(1)) if scheme.branch_gate and scheme.shared_gate else None
    for name in names:
        spec = layer.spec_of(name.replace("_layer_norm", ""))
        if not spec.has_norm:
            setattr(layer, name, None)
        elif not is_fairseq_layernorm(norm, scheme.sphere):
            setattr(layer, name, build())
        setattr(layer, name.replace("layer_norm", "out_norm"), build() if spec.output_norm else None)
        setattr(layer, name.replace("layer_norm", "gate"),
                nn.Parameter(torch.zeros(1)) if scheme.branch_gate and not scheme.shared_gate else None)
        gain = ResidualGain(dim) if scheme.residual_gain else \
            sphere.SphereStep(dim, scheme.sphere_alpha0) if scheme.sphere else None
        setattr(layer, name.replace("layer_norm", "gain"), gain)
    ffn = layer.spec_of("final")
    layer.final_inner_norm = make_norm(norm, layer.fc1.out_features) if ffn.inner_norm else None


class _HeadNorm(nn.Module):
    """A norm over each head's slice of a projection's output (QK-LayerNorm, HybridNorm's QKV)."""

    def __init__(self, norm: Norm, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm = make_norm(norm, head_dim)

    def forward(self, y: Tensor) -> Tensor:
        shape = y.shape
        return self.norm(y.reshape(*shape[:-1], self.heads, self.head_dim)).reshape(shape)

    def hook(self, module: nn.Module, inputs, output: Tensor) -> Tensor:
        """A forward hook on the projection (a bound method, so a deep copy hooks its own copy)."""
        return self(output)


class _HeadL2(nn.Module):
    """Henry et al. 2020's QKNorm of one projection: each head's slice divided by its L2 norm
    (CyndxAI/QKNorm layers.py MultiheadAttention.forward: F.normalize, eps 1e-12). On the queries
    it also carries the learned scale g (ScaleUp) that replaces 1/sqrt(d_h): fairseq multiplies q
    by 1/sqrt(d_h) after this hook, so the queries leave it as g*sqrt(d_h)*q/|q|."""

    def __init__(self, heads: int, head_dim: int, scale0: float | None) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.scale = nn.Parameter(torch.tensor([float(scale0)])) if scale0 is not None else None

    def forward(self, y: Tensor) -> Tensor:
        shape = y.shape
        y = nn.functional.normalize(y.reshape(*shape[:-1], self.heads, self.head_dim), p=2.0,
                                    dim=-1, eps=1e-12).reshape(shape)
        return y if self.scale is None else y * (self.scale * self.head_dim ** 0.5)

    def hook(self, module: nn.Module, inputs, output: Tensor) -> Tensor:
        return self(output)


class _BeforeOutProj(nn.Module):
    """What a placement does to the heads' concatenated output before out_proj: Sub-LN's inner
    norm, then NormFormer's per-head scale (the paper's place; fairseq's --scale-heads sits after)."""

    def __init__(self, norm: Norm | None, heads: int, head_dim: int, head_scale: bool) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm = make_norm(norm, heads * head_dim) if norm is not None else None
        self.head_scale = nn.Parameter(torch.ones(heads)) if head_scale else None

    def forward(self, y: Tensor) -> Tensor:
        if self.norm is not None:
            y = self.norm(y)
        if self.head_scale is not None:
            shape = y.shape
            y = (y.reshape(*shape[:-1], self.heads, self.head_dim) * self.head_scale[:, None]).reshape(shape)
        return y

    def hook(self, module: nn.Module, inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return (self(inputs[0]), *inputs[1:])


def _install_attention_parts(attn: nn.Module, spec: ResidualSpec, norm: Norm) -> None:
    """QK(V)-norm on each head's queries, keys (and values) as they leave their projections (before
    fairseq's 1/sqrt(d_head) scaling), Sub-LN's inner norm and NormFormer's head scale before
    out_proj. torch's fused attention path reads the projection weights directly, so it is
    switched off for a module that has any of these."""
    heads, head_dim = attn.num_heads, attn.head_dim
    hooked = False
    scheme = spec.scheme
    if scheme.qk_norm and scheme.qk_norm_form == "sphere":
        sphere.install_attention(attn)
    for proj, on in (("q", scheme.qk_norm), ("k", scheme.qk_norm), ("v", scheme.v_norm)):
        if on and not (proj != "v" and scheme.qk_norm_form == "sphere"):
            if proj != "v" and scheme.qk_norm_form == "l2":
                part: nn.Module = _HeadL2(heads, head_dim, scheme.qk_scale0 if proj == "q" else None)
            else:
                part = _HeadNorm(norm, heads, head_dim)
            setattr(attn, f"{proj}_norm", part)
            getattr(attn, f"{proj}_proj").register_forward_hook(part.hook)
            hooked = True
    if spec.inner_norm or spec.head_scale:
        attn.before_out_proj = _BeforeOutProj(norm if spec.inner_norm else None, heads, head_dim,
                                              spec.head_scale)
        attn.out_proj.register_forward_pre_hook(attn.before_out_proj.hook)
        hooked = True
    if hooked:
        attn.skip_embed_dim_check = True  # fairseq's switch for its unfused path


def _set_up(layer: nn.Module, names: tuple[str, ...], spec: ResidualSpec,
            ffn_spec: ResidualSpec | None, norm: Norm, attns: dict[str, nn.Module],
            cross_spec: ResidualSpec | None = None) -> None:
    layer.spec = spec
    layer.stream = {}  # what the structure carries between layers; the stack shares its own dict
    layer.connections = None  # a structure's parts per sub-layer (lnexp/model/connections.py connect_)
    layer.ffn_spec = ffn_spec if ffn_spec != spec else None
    layer.cross_spec = cross_spec if cross_spec != spec else None
    _install_norms(layer, names, norm)
    # the FFN's matrices first, then each attention's (DeepNet's redraws keep their order)
    init_layer_(layer.spec_of("final"), {"fc1": layer.fc1, "fc2": layer.fc2})
    for name, attn in attns.items():
        init_layer_(layer.spec_of(name), {m: getattr(attn, m) for m in MATRICES if m not in ("fc1", "fc2")})
    for name, attn in attns.items():
        _install_attention_parts(attn, layer.spec_of(name), norm)
    if spec.scheme.sphere:
        sphere.install_ffn(layer)


class _Steps:
    """The FFN sub-layer F(x) = W2 act(W1 x) (fairseq's layers inline it in forward), and one
    residual step per sub-layer, chained by the placement's structure."""

    def _ffn(self, x: Tensor) -> Tensor:
        h = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        if self.final_inner_norm is not None:  # Sub-LN, NormFormer: a norm before fc2
            h = self.final_inner_norm(h)
        return self.fc2(h)

    def spec_of(self, name: str) -> ResidualSpec:
        """The spec of sub-layer ``name`` (self_attn: attention; encoder_attn: cross_attention;
        final: the FFN)."""
        if name == "final":
            return self.ffn_spec or self.spec
        return (getattr(self, "cross_spec", None) or self.spec) if name == "encoder_attn" else self.spec

    def sublayer_names(self) -> list[str]:
        """The sub-layers this layer has, in the order they run."""
        cross = getattr(self, "encoder_attn", None) is not None
        return ["self_attn", *(["encoder_attn"] if cross else []), "final"]

    def _chain(self, steps: list[tuple[str, Step]], x: Tensor) -> Tensor:
        """The structure's chain of the named steps; a structure with parts gets each step's own
        (the decoder's cross-attention is skipped without encoder_out)."""
        parts = None if self.connections is None else [self.connections[n] for n, _ in steps]
        return STRUCTURES[self.spec.scheme.structure].layer([s for _, s in steps], x, self.stream, parts)

    def _step(self, name: str, sublayer, x: Tensor, skip: Tensor | None) -> tuple[Tensor, Tensor]:
        gate = getattr(self, f"{name}_gate")
        return residual_step(self.spec_of(name), x, sublayer, getattr(self, f"{name}_layer_norm"),
                             getattr(self, f"{name}_out_norm"), self.dropout_module,
                             self.layer_gate if gate is None else gate, skip,
                             getattr(self, f"{name}_gain"))


class LNEncoderLayer(_Steps, TransformerEncoderLayerBase):
    """x -> residual(self-attention) -> residual(FFN), norms placed by ``spec``."""

    NORMS = ("self_attn_layer_norm", "final_layer_norm")

    def __init__(self, cfg, spec: ResidualSpec, norm: Norm | str = "layernorm",
                 ffn_spec: ResidualSpec | None = None) -> None:
        super().__init__(cfg)
        norm = Norm(norm) if isinstance(norm, str) else norm
        _set_up(self, self.NORMS, spec, ffn_spec, norm, {"self_attn": self.self_attn})

    def forward(self, x: Tensor, encoder_padding_mask: Tensor | None, attn_mask: Tensor | None = None):
        if attn_mask is not None:
            fill = -1e8 if x.dtype == torch.float32 else -1e4
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), fill)

        def attend(h: Tensor) -> Tensor:
            out, _ = self.self_attn(
                query=h, key=h, value=h, key_padding_mask=encoder_padding_mask,
                need_weights=False, attn_mask=attn_mask,
            )
            return out

        return self._chain([(n, partial(self._step, n, f)) for n, f in
                            (("self_attn", attend), ("final", self._ffn))], x)


class LNDecoderLayer(_Steps, TransformerDecoderLayerBase):
    """Self-attention, cross-attention and FFN, each a residual step placed by ``spec``."""

    NORMS = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")

    def __init__(self, cfg, spec: ResidualSpec, norm: Norm | str = "layernorm",
                 no_encoder_attn: bool = False, ffn_spec: ResidualSpec | None = None,
                 cross_spec: ResidualSpec | None = None) -> None:
        super().__init__(cfg, no_encoder_attn)
        if self.cross_self_attention or self.c_attn is not None or self.attn_ln is not None \
                or self.ffn_layernorm is not None or self.w_resid is not None:
            raise ValueError("ln_transformer does not support cross_self_attention/scale_* options")
        norm = Norm(norm) if isinstance(norm, str) else norm
        names = self.NORMS if self.encoder_attn is not None else self.NORMS[::2]
        attns = {n: a for n, a in (("self_attn", self.self_attn), ("encoder_attn", self.encoder_attn))
                 if a is not None}
        _set_up(self, names, spec, ffn_spec, norm, attns, cross_spec)
        if self.encoder_attn is None:
            self.encoder_attn_out_norm = self.encoder_attn_gate = None

    def forward(
        self,
        x: Tensor,
        encoder_out: Tensor | None = None,
        encoder_padding_mask: Tensor | None = None,
        incremental_state=None,
        prev_self_attn_state=None,
        prev_attn_state=None,
        self_attn_mask: Tensor | None = None,
        self_attn_padding_mask: Tensor | None = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        if need_head_weights:
            need_attn = True
        if prev_self_attn_state is not None:
            self.self_attn._set_input_buffer(incremental_state, _as_state(prev_self_attn_state))

        def self_attend(h: Tensor) -> Tensor:
            out, _ = self.self_attn(
                query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
            )
            return out

        steps = [("self_attn", partial(self._step, "self_attn", self_attend))]
        weights: list[Tensor | None] = [None]
        if self.encoder_attn is not None and encoder_out is not None:
            if prev_attn_state is not None:
                self.encoder_attn._set_input_buffer(incremental_state, _as_state(prev_attn_state))

            def cross_attend(h: Tensor) -> Tensor:
                out, weights[0] = self.encoder_attn(
                    query=h, key=encoder_out, value=encoder_out,
                    key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                    static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights,
                )
                return out

            steps.append(("encoder_attn", partial(self._step, "encoder_attn", cross_attend)))
        steps.append(("final", partial(self._step, "final", self._ffn)))
        x = self._chain(steps, x)
        return x, weights[0], None


def _as_state(prev: list[Tensor]) -> dict[str, Tensor | None]:
    state: dict[str, Tensor | None] = {"prev_key": prev[0], "prev_value": prev[1]}
    if len(prev) >= 3:
        state["prev_key_padding_mask"] = prev[2]
    return state
