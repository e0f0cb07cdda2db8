"""Generated buckets with and without the per-call latency, in the same launch: the tiny Llama
(``examples/intents/tiny-llama-cpu.yaml``) on 2 gloo ranks, ZeRO 1/2/3 at dp=2, each as ``dstk
generate`` writes it now (``reduce_bucket_size`` from ``steptime.collective_latency``: one bucket)
and with the buckets of the former 5 us rule (4.6e4 elements, ZeRO-2 with ``overlap_comm``).

    .venv/bin/python benchmarks/buckets_latency_ab.py [--steps 5] [--repeats 12] [--launches 3]

The ranks and timing are ``benchmarks/zero_cpu_cost.py``'s worker: the configs take turns, so a
load that drifts hits both alike; per batch the slowest rank's time; best and median over every
round of every launch, and the collectives each step issued.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from zero_cpu_cost import dstk_cli, worker_records

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
OLD = {"reduce_bucket_size": 46_000, "allgather_bucket_size": 46_000}
"""What the 5 us rule wrote for the tiny intent at dp=2 (ZeRO-3 also: prefetch 46,000, live 55,000)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--launches", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dstk-bucket-ab-"))
    specs = []
    for zero in (1, 2, 3):
        out = work / f"z{zero}"
        dstk_cli("generate", str(TINY), "--zero", str(zero), "--dp", "2", "--output", str(out))
        cfg = json.loads((out / "ds_config.json").read_text())
        plan = json.loads((out / "plan.json").read_text())
        cfg.pop("scheduler", None)
        cfg["steps_per_print"] = 2**30
        old = copy.deepcopy(cfg)
        old["zero_optimization"].update(OLD, overlap_comm=zero >= 2)
        if zero == 3:
            old["zero_optimization"].update(stage3_prefetch_bucket_size=46_000, stage3_max_live_parameters=55_000,
                                            stage3_max_reuse_distance=55_000)
        for name, c in ((f"ZeRO-{zero} now", cfg), (f"ZeRO-{zero} 5 us rule", old)):
            specs.append({"name": name, "group": "ab", "config": c, "hf_config": plan["model"]["hf_config"],
                          "seq_len": plan["training"]["seq_len"]})
    spec_path = work / "specs.json"
    spec_path.write_text(json.dumps(specs))
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {}
    calls: dict[str, dict] = {}
    for _ in range(args.launches):
        for r in worker_records(spec_path, steps=args.steps, repeats=args.repeats):
            times.setdefault(r["name"], []).extend(r["times"])
            calls[r["name"]] = r["collectives"]
    shutil.rmtree(work, ignore_errors=True)
    print(f"2 gloo ranks, {args.steps} steps x {args.repeats} batches x {args.launches} launches per config, "
          f"load average {load:.1f} before")
    print(f"{'config':<20} {'bucket':>8} {'median':>8} {'best':>8}  collectives per step")
    for spec in specs:
        t = times[spec["name"]]
        print(f"{spec['name']:<20} {spec['config']['zero_optimization']['reduce_bucket_size']:>8} "
              f"{statistics.median(t) * 1e3:6.1f}ms {min(t) * 1e3:6.1f}ms  "
              + ", ".join(f"{k} {v:g}" for k, v in calls[spec["name"]].items()))


if __name__ == "__main__":
    main()
