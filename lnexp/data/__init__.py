"""Corpora: one module per corpus, shared subword and binarisation stages."""

from lnexp.data.corpus import PreparedData, cache_root

__all__ = ["PreparedData", "cache_root"]
