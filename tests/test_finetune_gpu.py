"""dstk finetune on one CUDA GPU: a ~1B Llama (llama-3.2-1b dimensions, random weights) in bf16 on
the planner's layout. Prints tokens/s and peak memory next to the plan's prediction; checks that
the run trains and that the prediction is within a factor of 2 (the estimate's stated accuracy is
far tighter; the factor only catches a wrong unit or a wrong layout). Skipped without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_one_billion_llama_bf16_on_one_gpu(tmp_path):
    from dstk.cli import main

    run = tmp_path / "plan"
    assert main(["generate", "--model", "llama-3.2-1b", "--nodes", "1", "--gpus-per-node", "1", "--gpu", "h200",
                 "--seq-len", "1024", "--global-batch", "8", "--train-steps", "30", "--warmup-steps", "2",
                 "--output", str(run)]) == 0
    data = tmp_path / "corpus.txt"
    data.write_text(CORPUS.read_text() * 200)  # enough tokens for 30 steps of 8 x 1024
    out = tmp_path / "ft"
    proc = subprocess.run([sys.executable, "-m", "dstk.cli", "finetune", "--plan", str(run), "--data", str(data),
                           "--output", str(out), "--log-every", "5", "--format", "json"],
                          capture_output=True, text=True, timeout=880, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    plan = json.loads((run / "plan.json").read_text())
    tps, peak = summary["tokens"] / summary["seconds"], summary["peak_memory_bytes"]
    predicted_tps, predicted_bytes = plan["time"]["tokens_per_second"], plan["memory"]["per_gpu"]["total_bytes"]
    print(f"\nGPU fine-tune llama-3.2-1b bf16: {tps:,.0f} tok/s (plan {predicted_tps:,.0f}); "
          f"peak {peak / 2**30:.2f} GiB (plan {predicted_bytes / 2**30:.2f} GiB); "
          f"loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}")
    assert summary["last_loss"] < summary["first_loss"]
    assert 0.5 < peak / predicted_bytes < 2.0
