"""segc's compiler passes: pure ``Graph -> Graph`` functions, one per file, by name.

Invariants every pass keeps (the pipeline checks them when checks are on):
- the result verifies (``segc.ir.verify``, fences and windows included);
- fences and windows (``segc.ir.EFFECTS``) are never dropped or reordered: a pass
  that is not a fence or window pass leaves that sequence exactly as it was, and those
  passes only add to it;
- a pass never changes what a graph computes: only cuts, order and effects; the one
  rewrite, ``concat_projections``, changes equations but keeps every output's bits
  (it checks each shape on the device first).

Passes: ``strip_cuts``, ``cut`` (a strategy or a saved plan), ``legalize``, ``fences``,
``window``, ``concat_projections``. Cut-placement strategies (``strategies.py``) produce a :class:`Plan`;
analyses (``analysis.py``) compute costs, liveness and boundary bytes. Passes import the
IR and the primitive table (``segc.lower.prim``), never the runtime: a strategy that
measures takes measured times as an argument.
"""

# importing each pass module registers its pass
from . import concat, cut, fences, legalize, strip, windows  # noqa: F401
from .fences import Schedule as Schedule
from .pipeline import Step as Step
from .pipeline import run as run
from .plan import Plan as Plan
from .registry import PASSES as PASSES
from .registry import get as get
from .registry import register as register
from .registry import run_pass as run_pass
from .strategies import make_plan as make_plan
from .strategies import resolve as resolve

__all__ = [
    "PASSES",
    "Plan",
    "Schedule",
    "Step",
    "get",
    "make_plan",
    "register",
    "resolve",
    "run",
    "run_pass",
]
