"""``segc.jit`` and its stages: the trace cache (``jitted.py``), the cache key
(``signature.py``), the staged results ``Traced`` / ``Lowered`` / ``Compiled``
(``stages.py``) and the check against eager MLX (``validate.py``)."""

from .decorator import jit as jit
from .jitted import Jitted as Jitted
from .signature import CacheInfo as CacheInfo
from .signature import Signature as Signature
from .stages import Compiled as Compiled
from .stages import Lowered as Lowered
from .stages import Traced as Traced

__all__ = ["CacheInfo", "Compiled", "Jitted", "Lowered", "Signature", "Traced", "jit"]
