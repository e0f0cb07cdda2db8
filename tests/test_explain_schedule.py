from __future__ import annotations

import pytest

from dstk.explain import bubble_fraction, one_f_one_b, report


@pytest.mark.parametrize("p, m", [(1, 1), (2, 4), (4, 8), (4, 2), (8, 16), (3, 7), (5, 1)])
def test_1f1b_makespan_and_bubble_match_the_formula(p, m):
    slots = one_f_one_b(p, m)
    assert len(slots) == 2 * p * m
    assert max(s.end for s in slots) == (m + p - 1) * 3.0  # f = 1, b = 2
    assert bubble_fraction(slots, p) == pytest.approx((p - 1) / m)


def test_1f1b_respects_dependencies_and_memory_bound():
    p, m = 4, 8
    slots = {(s.kind, s.stage, s.micro): s for s in one_f_one_b(p, m)}
    for (kind, stage, micro), s in slots.items():
        if kind == "F" and stage > 0:
            assert s.start >= slots[("F", stage - 1, micro)].end
        if kind == "B" and stage < p - 1:
            assert s.start >= slots[("B", stage + 1, micro)].end
    # 1F1B keeps at most p - s micro-batches in flight on stage s (what bounds activation memory)
    for stage in range(p):
        events = sorted((s.start, s.kind) for (k, st, _), s in slots.items() if st == stage)
        live = peak = 0
        for _, kind in events:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(p - stage, m)


def test_1f1b_rejects_nonsense():
    with pytest.raises(ValueError):
        one_f_one_b(0, 4)


def test_report_of_a_pipeline_plan():
    plan = {
        "model": {"num_layers": 30},
        "layout": {"dp": 2, "tp": 1, "pp": 4, "zero_stage": 1, "micro_batch": 1, "grad_accum": 16,
                   "recompute": "none", "offload_optimizer": "none", "offload_params": "none"},
        "memory": {"per_gpu": {"params_bytes": 2**30, "total_bytes": 3 * 2**30}},
        "time": {"step_seconds": 2.0, "compute_seconds": 1.5, "comm_seconds": 0.3, "bubble_fraction": 0.19},
        "why": ["because"],
    }
    rep = report(plan, usable_bytes=4 * 2**30)
    assert rep["schedule"]["bubble_fraction"] == pytest.approx(3 / 16)
    assert rep["balance"]["layers_per_stage"] == [7, 8, 8, 7]
    assert rep["time"]["comm_over_compute"] == pytest.approx(0.2)
    assert len(rep["memory"]["per_stage"]) == 4
    flat = report(dict(plan, layout=dict(plan["layout"], pp=1, dp=8)))
    assert "schedule" not in flat


def test_interleaved_plans_report_the_smaller_bubble():
    plan = {"layout": {"dp": 1, "tp": 1, "pp": 4, "zero_stage": 0, "micro_batch": 1, "grad_accum": 8,
                       "virtual_stages": 2, "recompute": "none"},
            "memory": {"per_gpu": {"total_bytes": 1}}, "time": {}}
    sch = report(plan)["schedule"]
    assert sch["bubble_fraction"] == pytest.approx(3 / 8)
    assert sch["interleaved_bubble_fraction"] == pytest.approx(3 / 16)
