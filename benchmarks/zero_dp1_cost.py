"""ZeRO over one data-parallel rank on CPU ranks: the tiny Llama
(``examples/intents/tiny-llama-cpu.yaml``) on 2 gloo ranks as ``tp=2 dp=1`` with ZeRO 0/1/2/3 and as
``dp=2`` with ZeRO 0/3, each with the config ``dstk generate`` writes, measured next to
``dstk estimate --config``'s prediction.

    .venv/bin/python benchmarks/zero_dp1_cost.py [--steps 5] [--repeats 10] [--launches 2]

With dp=1, ZeRO has one partition: it shards nothing, yet DeepSpeed still runs its hooks, its
flat-buffer copies and (ZeRO-3) its gather/release bookkeeping. This prints what that costs next to
ZeRO-0 on the same layout, so the planner's rule for ZeRO at dp=1 rests on numbers.

The ranks and timing are ``benchmarks/zero_cpu_cost.py``'s worker (configs take turns, per batch the
slowest rank's time). AutoTP sets DeepSpeed's process-wide tensor-parallel mesh, so tp=2 and dp=2
configs run in separate launches, alternated ``--launches`` times; the best and the median are over
every round of every launch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
WORKER = ROOT / "benchmarks" / "zero_cpu_cost.py"
TAG = "ZERO_CPU_COST "
LAYOUTS = (("tp=2 dp=1", 2, 1, (0, 1, 2, 3)), ("dp=2", 1, 2, (0, 3)))


def _dstk(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "dstk", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"dstk {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--launches", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dstk-zero-dp1-"))
    groups: dict[str, list[dict]] = {}
    rows = []
    for label, tp, dp, stages in LAYOUTS:
        for zero in stages:
            out = work / f"tp{tp}-z{zero}"
            _dstk("generate", str(TINY), "--zero", str(zero), "--tp", str(tp), "--dp", str(dp), "--output", str(out))
            plan = json.loads((out / "plan.json").read_text())
            cfg = json.loads((out / "ds_config.json").read_text())
            cfg.pop("scheduler", None)
            cfg["steps_per_print"] = 2**30
            path = work / f"tp{tp}-z{zero}.json"
            path.write_text(json.dumps(cfg, indent=1))
            est = json.loads(_dstk("estimate", "--intent", str(TINY), "--config", str(path), "--format", "json"))
            time_ = est.get("time") or est.get("plan", {}).get("time")
            name = f"{label} ZeRO-{zero}"
            groups.setdefault(label, []).append({"name": name, "group": label, "config": cfg,
                                                 "hf_config": plan["model"]["hf_config"],
                                                 "seq_len": plan["training"]["seq_len"]})
            rows.append({"name": name, "predicted": time_["step_seconds"]})
    sys.path.insert(0, str(ROOT / "tests"))
    from dist import run_ranks

    from dstk.launch.shm import leaked_buffers, remove_leaked

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    times: dict[str, list[float]] = {}
    calls: dict[str, dict] = {}
    for _ in range(args.launches):
        for label, specs in groups.items():
            spec_path = work / f"specs-{label.replace(' ', '_').replace('=', '')}.json"
            spec_path.write_text(json.dumps(specs))
            results = run_ranks(WORKER, "--worker", str(spec_path), "--steps", str(args.steps), "--repeats",
                                str(args.repeats), env={"PYTHONPATH": str(ROOT)}, timeout=900)
            remove_leaked(leaked_buffers())  # DeepSpeed's CPU shm all-reduce never unlinks its 66 MiB per rank
            for line in results[0].output.splitlines():
                if line.startswith(TAG):
                    r = json.loads(line[len(TAG):])
                    times.setdefault(r["name"], []).extend(r["times"])
                    calls[r["name"]] = r["collectives"]
    wall = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    print(f"2 gloo ranks, {args.steps} steps x {args.repeats} batches x {args.launches} launches per config, "
          f"{wall:.0f} s wall, load average {load:.1f} before")
    print(f"{'config':<18} {'median':>8} {'best':>8} {'predicted':>9}  collectives per step")
    for row in rows:
        t = times[row["name"]]
        print(f"{row['name']:<18} {statistics.median(t) * 1e3:6.1f}ms {min(t) * 1e3:6.1f}ms "
              f"{row['predicted'] * 1e3:7.1f}ms  "
              + ", ".join(f"{k} {v:g}" for k, v in calls[row["name"]].items()))


if __name__ == "__main__":
    main()
