"""Placement-aware Transformer: norms, layers, and the fairseq model they register."""

from lnexp.model.placement import PLACEMENTS, ResidualSpec, deepnorm_constants
from lnexp.model.transformer import LNTransformerConfig, LNTransformerModel

__all__ = [
    "PLACEMENTS",
    "LNTransformerConfig",
    "LNTransformerModel",
    "ResidualSpec",
    "deepnorm_constants",
]
