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
                   "bubble 37.5%", "stage 3:", "Why", "fastest", "50.0%", "of usable", "note"):
        assert needle in text, needle


def test_pictures_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    written = explain.write_pictures(_report(), tmp_path)
    assert sorted(p.name for p in written) == ["memory.png", "memory.svg", "schedule.png", "schedule.svg"]
    for p in written:
        assert p.stat().st_size > 1000
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "schedule.svg").read_text()[:2000]


def test_flops_and_percent_keep_their_digits():
    """The CPU demo runs at ~1 GFLOP/s: `tflops per gpu 0.0` next to `mfu 0.5%` read as a slip."""
    from dstk.tables import flops_text, percent_text

    assert flops_text(0.001437) == "1.44 GFLOP/s"
    assert flops_text(412.3) == "412 TFLOP/s"
    assert flops_text(0.0) == "0 FLOP/s"
    assert percent_text(0.004789) == "0.48%" and percent_text(0.492) == "49.2%"


def _picture_report(*, pp: int, total_bytes: int, cpu_bytes: int = 0):
    plan = {**PLAN, "layout": {**PLAN["layout"], "pp": pp},
            "memory": {"per_stage": [{"params_bytes": total_bytes // 4, "overhead_bytes": total_bytes // 2,
                                      "activations_bytes": total_bytes // 4, "total_bytes": total_bytes}] * pp,
                       "cpu_bytes": cpu_bytes}}
    return explain.report(plan, usable_bytes=PLAN["cluster"]["usable_bytes"],
                          capacity_bytes=PLAN["cluster"]["gpu_memory_bytes"])


def test_memory_picture_legend_outside_the_bars_unit_and_title():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = explain.memory_figure(_picture_report(pp=1, total_bytes=600 * 2**20, cpu_bytes=300 * 2**20))
    fig.canvas.draw()
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # outside
    assert ax.get_title() == "Memory per GPU"  # no "by pipeline stage" without a pipeline
    assert ax.get_ylabel() == "MiB per GPU"  # the demo's sizes, not 0.5 GiB of overhead
    assert [t.get_text() for t in ax.get_xticklabels()] == ["GPU", "CPU\n(per rank)"]
    heights = sorted(round(p.get_height()) for p in ax.patches)
    assert 300 in heights  # the CPU offload bar, in MiB
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "offloaded to CPU" in labels and "params 150 MiB" in labels
    plt.close(fig)
    fig = explain.memory_figure(_picture_report(pp=2, total_bytes=40 * 2**30))
    assert fig.axes[0].get_title() == "Memory per GPU by pipeline stage"
    assert fig.axes[0].get_ylabel() == "GiB per GPU"
    plt.close(fig)


@pytest.mark.parametrize("width", [40, 60, 70, 160])
def test_text_report_fits_any_width_with_whole_numbers(width):
    """Side by side from 70 columns, stacked below (four stages do not fit turned either; the
    turned table is in tests/test_cli_width.py): never a cut number."""
    from rich.console import Console

    buf = io.StringIO()
    explain.render_text(_report(), console=Console(file=buf, width=width))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    for total in ("4.00", "3.00", "2.00", "2.50"):
        assert f" {total}" in text or text.startswith(total), total
    memory = text.split("Memory per GPU by stage (GiB)\n", 1)[1].split("\n\n", 1)[0]
    shape = ("stacked" if memory.startswith("stage 0") else "turned" if "stage 0" in memory.splitlines()[0]
             else "side by side")
    assert shape == {40: "stacked", 60: "stacked", 70: "side by side", 160: "side by side"}[width]
