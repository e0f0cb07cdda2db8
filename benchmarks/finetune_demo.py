"""Wall time of the README's main job on this machine: plan a tiny Llama for 2 CPU ranks, generate,
validate, fine-tune on the bundled corpus (real DeepSpeed, deepspeed runner), export.

    .venv/bin/python benchmarks/finetune_demo.py [--steps 80] [--keep DIR]

Runs the same commands a user types (``python -m dstk.cli ...``) in a temporary directory and prints
the time of each, the loss at the first and the last step, the eval loss and where the exported
model is. Goal (issue 7): at most 120 s after set-up on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (new) and keep it")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dstk-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    dstk = [sys.executable, "-m", "dstk.cli"]
    steps = [
        ("generate", [*dstk, "generate", str(ROOT / "examples/intents/tiny-llama-cpu.yaml"), "--output", "runs/tiny"]),
        ("validate", [*dstk, "validate", "runs/tiny/ds_config.json"]),
        ("finetune", [*dstk, "finetune", "--plan", "runs/tiny", "--data",
                      str(ROOT / "templates/corpus/harbour-notes.txt"), "--output", "runs/tiny-ft",
                      "--steps", str(args.steps), "--log-every", "10", "--format", "json"]),
    ]
    total = 0.0
    summary = None
    for name, cmd in steps:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env={**os.environ})
        dt = time.perf_counter() - t0
        total += dt
        if proc.returncode != 0:
            sys.exit(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        if name == "finetune":
            summary = json.loads(proc.stdout)
        print(f"{name:9s} {dt:6.1f} s")
    print(f"{'total':9s} {total:6.1f} s   (goal: <= 120 s)")
    print(f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f} over {summary['steps']} steps; "
          f"eval loss {summary['eval_loss']:.4f}, perplexity {summary['eval_perplexity']:.1f}; "
          f"training {summary['seconds']:.1f} s ({summary['tokens'] / summary['seconds']:,.0f} tok/s)")
    print(f"exported model: {summary['export_dir']}")


if __name__ == "__main__":
    main()
