"""Cut-placement research: the experiment harness (sweeps of models, workloads and
strategies, predicted and measured), machine-model calibration, reports and plots.
The cost model itself is a pass analysis: ``segc.passes.costmodel``."""

from .calibrate import calibrate as calibrate
from .experiment import DEFAULT_STRATEGIES as DEFAULT_STRATEGIES
from .experiment import Experiment as Experiment
from .experiment import run_experiment as run_experiment
from .models import load_model as load_model
from .models import make_workload as make_workload
from .report import Results as Results
from .report import read_fitted as read_fitted
from .sweep import expand as expand
from .sweep import spearman as spearman

__all__ = [
    "DEFAULT_STRATEGIES",
    "Experiment",
    "Results",
    "calibrate",
    "expand",
    "load_model",
    "make_workload",
    "read_fitted",
    "run_experiment",
    "spearman",
]
