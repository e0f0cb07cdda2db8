"""FlashAttention where it cannot run is refused before a job starts, with the fix (``plan.check_attention``):
FlashAttention-2 needs NVIDIA Ampere/Ada/Hopper or AMD MI200/MI300, fp16 or bf16, and a GPU."""

from __future__ import annotations

import pathlib

import pytest

from dstk.cli import main

TINY = str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "intents" / "tiny-llama-cpu.yaml")
EIGHT_B = ["--model", "llama-3-8b", "--gpus", "8", "--seq-len", "2048", "--global-batch", "64"]


@pytest.mark.parametrize("argv, says, fix", [
    (["plan", *EIGHT_B, "--gpu", "v100-32gb", "--attention", "flash"], "flash on NVIDIA V100", "--attention sdpa"),
    (["estimate", *EIGHT_B, "--gpu", "v100-32gb", "--attention", "flash"], "flash on NVIDIA V100", "--attention sdpa"),
    (["plan", *EIGHT_B, "--gpu", "a100-80gb", "--attention", "flash", "--precision", "fp32"],
     "FlashAttention-2 takes fp16 and bf16 only", "--precision bf16"),
    (["generate", TINY, "--attention", "flash", "--output", "{tmp}/run"], "flash on CPU ranks", "--attention sdpa"),
], ids=["plan-v100", "estimate-v100", "plan-fp32", "generate-cpu"])
def test_flash_where_it_cannot_run_is_refused(argv, says, fix, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert says in err and "fix:" in err and fix in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing half-written


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm", "mi250x"])
def test_flash_runs_where_flashattention_2_does(gpu, capsys):
    assert main(["plan", *EIGHT_B, "--gpu", gpu, "--attention", "flash", "--format", "json"]) == 0
