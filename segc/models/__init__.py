"""Built-in tiny model configurations (random weights; no downloads)."""

from .tiny import tiny_llama
from .zoo import ZOO, build, tiny_config

__all__ = ["ZOO", "build", "tiny_config", "tiny_llama"]
