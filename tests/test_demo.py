"""The README's main job: `dstk demo`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_demo_intent_is_the_shipped_example():
    shipped = ROOT / "templates" / "intents" / "tiny-llama-cpu.yaml"
    example = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
    assert shipped.read_text() == example.read_text(), "keep templates/intents and examples/intents in step"


def test_demo_without_finetune_writes_a_valid_run(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--output", str(out), "--skip-finetune", "--steps", "7"]) == 0
    plan = json.loads((out / "run" / "plan.json").read_text())
    assert plan["layout"]["dp"] * plan["layout"]["tp"] * plan["layout"]["pp"] == 2
    ds = json.loads((out / "run" / "ds_config.json").read_text())
    assert ds["scheduler"]["params"]["total_num_steps"] == 7
    assert "0 errors" in capsys.readouterr().out
    # a second demo replaces its own directory
    assert main(["demo", "--output", str(out), "--skip-finetune"]) == 0


def test_demo_refuses_a_directory_it_did_not_make(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    assert main(["demo", "--output", str(tmp_path), "--skip-finetune"]) == 2
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    assert "was not made by `dstk demo`" in capsys.readouterr().err


@pytest.mark.distributed
def test_demo_end_to_end_on_two_cpu_ranks(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "dstk", "demo", "--output", str(out), "--steps", "30"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((out / "finetune" / "summary.json").read_text())
    assert summary["last_loss"] < summary["first_loss"]
    assert "demo: loss" in proc.stdout
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "finetune" / "model")
    assert model.config.num_hidden_layers == 2
