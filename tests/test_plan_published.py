"""benchmarks/plan_published.py as a test (pure arithmetic, ~3 s): every published Megatron layout
(Narayanan et al. 2021 Table 2 PTD-P, Korthikanti et al. 2022 Table 5) fits under the megatron
engine, and the planner's pick for the same job is predicted no slower than it."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "plan_published.py"


def _bench():
    spec = importlib.util.spec_from_file_location("plan_published", PATH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench


BENCH = _bench()


@pytest.mark.parametrize("row", BENCH.ROWS, ids=lambda r: f"{r[0]} {r[1]} {r[2]} {r[6]}".replace(" ", "-"))
def test_published_layout_fits_and_the_pick_is_no_slower(row):
    r = BENCH.check_row(*row)
    assert r["fits"], f"{r['row']}: the published layout needs {r['published_bytes'] / 2**30:.1f} GiB"
    assert r["pick"] is not None
    assert r["pick_seconds"] <= r["published_seconds"] * (1 + 1e-9), (r["row"], r["pick"].why)
    layout = r["pick"].layout
    assert layout.world_size == row[2] and layout.global_batch == row[3]
