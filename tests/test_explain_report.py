"""explain's report rendering: tables in the terminal, pictures with matplotlib (optional)."""

from __future__ import annotations

import io

import pytest

from dstk import explain

PLAN = {
    "model": {"num_layers": 30},
    "cluster": {"usable_bytes": 8 * 2**30, "gpu_memory_bytes": 9 * 2**30},
    "layout": {"dp": 2, "tp": 1, "pp": 4, "zero_stage": 1, "micro_batch": 1, "grad_accum": 8, "recompute": "none",
               "offload_optimizer": "none", "offload_params": "none"},
    "memory": {"per_stage": [{"params_bytes": 2**30, "activations_bytes": 3 * 2**30, "total_bytes": 4 * 2**30},
                             {"params_bytes": 2**30, "activations_bytes": 2 * 2**30, "total_bytes": 3 * 2**30},
                             {"params_bytes": 2**30, "activations_bytes": 2**30, "total_bytes": 2 * 2**30},
                             {"params_bytes": 2 * 2**30, "activations_bytes": 2**29, "total_bytes": 5 * 2**29}]},
    "time": {"step_seconds": 2.0, "compute_seconds": 1.5, "comm_seconds": 0.3, "mfu": 0.41},
    "why": ["dp=2 pp=4 ZeRO-1 micro 1 x 8: fastest"],
}


def _report():
    return explain.report(PLAN, usable_bytes=PLAN["cluster"]["usable_bytes"],
                          capacity_bytes=PLAN["cluster"]["gpu_memory_bytes"])


def test_report_uses_the_per_stage_memory():
    rep = _report()
    assert [s["total_bytes"] for s in rep["memory"]["per_stage"]] == [4 * 2**30, 3 * 2**30, 2 * 2**30, 5 * 2**29]
    assert rep["balance"]["max_over_mean_memory"] == pytest.approx(4 / 2.875)
    assert rep["schedule"]["bubble_fraction"] == pytest.approx(3 / 8)


def test_text_report_has_the_tables():
    from rich.console import Console

    buf = io.StringIO()
    explain.render_text(_report(), console=Console(file=buf, width=160), pictures_note="note")
    text = buf.getvalue()
    for needle in ("Memory per GPU by stage", "Time per step", "1F1B schedule: 4 stages x 8 micro-batches",
                   "bubble 37.5%", "stage 3:", "Why", "fastest", "50%", "of usable", "note"):
        assert needle in text, needle


def test_pictures_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    written = explain.write_pictures(_report(), tmp_path)
    assert sorted(p.name for p in written) == ["memory.png", "memory.svg", "schedule.png", "schedule.svg"]
    for p in written:
        assert p.stat().st_size > 1000
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "schedule.svg").read_text()[:2000]
