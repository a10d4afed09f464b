"""Built-in tiny model configurations (random weights; no downloads)."""

from .tiny import SiblingProducts, sibling_products, tiny_llama
from .zoo import ZOO, build, tiny_config

__all__ = ["ZOO", "SiblingProducts", "build", "sibling_products", "tiny_config", "tiny_llama"]
