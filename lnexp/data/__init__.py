"""Corpora: one module per corpus, shared subword and binarisation stages."""

from lnexp.data.cache import cache_root
from lnexp.data.corpus import PreparedData

__all__ = ["PreparedData", "cache_root"]
