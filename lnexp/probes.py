"""Gradient and hidden-state measurements (Xiong et al. Fig. 3, Kan et al.)."""

from __future__ import annotations
