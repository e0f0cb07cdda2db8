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
    log = (out / "logs" / "launch.log").read_text()
    assert "[INFO] [launch.py" in log and "[rank 0]" in log  # the whole launch is in the log ...
    assert "[INFO] [launch.py" not in proc.stdout + proc.stderr  # ... the launcher's lines not on the terminal
    assert "[rank 0] trained 30 steps" in proc.stdout
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "finetune" / "model")
    assert model.config.num_hidden_layers == 2


def test_launch_sink_keeps_the_launcher_lines_in_the_log(capsys):
    import io

    from dstk.commands.demo import launch_sink

    lines = [("stdout", "[2026-12-03 06:47:00,441] [INFO] [launch.py:170:main] dist_world_size=2\n"),
             ("stderr", "[2026-12-03 06:46:57,875] [WARNING] [runner.py:214:fetch_hostfile] Unable to find hostfile\n"),
             ("stdout", "[2026-12-03 06:47:00,441] [ERROR] [launch.py:321:sigkill_handler] exits with return code 1\n"),
             ("stdout", "[rank 0] [####################] 4/4 loss 6.2245\n"),
             ("stderr", "dstk: rank 1 on host exited with code 7\n")]
    for verbose in (False, True):
        log = io.StringIO()
        sink = launch_sink(log=log, verbose=verbose)
        for stream, line in lines:
            sink(stream, line)
        assert log.getvalue() == "".join(line for _, line in lines)
        shown = capsys.readouterr()
        assert ("[INFO] [launch.py" in shown.out) is verbose and ("fetch_hostfile" in shown.err) is verbose
        assert "[ERROR]" in shown.out and "[rank 0]" in shown.out and "dstk: rank 1" in shown.err


@pytest.mark.distributed
def test_demo_launch_path_logs_the_real_launcher(tmp_path, capsys):
    """The demo's sink on a real launch (the deepspeed runner, 2 CPU ranks of a script that only prints)."""
    from dstk.commands.demo import launch_sink
    from dstk.launch import run_launch, spec_from_run_dir
    from tests.test_launch import write_run_dir

    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    script = ROOT / "tests" / "data" / "launch" / "scripts" / "crash.py"
    spec = spec_from_run_dir(run_dir, script=str(script), script_args=["ok"], config_arg=None)
    with open(tmp_path / "launch.log", "w") as log:
        assert run_launch(spec, sink=launch_sink(log=log, verbose=False)) == 0
    log = (tmp_path / "launch.log").read_text()
    shown = capsys.readouterr()
    assert "[INFO] [launch.py" in log and "[INFO] [runner.py" in log and "[rank 1] started rank=1" in log
    assert "[INFO]" not in shown.out + shown.err
    assert "[rank 0] started rank=0" in shown.out and "[rank 1] started rank=1" in shown.out
