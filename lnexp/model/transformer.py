"""The registered fairseq model ``ln_transformer`` and its architectures.

It is fairseq's ``transformer`` with the layers of ``lnexp.model.layers``. Its extra options:
``--placement-spec`` (the placement's YAML as JSON, lnexp.scheme.Placement), ``--norm-spec`` (the
norm group's), Kan et al.'s residual step (``--residual-scale``), and the names ``--placement`` and
``--norm``. A checkpoint written before the specs existed carries only ``--placement NAME``,
``--norm NAME`` and ``--embed-norm``: ``placement_of``/``norm_of`` read those through the YAML files.
"""


from dataclasses import dataclass, field

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
)
from fairseq.models.transformer.transformer_base import TransformerModelBase
from fairseq.models.transformer.transformer_config import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
)
from torch import nn
from torch.nn import functional as F

from lnexp.model import sphere
from lnexp.model.connections import connect_
from lnexp.model.layers import LNDecoderLayer, LNEncoderLayer
from lnexp.model.norms import is_fairseq_layernorm, scheme_norm
from lnexp.model.placement import ResidualSpec
from lnexp.names import NORMS, PLACEMENTS, arch_flags
from lnexp.scheme import STRUCTURES, evaluate, norm_of, placement_of


@dataclass
class LNTransformerConfig(TransformerConfig):
    placement: str = field(default="post_ln", metadata={"help": "|".join(PLACEMENTS)})
    norm: str = field(default="layernorm", metadata={"help": "|".join(NORMS)})
    residual_scale: float = field(default=1.0, metadata={"help": "dt in x + dt*F(...)"})
    embed_norm: bool = field(default=False, metadata={"help": "norm on the embeddings (old checkpoints)"})
    placement_spec: str = field(default="", metadata={"help": "the placement as JSON (lnexp.scheme)"})
    norm_spec: str = field(default="", metadata={"help": "the norm as JSON (lnexp.scheme)"})


def _next_specs(stack_module, cfg: LNTransformerConfig, stack: str) -> dict[str, ResidualSpec]:
    """The attention and FFN specs of the next layer fairseq builds (it builds them in order,
    without an index)."""
    stack_module._layers_built = getattr(stack_module, "_layers_built", 0) + 1
    return {kind: ResidualSpec.for_layer(placement_of(cfg), cfg.residual_scale, stack,
                                         stack_module._layers_built, cfg.encoder.layers,
                                         cfg.decoder.layers, kind)
            for kind in ("attention", "cross_attention", "ffn")}


def _swap_stack_norms(module, cfg: LNTransformerConfig) -> None:
    """Use the configured norm for the stack's final and embedding norms too."""
    norm, on_sphere = norm_of(cfg), placement_of(cfg).sphere
    for name in ("layer_norm", "layernorm_embedding"):
        if getattr(module, name, None) is not None and not is_fairseq_layernorm(norm, on_sphere):
            setattr(module, name, scheme_norm(norm, module.embed_tokens.embedding_dim, on_sphere))


class _Join(nn.Module):
    """The stack's output where its structure joins streams (ResiDual: x + Norm(dual)); fairseq's
    stack calls it in its final norm's place."""

    def __init__(self, norm: nn.Module, structure: str, stream: dict) -> None:
        super().__init__()
        self.norm, self.structure, self.stream = norm, structure, stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return STRUCTURES[self.structure].join(x, self.norm, self.stream)


def _share_stream(stack, layer):
    """The stack's layers share one stream dict (what a structure carries between layers); a
    structure's parts join the layer after fairseq built it (its draws come first)."""
    if "stream" not in stack.__dict__:
        stack.stream = {}
    layer.stream = stack.stream
    connect_(layer, stack._layers_built)
    return layer


def _join_streams(stack, cfg: LNTransformerConfig) -> None:
    structure = placement_of(cfg).structure
    if STRUCTURES[structure].join is not None:
        if stack.layer_norm is None:
            raise ValueError(f"structure {structure} joins its streams with the final norm: "
                             "set placement.final_norm=true")
        stack.layer_norm = _Join(stack.layer_norm, structure, stack.stream)


class LNEncoder(TransformerEncoderBase):
    def __init__(self, cfg: LNTransformerConfig, dictionary, embed_tokens) -> None:
        super().__init__(cfg, dictionary, embed_tokens)
        _swap_stack_norms(self, cfg)
        _join_streams(self, cfg)

    def build_encoder_layer(self, cfg: LNTransformerConfig) -> LNEncoderLayer:
        specs = _next_specs(self, cfg, "encoder")
        return _share_stream(self, LNEncoderLayer(cfg, specs["attention"], norm_of(cfg),
                                                  ffn_spec=specs["ffn"]))

    def forward_scriptable(self, *args, **kwargs):
        self.stream.clear()  # each forward starts its structure's streams afresh
        return super().forward_scriptable(*args, **kwargs)


class LNDecoder(TransformerDecoderBase):
    def __init__(self, cfg: LNTransformerConfig, dictionary, embed_tokens,
                 no_encoder_attn: bool = False) -> None:
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        _swap_stack_norms(self, cfg)
        _join_streams(self, cfg)

    def build_decoder_layer(self, cfg: LNTransformerConfig, no_encoder_attn: bool = False):
        specs = _next_specs(self, cfg, "decoder")
        return _share_stream(self, LNDecoderLayer(cfg, specs["attention"], norm_of(cfg),
                                                  no_encoder_attn, ffn_spec=specs["ffn"],
                                                  cross_spec=specs["cross_attention"]))

    def extract_features_scriptable(self, *args, **kwargs):
        self.stream.clear()  # each forward (each step of incremental decoding) starts afresh
        return super().extract_features_scriptable(*args, **kwargs)


