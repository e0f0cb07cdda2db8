"""`dstk plan` end to end, with the real estimator and catalogs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstk.cli import main
from dstk.layout import Layout

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")


def _json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else None), out.err


def test_plan_json_shape_and_rules(capsys):
    code, data, _ = _json(capsys, ["plan", TINY, "--format", "json", "--top", "50"])
    assert code == 0
    assert set(data) >= {"plans", "rejected", "num_considered", "num_fitting"}
    plans = data["plans"]
    assert 1 < len(plans) <= 50
    for p in plans:
        assert set(p) == {"layout", "memory", "time", "why"}
        layout = Layout.from_dict(p["layout"])
        assert layout.world_size == 2 and layout.global_batch == 8
        assert p["memory"]["per_gpu"]["total_bytes"] <= data["usable_bytes_per_gpu"]
        assert p["why"]
    fastest = min(p["time"]["step_seconds"] for p in plans)
    assert plans[0]["time"]["step_seconds"] <= fastest * 1.03  # the playbook stays within 3%
    rest = [p["time"]["step_seconds"] for p in plans[1:]]
    assert rest == sorted(rest)


def test_human_output_has_table_and_why(capsys):
    assert main(["plan", TINY]) == 0
    out = capsys.readouterr().out
    assert "layouts fit" in out and "why:" in out and "dp=2" in out


def test_flags_win_over_the_intent(capsys):
    code, data, _ = _json(capsys, ["plan", TINY, "--global-batch", "16", "--zero", "2", "--format", "json"])
    assert code == 0
    assert all(Layout.from_dict(p["layout"]).global_batch == 16 for p in data["plans"])
    assert {p["layout"]["zero_stage"] for p in data["plans"]} == {2}


def test_nothing_fits_exits_1_with_the_smallest_changes(capsys):
    argv = ["plan", "--model", "llama-2-70b", "--gpus", "8", "--gpu", "a10", "--seq-len", "4096",
            "--global-batch", "64", "--no-offload"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "nothing fits on 1 x 8 a10" in err and "GiB per GPU" in err
    assert "fix:" in err and "more GPUs" in err and "fits" in err
    code, data, _ = _json(capsys, argv + ["--format", "json"])
    assert code == 1 and data["plans"] == [] and data["suggestions"]


def test_an_inconsistent_intent_is_explained(capsys):
    code = main(["plan", TINY, "--global-batch", "3", "--dp", "2"])
    assert code == 1
    assert "does not divide" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["plan"], ["plan", "--gpus", "8"], ["plan", "/no/such/intent.yaml"]])
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "fix:" in capsys.readouterr().err


def test_a_custom_gpu_from_a_hardware_file(tmp_path, capsys):
    hw = tmp_path / "hw.yaml"
    hw.write_text("gpus:\n  small-gpu: {base: a10, memory_gib: 2}\n")
    argv = ["plan", "--model", "gpt2", "--gpus", "2", "--gpu", "small-gpu", "--seq-len", "1024",
            "--global-batch", "8", "--format", "json"]
    assert main(argv) == 1  # unknown GPU without the file
    capsys.readouterr()
    code, data, _ = _json(capsys, argv + ["--hardware", str(hw)])
    assert code == 0
    # the headroom is taken of what is left after the a10's fixed 1 GiB overhead, not of the overhead too
    assert data["usable_bytes_per_gpu"] == int(2**30 + (2 * 2**30 - 2**30) * 0.9)


def test_plan_generate_explain_paths_stay_light(tmp_path):
    """The fast commands must not pull in torch/deepspeed/transformers/datasets on their path."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom dstk.cli import main\n"
        f"assert main(['plan', {TINY!r}, '--format', 'json']) == 0\n"
        f"assert main(['generate', {TINY!r}, '--output', {str(tmp_path / 'run')!r}]) == 0\n"
        f"assert main(['explain', {str(tmp_path / 'run')!r}, '--format', 'json']) == 0\n"
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'datasets', 'matplotlib') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY=\n" in out.stderr, out.stderr[-500:]
