"""Encoder and decoder layers whose LayerNorms sit where a ``ResidualSpec`` says.

They subclass fairseq's layers so that parameters are created in the same order, with the same
names and the same random draws: with Post-/Pre-LN a checkpoint of fairseq's stock ``transformer``
loads unchanged and computes the same numbers.
"""

from __future__ import annotations

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from lnexp.model.norms import make_norm
from lnexp.model.placement import ResidualSpec, deepnorm_init_, residual_step


def _install_norms(layer: nn.Module, names: tuple[str, ...], spec: ResidualSpec, kind: str) -> None:
    """Replace fairseq's LayerNorms by the configured norm and add Peri-LN's output norms."""
    dim = layer.embed_dim
    for name in names:
        if kind != "layernorm":  # keep fairseq's own LayerNorm module where it already is one
            setattr(layer, name, make_norm(kind, dim))
        out_name = name.replace("layer_norm", "out_norm")
        setattr(layer, out_name, make_norm(kind, dim) if spec.output_norm else None)


class _FeedForward:
    """The FFN sub-layer F(x) = W2 act(W1 x) of both stacks (fairseq's layers inline it in forward)."""

    def _ffn(self, x: Tensor) -> Tensor:
        return self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))


class LNEncoderLayer(_FeedForward, TransformerEncoderLayerBase):
    """x -> residual(self-attention) -> residual(FFN), norms placed by ``spec``."""

    NORMS = ("self_attn_layer_norm", "final_layer_norm")

    def __init__(self, cfg, spec: ResidualSpec, norm: str = "layernorm") -> None:
        super().__init__(cfg)
        self.spec = spec
        _install_norms(self, self.NORMS, spec, norm)
        if spec.placement == "deepnorm":
            deepnorm_init_(spec.beta, self.fc1, self.fc2, self.self_attn)

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

        x = residual_step(self.spec, x, attend, self.self_attn_layer_norm,
                          self.self_attn_out_norm, self.dropout_module)
        return residual_step(self.spec, x, self._ffn, self.final_layer_norm,
                             self.final_out_norm, self.dropout_module)


class LNDecoderLayer(_FeedForward, TransformerDecoderLayerBase):
    """Self-attention, cross-attention and FFN, each a residual step placed by ``spec``."""

    NORMS = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")

    def __init__(self, cfg, spec: ResidualSpec, norm: str = "layernorm",
                 no_encoder_attn: bool = False) -> None:
        super().__init__(cfg, no_encoder_attn)
        if self.cross_self_attention or self.c_attn is not None or self.attn_ln is not None \
                or self.ffn_layernorm is not None or self.w_resid is not None:
            raise ValueError("ln_transformer does not support cross_self_attention/scale_* options")
        self.spec = spec
        names = self.NORMS if self.encoder_attn is not None else self.NORMS[::2]
        _install_norms(self, names, spec, norm)
        if self.encoder_attn is None:
            self.encoder_attn_out_norm = None
        if spec.placement == "deepnorm":
            attns = [a for a in (self.self_attn, self.encoder_attn) if a is not None]
            deepnorm_init_(spec.beta, self.fc1, self.fc2, *attns)

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

        x = residual_step(self.spec, x, self_attend, self.self_attn_layer_norm,
                          self.self_attn_out_norm, self.dropout_module)
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            if prev_attn_state is not None:
                self.encoder_attn._set_input_buffer(incremental_state, _as_state(prev_attn_state))
            weights: list[Tensor | None] = [None]

            def cross_attend(h: Tensor) -> Tensor:
                out, weights[0] = self.encoder_attn(
                    query=h, key=encoder_out, value=encoder_out,
                    key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                    static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights,
                )
                return out

            x = residual_step(self.spec, x, cross_attend, self.encoder_attn_layer_norm,
                              self.encoder_attn_out_norm, self.dropout_module)
            attn = weights[0]
        x = residual_step(self.spec, x, self._ffn, self.final_layer_norm,
                          self.final_out_norm, self.dropout_module)
        return x, attn, None


def _as_state(prev: list[Tensor]) -> dict[str, Tensor | None]:
    state: dict[str, Tensor | None] = {"prev_key": prev[0], "prev_value": prev[1]}
    if len(prev) >= 3:
        state["prev_key_padding_mask"] = prev[2]
    return state
