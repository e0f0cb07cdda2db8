from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstk import explain
from dstk.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")


def test_explain_a_run_directory_and_an_intent(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["generate", TINY, "--pp", "2", "--output", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["layout"]["pp"] == 2
    assert rep["schedule"]["bubble_fraction"] == pytest.approx(1 / rep["layout"]["grad_accum"])
    assert len(rep["memory"]["per_stage"]) == 2 and rep["balance"]["layers_per_stage"] == [1, 1]
    assert rep["alternatives"] and rep["why"]
    assert main(["explain", str(out / "plan.json")]) == 0
    text = capsys.readouterr().out
    assert "1F1B schedule" in text and "Alternatives it beat" in text
    assert main(["explain", TINY, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"]["pp"] == 1


def test_without_matplotlib_it_says_how_to_get_pictures(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(explain, "have_matplotlib", lambda: False)
    assert main(["explain", TINY, "--pictures", str(tmp_path / "pics")]) == 0
    assert "pip install 'dstk[explain]'" in capsys.readouterr().out
    assert not (tmp_path / "pics").exists()


def test_pictures_with_matplotlib(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["explain", TINY, "--pp", "2", "--pictures", str(tmp_path / "pics"), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted(Path(p).name for p in rep["pictures"]) == ["memory.png", "memory.svg", "schedule.png",
                                                             "schedule.svg"]


def test_bad_inputs(tmp_path, capsys):
    assert main(["explain", str(tmp_path)]) == 2
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    assert main(["explain", str(bad)]) == 1
    bad.write_text("[]")
    assert main(["explain", str(bad)]) == 1
    assert "fix:" in capsys.readouterr().err