@register_model("ln_transformer")
class LNTransformerModel(TransformerModel):
    """fairseq's Transformer with LayerNorm placement as a first-class option."""

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("--placement", choices=PLACEMENTS, help="the placement's name")
        parser.add_argument("--placement-spec", help="the placement's structure as JSON "
                            "(lnexp.scheme.Placement; default: configs/placement/NAME.yaml)")
        parser.add_argument("--norm", choices=NORMS, help="|".join(NORMS))
        parser.add_argument("--norm-spec", help="the norm's settings as JSON (default: "
                            "configs/norm/NAME.yaml)")
        parser.add_argument("--residual-scale", type=float, help="dt in x + dt*F(...)")
        parser.add_argument("--embed-norm", action="store_true",
                            help="norm on the embeddings (with --placement NAME alone)")

    @classmethod
    def build_model(cls, args, task):
        ln_base_architecture(args)
        # fairseq builds the final norm when normalize_before is set, and the embedding norm
        # from layernorm_embedding: map the placement onto both, so that the stock code builds them.
        placement = placement_of(args)
        args.encoder_normalize_before = args.decoder_normalize_before = placement.final_norm
        args.layernorm_embedding = placement.embed_norm
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        if args.share_all_embeddings:
            args.share_decoder_input_output_embed = True
        cfg = LNTransformerConfig.from_namespace(args)
        model = TransformerModelBase.build_model.__func__(cls, cfg, task)
        _scale_embeddings_(model, {stack: evaluate(placement.init.embed_gain, stack, 0,
                                                   cfg.encoder.layers, cfg.decoder.layers)
                                   for stack in ("encoder", "decoder")})
        if placement.fix_norm:
            _fix_norm_(model)
        model.on_sphere = placement.sphere
        if placement.sphere:
            sphere.install_model(model)
        return model

    def after_update(self, copies=None) -> None:
        """What the scheme does after each optimizer update (the trainer calls it): nGPT puts its
        matrices back on the sphere; ``copies(p)``: the fp32 master tensors holding p, if any."""
        if getattr(self, "on_sphere", False):
            sphere.renormalise_(self, copies)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return LNEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return LNDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


def _scale_embeddings_(model, gains: dict[str, float]) -> None:
    """The placement's embedding gain (T-Fixup), once per distinct embedding matrix: the encoder's
    table by the encoder's gain, the decoder's by the decoder's unless it is the encoder's (shared
    embeddings: scaled once, as T-Fixup's TransformerDecoder skips a shared table)."""
    with torch.no_grad():
        enc = model.encoder.embed_tokens.weight
        if gains["encoder"] != 1.0:
            enc.mul_(gains["encoder"])
        dec = model.decoder.embed_tokens.weight
        if dec is not enc and gains["decoder"] != 1.0:
            dec.mul_(gains["decoder"])


class UnitRows(nn.Module):
    """FixNorm (Nguyen & Salazar 2019): each word's embedding at unit length, g = fairseq's sqrt(d)
    embedding scale, as tnq177/transformers_without_tears (model.py: F.normalize of the table, used
    for the input embeddings and the output logits alike)."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return F.normalize(weight, dim=-1)


def _fix_norm_(model) -> None:
    """Every embedding table, and the output projection, read through :class:`UnitRows` (torch's
    parametrizations: a shared table is one parameter, normalised wherever it is used)."""
    from torch.nn.utils import parametrize

    seen: set[int] = set()
    for module in (model.encoder.embed_tokens, model.decoder.embed_tokens,
                   getattr(model.decoder, "output_projection", None)):
        if module is not None and id(module) not in seen:
            seen.add(id(module))
            parametrize.register_parametrization(module, "weight", UnitRows())


def ln_base_architecture(args) -> None:
    args.placement = getattr(args, "placement", None) or "post_ln"
    args.norm = getattr(args, "norm", None) or "layernorm"
    rs = getattr(args, "residual_scale", None)
    args.residual_scale = 1.0 if rs is None else rs
    args.embed_norm = bool(getattr(args, "embed_norm", False))
    args.placement_spec = getattr(args, "placement_spec", None) or ""
    args.norm_spec = getattr(args, "norm_spec", None) or ""
    base_architecture(args)


@register_model_architecture("ln_transformer", "ln_transformer")
def ln_transformer(args) -> None:
    ln_base_architecture(args)


@register_model_architecture("ln_transformer", "ln_transformer_iwslt_de_en")
def ln_transformer_iwslt_de_en(args) -> None:
    """Xiong et al. App. A.1: 6+6 layers, d=512, FFN 1024, 4 heads (shared embeddings: task)."""
    transformer_iwslt_de_en(args)
    ln_base_architecture(args)


@register_model_architecture("ln_transformer", "ln_transformer_wmt_en_de")
def ln_transformer_wmt_en_de(args) -> None:
    """Transformer base: 6+6 layers, d=512, FFN 2048, 8 heads."""
    transformer_wmt_en_de(args)
    ln_base_architecture(args)


@register_model_architecture("ln_transformer", "ln_transformer_mini")
def ln_transformer_mini(args) -> None:
    """The smallest size showing the warm-up contrast on CPU (``ARCH_SIZES``: 6+6 layers, d=128)."""
    for key, value in arch_flags("ln_transformer_mini").items():
        setattr(args, key, getattr(args, key, value))
    ln_base_architecture(args)
