"""``dstk doctor --calibrate`` on this machine, then the tiny Llama planned with the profile and
fine-tuned on the same 2 CPU ranks: predicted tokens/s (built-in catalog and calibrated) next to
the measured.

    .venv/bin/python benchmarks/calibrate_tiny.py [--quick] [--steps 60] [--keep DIR]

Runs the commands a user types (``python -m dstk ...``) in a temporary directory: the
calibration (its wall time and report), ``plan`` with and without ``--hardware``, ``generate``
with it, ``finetune`` of that plan. Goal (issue 11): the calibrated prediction of the same order
as the measurement (within 10x; ``tests/test_doctor_calibrate.py`` checks it).
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
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"


def dstk(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dstk", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"dstk {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="doctor --calibrate --quick")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (new) and keep it")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dstk-calibrate-"))
    work.mkdir(parents=True, exist_ok=True)
    hw = work / "hardware.yaml"
    load = os.getloadavg()[0]
    proc, seconds = dstk("doctor", "--calibrate", "--output", str(hw), *(["--quick"] if args.quick else []))
    print(f"$ dstk doctor --calibrate{' --quick' if args.quick else ''}   ({seconds:.1f} s wall, load average "
          f"{load:.1f} before)")
    print(proc.stdout.rstrip())
    plans = {}
    for label, extra in (("built-in catalog", ()), ("calibrated", ("--hardware", str(hw)))):
        out, _ = dstk("plan", str(TINY), *extra, "--format", "json")
        plans[label] = json.loads(out.stdout)["plans"][0]
    run_dir, ft = work / "run", work / "ft"
    dstk("generate", str(TINY), "--hardware", str(hw), "--output", str(run_dir))
    predicted = json.loads((run_dir / "plan.json").read_text())["time"]["tokens_per_second"]
    dstk("finetune", "--plan", str(run_dir), "--data", str(CORPUS), "--output", str(ft), "--steps", str(args.steps))
    summary = json.loads((ft / "summary.json").read_text())
    measured = summary["tokens"] / summary["seconds"]
    print(f"\ntiny Llama, 2 CPU ranks ({TINY.relative_to(ROOT)}):")
    for label, plan in plans.items():
        lay = plan["layout"]
        what = (f"dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} ZeRO-{lay['zero_stage']} "
                f"offload {lay['offload_optimizer']} micro {lay['micro_batch']} x {lay['grad_accum']}")
        print(f"  plan with the {label:<16} ({what}): {plan['time']['tokens_per_second']:>10,.0f} tokens/s predicted")
    print(f"  fine-tune of the calibrated plan, {args.steps} steps: {measured:>10,.0f} tokens/s measured "
          f"(calibrated prediction {predicted:,.0f}: {predicted / measured:.1f}x)")
    if not args.keep:
        print(f"(work directory {work})")


if __name__ == "__main__":
    main()
