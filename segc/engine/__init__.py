"""Engines built on segc: generation loops over mlx-lm models."""

from .banded import banded_prefill as banded_prefill
from .generate import FAST_OPTIONS as FAST_OPTIONS
from .generate import GenerationStats as GenerationStats
from .generate import generate_tokens as generate_tokens
from .generate import load_local_model as load_local_model

__all__ = ["FAST_OPTIONS", "GenerationStats", "banded_prefill", "generate_tokens", "load_local_model"]
