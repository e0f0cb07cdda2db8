"""`plan`, `estimate` and `explain` read whole at 80 and 200 columns, and plain in a pipe.

Golden files (tests/data/explain/width/<case>-<columns>.txt) hold the output as printed; the
comparison is of the sections (the first line of each paragraph) and of each table's header
line (side by side, turned or stacked), with numbers masked, because the estimator's figures and
the planner's why lines move as they improve. After an intended change of the
output, regenerate them with:

    DSTK_REGENERATE=1 .venv/bin/python -m pytest -q tests/test_cli_width.py

and read the diff. Whatever the figures, every line fits the width, no number is cut ("14.…")
and no terminal escape reaches a pipe.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dstk.cli import main

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "explain" / "width"
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")
BIG = ["--model", "llama-3-8b", "--gpus", "8"]

CASES = {
    "plan-tiny": ["plan", TINY, "--top", "3"],
    "plan-8b": ["plan", *BIG, "--top", "5"],
    "estimate-8b-offload": ["estimate", *BIG, "--zero", "3", "--offload-optimizer", "cpu", "--tokens", "1e9"],
    "estimate-8b-pipeline": ["estimate", *BIG, "--zero", "1", "--pp", "2"],
    "explain-tiny-pipeline": ["explain", TINY, "--pp", "2"],
    "explain-8b-offload": ["explain", *BIG, "--zero", "3", "--offload-optimizer", "cpu"],
}
WIDTHS = (80, 200)
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


def run(argv: list[str], columns: int, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out


def skeleton(text: str) -> tuple[list[str], list[str]]:
    """(the first line of each paragraph, the header line above each table rule), numbers
    masked and blanks folded: which sections there are and how each table is laid out (side by
    side, turned or stacked), not the figures, the why lines or where prose wraps, which other
    parts of dstk change as the estimator and planner improve."""
    lines = [re.sub(r"\s+", " ", NUMBER.sub("N", line)).strip() for line in text.splitlines()]
    starts = [line for i, line in enumerate(lines) if line and (i == 0 or not lines[i - 1])]
    headers = [lines[i - 1] for i, line in enumerate(lines) if i and re.fullmatch(r"-{5,}", line)]
    return starts, headers


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_output_at_width(case, columns, capsys, monkeypatch):
    text = run(CASES[case], columns, capsys, monkeypatch)
    lines = text.splitlines()
    too_long = [line for line in lines if len(line) > columns]
    assert not too_long, f"{len(too_long)} lines over {columns} columns, e.g. {too_long[0]!r}"
    assert "\x1b[" not in text, "a terminal escape in a pipe"
    assert "…" not in text, "a cut cell"
    assert all(line == line.rstrip() for line in lines), "trailing blanks"
    split = [(a, b) for a, b in zip(lines, lines[1:])
             if re.search(r"\d$", a) and re.match(r"\s*(?:[KMG]iB|s/step|s\b|[TG]FLOP/s|tokens/s)", b)]
    assert not split, f"a number apart from its unit: {split[0]}"
    golden = GOLDEN / f"{case}-{columns}.txt"
    if os.environ.get("DSTK_REGENERATE"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden.name}: run with DSTK_REGENERATE=1"
    assert skeleton(text) == skeleton(golden.read_text())


def test_every_golden_file_is_a_case():
    """A stray or renamed golden file would otherwise go unchecked."""
    expected = {f"{case}-{w}.txt" for case in CASES for w in WIDTHS}
    assert {p.name for p in GOLDEN.glob("*.txt")} == expected


@pytest.mark.parametrize("columns", WIDTHS)
def test_explain_shows_every_figure_whole(columns, capsys, monkeypatch):
    """Each memory figure of the JSON report, as the table formats it, is in the text in one piece."""
    argv = CASES["explain-8b-offload"]
    rep = json.loads(run([*argv, "--format", "json"], columns, capsys, monkeypatch))
    text = run(argv, columns, capsys, monkeypatch)
    stage = rep["memory"]["per_stage"][0]
    figures = [f"{stage[k] / 2**30:.2f}" for k in ("params_bytes", "activations_bytes", "total_bytes")]
    assert len(figures) == 3
    for figure in figures:
        assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d.])", text), figure
    assert "MFU" in text and "TFLOP/s" in text
    assert "Offloaded per rank: CPU" in text  # the optimizer offload is in the report, not only in `generate`
    assert "opt->cpu" in text.splitlines()[0]


def test_plan_table_at_80_columns_is_side_by_side_and_wraps_only_the_layout(capsys, monkeypatch):
    text = run(CASES["plan-8b"], 80, capsys, monkeypatch)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#"))
    assert header.split() == ["#", "layout", "GiB/GPU", "s/step", "tok/s", "MFU"]


def test_explain_memory_table_turns_when_the_stages_do_not_fit(capsys, monkeypatch):
    """At 80 columns the memory terms become rows and the stages columns; at 200 they sit side by side."""
    narrow = run(CASES["explain-tiny-pipeline"], 80, capsys, monkeypatch)
    wide = run(CASES["explain-tiny-pipeline"], 200, capsys, monkeypatch)
    assert re.search(r"^\s+stage 0\s+stage 1$", narrow, re.M)
    assert re.search(r"^activations\s+\S+\s+\S+$", narrow, re.M)
    assert re.search(r"^stage\s+layers\s+params\s+grads\s+optimizer\s+activations", wide, re.M)
