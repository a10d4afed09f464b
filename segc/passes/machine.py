"""A machine model: the seconds per unit of work on one machine that the cost model
(``costmodel.py``) and the memory prediction (``memory.py``) read, its JSON form, and
the built-in ``CPU`` and ``H200`` presets (``costmodel.py``'s docstring says what
each figure means)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..errors import ScheduleError
from .analysis import Machine
from .commits import DEVICES


@dataclass(frozen=True, slots=True)
class MachineModel:
    """Seconds per unit of work on one machine (see the module docstring)."""

    name: str = "cpu"
    flops_per_s: float = 50e9
    bytes_per_s: float = 10e9
    launch_s: float = 2e-6  # device: per kernel
    dispatch_s: float = 8e-6  # host: per segment (compiled call + async_eval)
    host_op_s: float = 0.3e-6  # host: per kernel of a segment, before the device may start it
    source: str = "default"  # "default", or what calibrated it
    encode_s: float = 0.0  # host: per kernel, while the device already runs the segment's first ones
    commit_s: float = 0.0  # host: per commit (commits.py); the device starts the committed work after it
    device: str = "cpu"  # "cpu" or "gpu" (the commit policy "auto" meant per device until 2026-12-02)
    queue_kernels: float = 0.0  # host: the kernels it may have outstanding (MLX throttles it); 0: unbounded
    segment_sq_s: float = 0.0  # per kernel squared of a segment: what a large segment costs beyond its kernels
    fused_products: bool = False  # one-row products with their neighbours as one kernel (segc on CUDA)
    elementwise_host: float = (
        1.0  # host: an elementwise kernel's share of host_op_s (the rest: products, custom kernels)
    )
    buffer_kernels: int = (
        0  # memory: a GPU's command buffer holds its kernels' inputs until it ends (memory.py); 0: none
    )
    repeat_s: float = 0.0  # host: saved on a segment that repeats an earlier one's equations in the call
    repeat_op_s: float = 0.0  # host: saved per equation of such a segment (what calibration fits)
    # device: per command buffer (a committed segment, or each part of one): starting and
    # draining it, beyond its kernels' launches (a fitted figure; 0 in the built-in models)
    segment_device_s: float = 0.0

    def roofline(self) -> Machine:
        return Machine(self.name, self.flops_per_s, self.bytes_per_s)

    def to_json(self) -> str:
        return json.dumps({"segc_machine": 1, **asdict(self)}, indent=1) + "\n"

    @staticmethod
    def from_json(text: str) -> MachineModel:
        try:
            d = json.loads(text)
            if d.get("segc_machine") != 1:
                raise ScheduleError("not a segc machine model (no 'segc_machine': 1)")
            known = {f.name for f in fields(MachineModel)}
            d.pop("queue_s", None)  # a former figure (the queue as a duration): superseded by queue_kernels
            unknown = sorted(set(d) - known - {"segc_machine"})
            if unknown:
                raise ScheduleError(f"machine model: unknown fields {unknown}")
            m = MachineModel(**{k: v for k, v in d.items() if k in known})
        except (ValueError, TypeError, AttributeError) as exc:
            raise ScheduleError(f"cannot read machine model: {exc}") from None
        if m.device not in DEVICES:
            raise ScheduleError(f"machine model: device must be one of {DEVICES}, got {m.device!r}")
        for f in fields(m):
            v = getattr(m, f.name)
            if f.name == "fused_products" and not isinstance(v, bool):
                raise ScheduleError(f"machine model: fused_products must be true or false, got {v!r}")
            zero = (
                "encode_s",
                "commit_s",
                "queue_kernels",
                "segment_sq_s",
                "buffer_kernels",
                "repeat_s",
                "repeat_op_s",
                "segment_device_s",
            )
            low = 0 if f.name in zero else 1e-300
            numeric = f.name not in ("name", "source", "device", "fused_products")
            if f.name == "buffer_kernels" and (isinstance(v, bool) or not isinstance(v, int)):
                raise ScheduleError(f"machine model: buffer_kernels must be a whole number, got {v!r}")
            if numeric and not (isinstance(v, int | float) and v >= low):
                raise ScheduleError(f"machine model: {f.name} must be a positive number, got {v!r}")
        return m

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @staticmethod
    def load(path: str | Path) -> MachineModel:
        try:
            return MachineModel.from_json(Path(path).read_text())
        except OSError as exc:
            raise ScheduleError(f"cannot read machine model {path}: {exc}") from None


# MLX's CPU build: ~1 us of host work per kernel before the device may start a segment, and
# the host throttled to ~50 outstanding kernels (module docstring, docs/experiments.md)
CPU = MachineModel(host_op_s=1e-6, queue_kernels=50)
# MLX's CUDA build: 25 us a committed segment, 17 us a kernel, an elementwise kernel 0.15
# of one. The shape is measured apart from any plan (``segc calibrate``'s ``host_kinds``
# on fresh H200s, 2026-12-03: 19-25 us a segment, 17-31 us a one-row product of MLX's,
# 2.3-2.8 us an elementwise kernel); the per-kernel figure is what segc's decode steps
# cost all in (one-segment plans: 15-22 us a kernel on five machines). Five experiment
# runs rank better with it than with the figures before (2 us a segment, 10 us any
# kernel: prefill's plans ranked at 0.3-0.6): docs/experiments.md, "The tenth and
# eleventh runs". A machine's host differs from another's by up to 1.5x: measure it
# (``segc calibrate --fit none``) where the ranking matters. The rates are what ``segc
# calibrate`` measured on an H200 (machine Q: 450 TFLOP/s for a bf16 4096^2 product, 1.9
# TB/s for a compiled ``x + 1`` over 128 MB), as the calibrations' fitted scales say too
# (decode 2.4-2.6x, prefill 1.4-1.6x the datasheet's 790 TFLOP/s and 4.8 TB/s); with the
# datasheet's, ``optimal``'s plans were ones the calibrated model predicts 9-20% slower.
# MLX's CUDA build commits a command buffer past 100 kernels on an H100/H200
# (``get_graph_limits`` in mlx/backend/cuda/device.cpp) and keeps every kernel's inputs
# until its buffer completes: the memory prediction's ``buffer_kernels``.
H200 = MachineModel(
    "h200",
    450e12,
    1.9e12,
    4e-6,
    25e-6,
    17e-6,
    "default",
    0.0,
    2e-6,
    "gpu",
    fused_products=True,
    elementwise_host=0.15,
    buffer_kernels=100,
)


def default_model() -> MachineModel:
    """``H200`` when MLX's default device is a GPU, else ``CPU``."""
    import mlx.core as mx

    return H200 if mx.default_device() == mx.gpu else CPU


def with_source(m: MachineModel, source: str) -> MachineModel:
    return replace(m, source=source)
