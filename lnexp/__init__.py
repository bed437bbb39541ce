"""lnexp: how LayerNorm placement changes the training of Transformer translation models."""

__version__ = "0.1.0"
