"""Percentages in why lines and ``explain``: small values keep significant digits (``dstk.tables.percent_text``),
so the tiny CPU run reads "MFU 0.48%", never "MFU 0%"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dstk.cli import main

TINY = str(Path(__file__).resolve().parent.parent / "examples" / "intents" / "tiny-llama-cpu.yaml")


@pytest.mark.parametrize("argv", [["plan", TINY, "--pp", "2", "--top", "1"], ["explain", TINY, "--pp", "2"]])
def test_a_small_mfu_is_never_zero_percent(argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(argv) == 0
    out = capsys.readouterr().out
    figures = re.findall(r"MFU (\d+(?:\.\d+)?)%", out)
    assert figures, out
    assert all(float(f) > 0 for f in figures), out  # under 1%: two significant digits (0.48%), not 0%
    assert any(re.fullmatch(r"0\.\d\d", f) for f in figures), figures


def test_percent_text_rule():
    from dstk.tables import percent_text

    assert percent_text(0.00482) == "0.48%" and percent_text(0.492) == "49.2%" and percent_text(0.0) == "0.0%"
