"""Built-in tiny model configurations (random weights; no downloads)."""

from .tiny import tiny_llama

__all__ = ["tiny_llama"]
