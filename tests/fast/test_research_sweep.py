"""Sweep specs, statistics and machine-model files of the research harness (issue 15),
against values written out by hand. No MLX runs here."""

from __future__ import annotations

import pytest

from segc import ScheduleError
from segc.passes.costmodel import CPU, MachineModel, pipeline_time
from segc.research.plots import pareto
from segc.research.sweep import expand, expand_all, ranks, spearman, spread


def test_expand_ranges() -> None:
    assert expand("balanced:2..5") == ["balanced:2", "balanced:3", "balanced:4", "balanced:5"]
    assert expand("balanced:2..18:8") == ["balanced:2", "balanced:10", "balanced:18"]
    assert expand("memory:0.5x..2x") == ["memory:0.5x", "memory:0.75x", "memory:1x", "memory:1.25x", "memory:1.5x",
                                         "memory:1.75x", "memory:2x"]  # fmt: skip
    assert expand("optimal:0.5x..1x:0.5x") == ["optimal:0.5x", "optimal:1x"]
    assert expand("memory:1MiB..4MiB") == ["memory:1048576", "memory:2097152", "memory:4194304"]
    assert expand("markers") == ["markers"] and expand("memory:64MiB") == ["memory:64MiB"]
    assert expand_all(["none", "balanced:1..2", "none", "balanced:2"]) == ["none", "balanced:1", "balanced:2"]


@pytest.mark.parametrize("bad", ["balanced:5..2", "balanced:2..5:0", "none:1..2", "memory:1x..2x:-1x", "balanced:a..b"])
def test_bad_ranges(bad: str) -> None:
    with pytest.raises(ScheduleError):
        expand(bad)


def test_statistics() -> None:
    assert ranks([10.0, 30.0, 20.0, 20.0]) == [1.0, 4.0, 2.5, 2.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks 1,2,3 against 1,3,2: d^2 sums to 2, so 1 - 6*2/(3*(9-1)) = 0.5
    assert spearman([1, 2, 3], [5, 9, 7]) == pytest.approx(0.5)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    s = spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["median"], s["p25"], s["p75"], s["min"], s["max"]) == (3.0, 2.0, 4.0, 1.0, 5.0)
    # (1, 5) and (2, 3) and (4, 1) are not beaten on both; (3, 4) is, by (2, 3)
    assert pareto([(3.0, 4.0), (1.0, 5.0), (4.0, 1.0), (2.0, 3.0)]) == [1, 3, 2]


def test_pipeline_time_by_hand() -> None:
    # host 1, 1, 1; device 5, 1, 1: the device starts at 1, ends 6, 7, 8
    assert pipeline_time([1, 1, 1], [5, 1, 1]) == 8
    # host-bound: host 4 each, device 1 each: each segment ends 1 after its dispatch
    assert pipeline_time([4, 4, 4], [1, 1, 1]) == 13
    # the device may start once the host is 1 into each segment's 4: it starts at 1 and
    # ends at 6; the second segment starts at max(6, 4 + 1) and ends at 11 (all at 4: 14)
    assert pipeline_time([4, 4], [5, 5], pre=[1, 1]) == 11 and pipeline_time([4, 4], [5, 5]) == 14
    # host-bound: the device cannot end a segment before the host has launched all of it
    assert pipeline_time([4, 4], [1, 1], pre=[1, 1]) == 8


def test_machine_model_json(tmp_path) -> None:
    p = tmp_path / "m.json"
    m = MachineModel("toy", 1e9, 2e9, 1e-6, 2e-6, 3e-7, "by hand")
    m.save(p)
    assert MachineModel.load(p) == m
    assert MachineModel.from_json(CPU.to_json()) == CPU
    with pytest.raises(ScheduleError, match="not a segc machine model"):
        MachineModel.from_json('{"name": "x"}')
    with pytest.raises(ScheduleError, match="unknown fields"):
        MachineModel.from_json('{"segc_machine": 1, "speed": 3}')
    with pytest.raises(ScheduleError, match="launch_s must be a positive number"):
        MachineModel.from_json('{"segc_machine": 1, "launch_s": -1}')
    # the host's saving on a repeated segment: 0 allowed (the built-in models'), below refused
    assert MachineModel.from_json('{"segc_machine": 1, "repeat_s": 0}').repeat_s == 0
    with pytest.raises(ScheduleError, match="repeat_s must be a positive number"):
        MachineModel.from_json('{"segc_machine": 1, "repeat_s": -1e-6}')
    assert MachineModel.from_json('{"segc_machine": 1, "repeat_op_s": 0}').repeat_op_s == 0
    with pytest.raises(ScheduleError, match="repeat_op_s must be a positive number"):
        MachineModel.from_json('{"segc_machine": 1, "repeat_op_s": -1e-9}')
    with pytest.raises(ScheduleError, match="cannot read machine model"):
        MachineModel.load(tmp_path / "missing.json")
